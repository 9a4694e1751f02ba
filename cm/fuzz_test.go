package cm_test

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/test/goldendir"
)

// Fuzz targets, one per decoder: nothing panics, every refusal is an
// *cm.Error, and whatever decodes re-encodes to bytes that decode to the
// same values and re-encode to the same bytes. Seeds are the golden MADs
// (whole MADs for FuzzMAD, their bodies for the message targets) plus a
// synthetic message of each kind, so the messages rxe never sent in the
// captures start from something valid too.

// syntheticMessages returns one plausible message of every kind.
func syntheticMessages() []cm.Message {
	req := &cm.REQFields{
		LocalCommID: 0x01020304, ServiceID: cm.ServiceID(cm.PSTCP, 7174), LocalQPN: 0x11,
		StartingPSN: 0x123456, PathMTU: cm.MTU4096, RetryCount: 7, RNRRetryCount: 7, MaxCMRetries: 15,
		PKey: 0xffff, RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20, ResponderResources: 1, InitiatorDepth: 1,
		Primary: cm.Path{LocalLID: cm.PermissiveLID, RemoteLID: cm.PermissiveLID, FlowLabel: 0x12345, HopLimit: 64, LocalACKTimeout: 19,
			LocalGID: cm.GIDFromAddr(netip.MustParseAddr("2001:db8::1")), RemoteGID: cm.GIDFromAddr(netip.MustParseAddr("2001:db8::2"))},
	}
	_ = cm.CMAHeader(req.PrivateData[:]).Encode(&cm.CMAHeaderFields{SrcPort: 40000,
		Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2")})
	sidrReq := &cm.SIDRREQFields{RequestID: 7, PKey: 0xffff, ServiceID: cm.ServiceID(cm.PSUDP, 7174)}
	_ = cm.CMAHeader(sidrReq.PrivateData[:]).Encode(&cm.CMAHeaderFields{SrcPort: 40000,
		Src: netip.MustParseAddr("192.0.2.3"), Dst: netip.MustParseAddr("192.0.2.2")})
	rej := &cm.REJFields{LocalCommID: 5, RemoteCommID: 6, MessageRejected: cm.KindREQ, Reason: cm.RejConsumer, RejectedInfoLength: 2}
	rej.ARI[0], rej.ARI[1] = 0xab, 0xcd
	return []cm.Message{
		req,
		&cm.MRAFields{LocalCommID: 1, RemoteCommID: 2, MessageMRAed: cm.KindREP, ServiceTimeout: 21},
		rej,
		&cm.REPFields{LocalCommID: 3, RemoteCommID: 4, LocalQPN: 0x12, StartingPSN: 0xabcdef, TargetACKDelay: 15, RNRRetryCount: 7, VendorID: 0x2c9},
		&cm.RTUFields{LocalCommID: 4, RemoteCommID: 3},
		&cm.DREQFields{LocalCommID: 4, RemoteCommID: 3, RemoteQPN: 0x12},
		&cm.DREPFields{LocalCommID: 3, RemoteCommID: 4},
		sidrReq,
		&cm.SIDRREPFields{RequestID: 7, Status: cm.SIDRSuccess, QPN: 0x33, QKey: 0x01234567, ServiceID: cm.ServiceID(cm.PSUDP, 7174)},
		&cm.LAPFields{LocalCommID: 1, RemoteCommID: 2, RemoteQPN: 9, RemoteCMResponseTimeout: 20,
			Alternate: cm.Path{LocalLID: 1, RemoteLID: 2, FlowLabel: 0xfffff, PacketRate: 3, TrafficClass: 0x10, HopLimit: 1, SL: 3, SubnetLocal: true, LocalACKTimeout: 14}},
		&cm.APRFields{LocalCommID: 2, RemoteCommID: 1, Status: cm.APRInvalidGID, AdditionalInfoLength: 16},
	}
}

// seedMADs returns the golden MADs (nil, reported loudly or failing under
// CI=true, when the captures are missing) and the synthetic ones.
func seedMADs(f *testing.F) [][]byte {
	var out [][]byte
	if dir, ok := goldendir.Seeds(f); ok {
		mads, _ := goldenMADs(f, dir)
		if len(mads) == 0 {
			goldendir.Missing(f, errors.New("no CM MADs in the golden captures"))
		}
		for _, g := range mads {
			out = append(out, g.mad)
		}
	}
	for i, m := range syntheticMessages() {
		b := make([]byte, cm.MADSize)
		h := cm.NewHeader(m.AttributeID(), uint64(i))
		if err := cm.Encode(b, &h, m); err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// isCMError fails t unless err is an *cm.Error with a known reason.
func isCMError(t *testing.T, err error) {
	t.Helper()
	var e *cm.Error
	if !errors.As(err, &e) || e.Msg == "" || e.Field == "" {
		t.Fatalf("error %v (%T) is not a *cm.Error naming message and field", err, err)
	}
	for _, r := range []error{cm.ErrTruncated, cm.ErrLength, cm.ErrUnsupported, cm.ErrReserved} {
		if errors.Is(err, r) {
			return
		}
	}
	t.Fatalf("error %v has no known reason", err)
}

func FuzzMAD(f *testing.F) {
	for _, m := range seedMADs(f) {
		f.Add(m)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) >= cm.HeaderSize {
			// The header view round-trips every byte but the reserved two.
			h := cm.MAD(data).Header()
			out := make([]byte, cm.HeaderSize)
			cm.MAD(out).EncodeHeader(&h)
			want := append([]byte(nil), data[:cm.HeaderSize]...)
			want[18], want[19] = 0, 0
			if !bytes.Equal(out, want) {
				t.Fatalf("header round trip\n got % x\nwant % x", out, want)
			}
		}
		h, m, err := cm.Decode(data)
		if err != nil {
			isCMError(t, err)
			if m != nil {
				t.Fatal("a message with an error")
			}
			return
		}
		out := make([]byte, cm.MADSize)
		if err := cm.Encode(out, &h, m); err != nil {
			t.Fatalf("Encode(Decode(x)): %v", err)
		}
		h2, m2, err := cm.Decode(out)
		if err != nil {
			t.Fatalf("Decode(Encode(Decode(x))): %v", err)
		}
		if h2 != h || !reflect.DeepEqual(m, m2) {
			t.Fatalf("Decode(Encode(Decode(x))) differs\n%+v %+v\n%+v %+v", h, m, h2, m2)
		}
		out2 := make([]byte, cm.MADSize)
		if err := cm.Encode(out2, &h2, m2); err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("Encode not stable: %v", err)
		}
	})
}

// fuzzMessage is the body of the message targets: attribute a's Decode on
// arbitrary bytes, and every view's round trip.
func fuzzMessage(f *testing.F, a cm.AttrID) {
	for _, m := range seedMADs(f) {
		if cm.MAD(m).AttributeID() == a {
			f.Add(append([]byte(nil), cm.MAD(m).Data()...))
		}
	}
	f.Add(make([]byte, cm.DataSize))
	f.Add(bytes.Repeat([]byte{0xff}, cm.DataSize))
	f.Fuzz(func(t *testing.T, body []byte) {
		roundTrip(t, body)
		m := cm.NewMessage(a)
		if err := m.Decode(body); err != nil {
			isCMError(t, err)
			return
		}
		mad := make([]byte, cm.MADSize)
		h := cm.NewHeader(a, 1)
		if err := cm.Encode(mad, &h, m); err != nil {
			t.Fatal(err)
		}
		m2 := cm.NewMessage(a)
		if err := m2.Decode(cm.MAD(mad).Data()); err != nil {
			t.Fatalf("Decode(Encode(Decode(x))): %v", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("Decode(Encode(Decode(x))) differs\n%+v\n%+v", m, m2)
		}
		mad2 := make([]byte, cm.MADSize)
		if err := cm.Encode(mad2, &h, m2); err != nil || !bytes.Equal(mad, mad2) {
			t.Fatalf("Encode not stable: %v", err)
		}
	})
}

func FuzzREQ(f *testing.F)     { fuzzMessage(f, cm.AttrREQ) }
func FuzzMRA(f *testing.F)     { fuzzMessage(f, cm.AttrMRA) }
func FuzzREJ(f *testing.F)     { fuzzMessage(f, cm.AttrREJ) }
func FuzzREP(f *testing.F)     { fuzzMessage(f, cm.AttrREP) }
func FuzzRTU(f *testing.F)     { fuzzMessage(f, cm.AttrRTU) }
func FuzzDREQ(f *testing.F)    { fuzzMessage(f, cm.AttrDREQ) }
func FuzzDREP(f *testing.F)    { fuzzMessage(f, cm.AttrDREP) }
func FuzzSIDRREQ(f *testing.F) { fuzzMessage(f, cm.AttrSIDRREQ) }
func FuzzSIDRREP(f *testing.F) { fuzzMessage(f, cm.AttrSIDRREP) }
func FuzzLAP(f *testing.F)     { fuzzMessage(f, cm.AttrLAP) }
func FuzzAPR(f *testing.F)     { fuzzMessage(f, cm.AttrAPR) }

func FuzzCMAHeader(f *testing.F) {
	for _, m := range seedMADs(f) {
		switch cm.MAD(m).AttributeID() {
		case cm.AttrREQ:
			f.Add(append([]byte(nil), cm.REQ(cm.MAD(m).Data()).PrivateData()...))
		case cm.AttrSIDRREQ:
			f.Add(append([]byte(nil), cm.SIDRREQ(cm.MAD(m).Data()).PrivateData()...))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := cm.ParseCMAHeader(data)
		if err != nil {
			isCMError(t, err)
			return
		}
		out := make([]byte, cm.CMAHeaderSize)
		if err := cm.CMAHeader(out).Encode(&h); err != nil {
			t.Fatalf("Encode(Parse(x)): %v (%+v)", err, h)
		}
		h2, err := cm.ParseCMAHeader(out)
		if err != nil || h2 != h {
			t.Fatalf("Parse(Encode(Parse(x))) = %+v, %v, want %+v", h2, err, h)
		}
		// Only the reserved nibble and an IPv4 header's padding may differ.
		want := append([]byte(nil), data[:cm.CMAHeaderSize]...)
		want[1] &= 0xf0
		if h.Src.Is4() {
			clear(want[4:16])
			clear(want[20:32])
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("Encode(Parse(x))\n got % x\nwant % x", out, want)
		}
	})
}

// TestSyntheticMessages: the synthetic seeds decode to what was encoded.
func TestSyntheticMessages(t *testing.T) {
	for _, m := range syntheticMessages() {
		b := make([]byte, cm.MADSize)
		h := cm.NewHeader(0, 77)
		if err := cm.Encode(b, &h, m); err != nil {
			t.Fatal(err)
		}
		h2, m2, err := cm.Decode(b)
		if err != nil || h2.AttributeID != m.AttributeID() || h2.TransactionID != 77 || !reflect.DeepEqual(m, m2) {
			t.Errorf("%v: Decode = %+v %+v %v", m.AttributeID(), h2, m2, err)
		}
	}
}
