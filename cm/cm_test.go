package cm_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
)

// newMAD returns a valid CM MAD of attribute a with a zero body.
func newMAD(a cm.AttrID) []byte {
	b := make([]byte, cm.MADSize)
	h := cm.NewHeader(a, 0x1122334455667788)
	cm.MAD(b).EncodeHeader(&h)
	return b
}

func TestHeaderEncode(t *testing.T) {
	b := bytes.Repeat([]byte{0xee}, cm.MADSize)
	h := cm.HeaderFields{
		BaseVersion: 1, MgmtClass: cm.ClassCM, ClassVersion: 2, Method: cm.MethodGetResp,
		Status: 0x1234, ClassSpecific: 0x5678, TransactionID: 0x0102030405060708,
		AttributeID: cm.AttrClassPortInfo, AttributeModifier: 0xa1b2c3d4,
	}
	cm.MAD(b).EncodeHeader(&h)
	want := []byte{1, 7, 2, 0x81, 0x12, 0x34, 0x56, 0x78, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 0, 0xa1, 0xb2, 0xc3, 0xd4}
	if !bytes.Equal(b[:cm.HeaderSize], want) {
		t.Errorf("header\n got % x\nwant % x", b[:cm.HeaderSize], want)
	}
	if bytes.Count(b[cm.HeaderSize:], []byte{0xee}) != cm.DataSize {
		t.Error("EncodeHeader touched the data")
	}
	if got := cm.MAD(b).Header(); got != h {
		t.Errorf("Header = %+v, want %+v", got, h)
	}
	if d := cm.MAD(b).Data(); len(d) != cm.DataSize || cap(d) != cm.DataSize || &d[0] != &b[cm.HeaderSize] {
		t.Errorf("Data: len %d cap %d", len(d), cap(d))
	}
	if n := cm.NewHeader(cm.AttrDREQ, 9); n.BaseVersion != 1 || n.MgmtClass != 7 || n.ClassVersion != 2 || n.Method != cm.MethodSend ||
		n.AttributeID != cm.AttrDREQ || n.TransactionID != 9 || n.Status != 0 || n.AttributeModifier != 0 {
		t.Errorf("NewHeader = %+v", n)
	}
}

func TestParseMAD(t *testing.T) {
	ok := newMAD(cm.AttrREQ)
	mod := func(off int, v byte) []byte {
		b := append([]byte(nil), ok...)
		b[off] = v
		return b
	}
	for _, c := range []struct {
		name  string
		b     []byte
		field string
		err   error
	}{
		{"nil", nil, "MAD length", cm.ErrTruncated},
		{"255 bytes", ok[:255], "MAD length", cm.ErrTruncated},
		{"257 bytes", append(append([]byte(nil), ok...), 0), "MAD length", cm.ErrLength},
		{"base version 2", mod(0, 2), "MAD base version", cm.ErrUnsupported},
		{"class SA", mod(1, 3), "MAD management class", cm.ErrUnsupported},
		{"class version 1", mod(2, 1), "MAD class version", cm.ErrUnsupported},
	} {
		_, err := cm.ParseMAD(c.b)
		if !errors.Is(err, c.err) || err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: ParseMAD = %v, want %v naming %q", c.name, err, c.err, c.field)
		}
		if _, _, err2 := cm.Decode(c.b); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%s: Decode = %v, want ParseMAD's %v", c.name, err2, err)
		}
	}
	if m, err := cm.ParseMAD(ok); err != nil || len(m) != cm.MADSize {
		t.Errorf("ParseMAD(valid) = %d bytes, %v", len(m), err)
	}
}

// TestDecodeErrors: every refusal names the message and the field and
// wraps the right reason; none panics.
func TestDecodeErrors(t *testing.T) {
	type mut struct {
		off int // in the MAD
		v   byte
	}
	b := func(a cm.AttrID, ms ...mut) []byte {
		x := newMAD(a)
		for _, m := range ms {
			x[m.off] = m.v
		}
		return x
	}
	const d = cm.HeaderSize
	mtu1024 := mut{d + 50, 0x30}
	for _, c := range []struct {
		name string
		mad  []byte
		want string // substring of the error
		err  error
	}{
		{"method Get", b(cm.AttrREQ, mut{3, 0x01}), "MAD method", cm.ErrUnsupported},
		{"method GetResp", b(cm.AttrRTU, mut{3, 0x81}), "MAD method", cm.ErrUnsupported},
		{"ClassPortInfo", b(cm.AttrClassPortInfo), "MAD attribute ID = 1", cm.ErrUnsupported},
		{"attribute 0x1b", b(cm.AttrID(0x1b), mut{17, 0x1b}), "MAD attribute ID = 27", cm.ErrUnsupported},
		{"attribute 0x0f", b(cm.AttrID(0x0f), mut{17, 0x0f}), "MAD attribute ID = 15", cm.ErrUnsupported},
		{"REQ MTU 0", b(cm.AttrREQ), "REQ path MTU = 0", cm.ErrReserved},
		{"REQ MTU 6", b(cm.AttrREQ, mut{d + 50, 0x60}), "REQ path MTU = 6", cm.ErrReserved},
		{"REQ MTU 15", b(cm.AttrREQ, mut{d + 50, 0xf7}), "REQ path MTU = 15", cm.ErrReserved},
		{"REQ extended transport 0", b(cm.AttrREQ, mtu1024, mut{d + 43, 0x06}), "REQ extended transport type = 0", cm.ErrReserved},
		{"REQ extended transport 2", b(cm.AttrREQ, mtu1024, mut{d + 43, 0x06}, mut{d + 51, 0x02}), "REQ extended transport type = 2", cm.ErrReserved},
		{"MRA kind 3", b(cm.AttrMRA, mut{d + 8, 0xc0}), "MRA message MRAed = 3", cm.ErrReserved},
		{"REJ kind 3", b(cm.AttrREJ, mut{d + 8, 0xc0}), "REJ message rejected = 3", cm.ErrReserved},
		{"REJ ARI length 73", b(cm.AttrREJ, mut{d + 9, 73 << 1}), "REJ rejected info length = 73", cm.ErrLength},
		{"REP failover 3", b(cm.AttrREP, mut{d + 26, 0x06}), "REP failover accepted = 3", cm.ErrReserved},
		{"SIDR_REP info length 73", b(cm.AttrSIDRREP, mut{d + 5, 73}), "SIDR_REP additional information length = 73", cm.ErrLength},
		{"APR info length 255", b(cm.AttrAPR, mut{d + 8, 255}), "APR additional information length = 255", cm.ErrLength},
	} {
		_, m, err := cm.Decode(c.mad)
		if err == nil || !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Decode = %v, want %v containing %q", c.name, err, c.err, c.want)
		}
		if m != nil {
			t.Errorf("%s: Decode returned a message with its error", c.name)
		}
		var e *cm.Error
		if !errors.As(err, &e) || e.Field == "" || e.Msg == "" {
			t.Errorf("%s: %v is not an *Error with message and field", c.name, err)
		}
	}
	// The limits themselves are fine.
	for _, c := range []struct {
		name string
		mad  []byte
	}{
		{"REQ MTU 256 RC", b(cm.AttrREQ, mut{d + 50, 0x10})},
		{"REQ MTU 4096 XRC", b(cm.AttrREQ, mut{d + 50, 0x50}, mut{d + 43, 0x06}, mut{d + 51, 0x01})},
		{"REQ RD", b(cm.AttrREQ, mtu1024, mut{d + 43, 0x04})},
		{"MRA LAP", b(cm.AttrMRA, mut{d + 8, 0x80})},
		{"REJ ARI length 72", b(cm.AttrREJ, mut{d + 8, 0x80}, mut{d + 9, 72 << 1})},
		{"REP failover rejected", b(cm.AttrREP, mut{d + 26, 0x04})},
		{"SIDR_REP info length 72", b(cm.AttrSIDRREP, mut{d + 5, 72})},
		{"APR info length 72", b(cm.AttrAPR, mut{d + 8, 72})},
		{"reserved bits set", b(cm.AttrREQ, mtu1024, mut{d + 4, 0xff}, mut{d + 24, 0xff}, mut{d + 95, 0x07}, mut{d + 139, 0x03}, mut{22, 0xff})},
	} {
		if _, _, err := cm.Decode(c.mad); err != nil {
			t.Errorf("%s: Decode = %v", c.name, err)
		}
	}
}

// allMessages returns a zero message of every type.
func allMessages() []cm.Message {
	var out []cm.Message
	for a := cm.AttrREQ; a <= cm.AttrAPR; a++ {
		out = append(out, cm.NewMessage(a))
	}
	return out
}

func TestMessageDecodeShort(t *testing.T) {
	for _, m := range allMessages() {
		for _, n := range []int{0, 1, cm.DataSize - 1} {
			err := m.Decode(make([]byte, n))
			if !errors.Is(err, cm.ErrTruncated) || !strings.Contains(err.Error(), m.AttributeID().String()+" length") {
				t.Errorf("%v: Decode(%d bytes) = %v", m.AttributeID(), n, err)
			}
		}
	}
	if cm.NewMessage(cm.AttrClassPortInfo) != nil || cm.NewMessage(0) != nil {
		t.Error("NewMessage of a non-message attribute is not nil")
	}
}

func TestEncodeErrors(t *testing.T) {
	h := cm.NewHeader(cm.AttrREP, 1)
	if err := cm.Encode(make([]byte, cm.MADSize), &h, &cm.REQFields{}); !errors.Is(err, cm.ErrMismatch) {
		t.Errorf("REQ under a REP header: %v", err)
	}
	if err := cm.Encode(make([]byte, cm.MADSize-1), &h, &cm.REPFields{}); !errors.Is(err, cm.ErrTruncated) {
		t.Errorf("short buffer: %v", err)
	}
	// A zero attribute ID takes the message's; a longer buffer gets
	// exactly MADSize bytes.
	h.AttributeID = 0
	b := bytes.Repeat([]byte{0xcc}, cm.MADSize+4)
	if err := cm.Encode(b, &h, &cm.DREPFields{LocalCommID: 5}); err != nil {
		t.Fatal(err)
	}
	if cm.MAD(b).AttributeID() != cm.AttrDREP || !bytes.Equal(b[cm.MADSize:], []byte{0xcc, 0xcc, 0xcc, 0xcc}) {
		t.Errorf("Encode: attribute %v, tail % x", cm.MAD(b).AttributeID(), b[cm.MADSize:])
	}
	if _, m, err := cm.Decode(b[:cm.MADSize]); err != nil || *m.(*cm.DREPFields) != (cm.DREPFields{LocalCommID: 5}) {
		t.Errorf("Decode = %+v, %v", m, err)
	}
}

// TestEncodeClearsReserved: Encode of a zero message over an all-ones body
// leaves every byte zero (reserved fields included).
func TestEncodeClearsReserved(t *testing.T) {
	for _, m := range allMessages() {
		b := bytes.Repeat([]byte{0xff}, cm.MADSize)
		h := cm.HeaderFields{}
		if err := cm.Encode(b, &h, m); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, cm.MADSize)
		cm.MAD(want).SetAttributeID(m.AttributeID())
		if !bytes.Equal(b, want) {
			t.Errorf("%v: Encode(zero) over 0xff\n got % x", m.AttributeID(), b)
		}
	}
}

// randomBody returns n random bytes from r.
func randomBody(r *rand.Rand) []byte {
	b := make([]byte, cm.DataSize)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestRoundTrip: for random bodies, Fields then Encode then Fields gives
// the same values, and Encode is idempotent — for every view; messages
// whose bodies pass Check also decode through Message.Decode.
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		roundTrip(t, randomBody(r))
	}
}

// roundTrip checks every view on body (shared with the fuzz targets).
func roundTrip(t *testing.T, body []byte) {
	t.Helper()
	if len(body) < cm.DataSize {
		return
	}
	body = body[:cm.DataSize]
	out := make([]byte, cm.DataSize)
	out2 := make([]byte, cm.DataSize)
	{
		f := cm.REQ(body).Fields()
		cm.REQ(out).Encode(&f)
		g := cm.REQ(out).Fields()
		cm.REQ(out2).Encode(&g)
		if f != g || !bytes.Equal(out, out2) {
			t.Fatalf("REQ round trip\n%+v\n%+v", f, g)
		}
	}
	{
		f := cm.REP(body).Fields()
		cm.REP(out).Encode(&f)
		g := cm.REP(out).Fields()
		cm.REP(out2).Encode(&g)
		if f != g || !bytes.Equal(out, out2) {
			t.Fatalf("REP round trip\n%+v\n%+v", f, g)
		}
	}
	{
		f := cm.MRA(body).Fields()
		cm.MRA(out).Encode(&f)
		g := cm.MRA(out).Fields()
		if f != g {
			t.Fatalf("MRA round trip\n%+v\n%+v", f, g)
		}
	}
	{
		f := cm.REJ(body).Fields()
		cm.REJ(out).Encode(&f)
		g := cm.REJ(out).Fields()
		if f != g {
			t.Fatalf("REJ round trip\n%+v\n%+v", f, g)
		}
	}
	{
		f := cm.RTU(body).Fields()
		cm.RTU(out).Encode(&f)
		if !bytes.Equal(out, body) {
			t.Fatal("RTU: no reserved bits, Encode(Fields(x)) must be x")
		}
	}
	{
		f := cm.DREQ(body).Fields()
		cm.DREQ(out).Encode(&f)
		g := cm.DREQ(out).Fields()
		if f != g {
			t.Fatalf("DREQ round trip\n%+v\n%+v", f, g)
		}
	}
	{
		f := cm.DREP(body).Fields()
		cm.DREP(out).Encode(&f)
		if !bytes.Equal(out, body) {
			t.Fatal("DREP: no reserved bits, Encode(Fields(x)) must be x")
		}
	}
	{
		f := cm.SIDRREQ(body).Fields()
		cm.SIDRREQ(out).Encode(&f)
		g := cm.SIDRREQ(out).Fields()
		if f != g {
			t.Fatalf("SIDR_REQ round trip\n%+v\n%+v", f, g)
		}
	}
	{
		f := cm.SIDRREP(body).Fields()
		cm.SIDRREP(out).Encode(&f)
		if !bytes.Equal(out, body) {
			t.Fatal("SIDR_REP: no reserved bits, Encode(Fields(x)) must be x")
		}
	}
	{
		f := cm.LAP(body).Fields()
		cm.LAP(out).Encode(&f)
		g := cm.LAP(out).Fields()
		cm.LAP(out2).Encode(&g)
		if f != g || !bytes.Equal(out, out2) {
			t.Fatalf("LAP round trip\n%+v\n%+v", f, g)
		}
	}
	{
		f := cm.APR(body).Fields()
		cm.APR(out).Encode(&f)
		g := cm.APR(out).Fields()
		if f != g {
			t.Fatalf("APR round trip\n%+v\n%+v", f, g)
		}
	}
}

// TestMasking: values wider than their fields are cut to the field, never
// spilling into neighbours.
func TestMasking(t *testing.T) {
	f := cm.REQFields{
		LocalQPN: 0xff123456, StartingPSN: 0xffabcdef, VendorID: 0xff010203,
		RemoteCMResponseTimeout: 0xff, RetryCount: 0xf9, PathMTU: 0xf3, MaxCMRetries: 0xfe,
		Primary: cm.Path{FlowLabel: 0xfff12345, PacketRate: 0xc2, SL: 0xf1, LocalACKTimeout: 0xe3},
	}
	b := make([]byte, cm.DataSize)
	cm.REQ(b).Encode(&f)
	g := cm.REQ(b).Fields()
	if g.LocalQPN != 0x123456 || g.StartingPSN != 0xabcdef || g.VendorID != 0x010203 || g.RemoteCMResponseTimeout != 0x1f ||
		g.RetryCount != 1 || g.PathMTU != 3 || g.MaxCMRetries != 0xe || g.ResponderResources != 0 || g.TransportServiceType != 0 ||
		g.Primary.FlowLabel != 0x12345 || g.Primary.PacketRate != 2 || g.Primary.SL != 1 || g.Primary.LocalACKTimeout != 3 ||
		g.Primary.TrafficClass != 0 || g.Primary.SubnetLocal {
		t.Errorf("masked REQ: %+v", g)
	}
}

func TestCMAHeader(t *testing.T) {
	v4s, v4d := netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.2")
	v6s, v6d := netip.MustParseAddr("2001:db8::3"), netip.MustParseAddr("2001:db8::2")
	for _, c := range []struct {
		name string
		f    cm.CMAHeaderFields
		want []byte
		back cm.CMAHeaderFields
	}{
		{
			"IPv4", cm.CMAHeaderFields{SrcPort: 0xb9aa, Src: v4s, Dst: v4d},
			append(append([]byte{0, 0x40, 0xb9, 0xaa}, append(make([]byte, 12), 192, 0, 2, 3)...), append(make([]byte, 12), 192, 0, 2, 2)...),
			cm.CMAHeaderFields{SrcPort: 0xb9aa, Src: v4s, Dst: v4d},
		},
		{
			"IPv4-mapped is IPv6", cm.CMAHeaderFields{SrcPort: 1, Src: netip.AddrFrom16(v4s.As16()), Dst: netip.AddrFrom16(v4d.As16())},
			append(append([]byte{0, 0x60, 0, 1}, netip.AddrFrom16(v4s.As16()).AsSlice()...), netip.AddrFrom16(v4d.As16()).AsSlice()...),
			cm.CMAHeaderFields{SrcPort: 1, Src: netip.AddrFrom16(v4s.As16()), Dst: netip.AddrFrom16(v4d.As16())},
		},
		{
			"IPv6", cm.CMAHeaderFields{SrcPort: 7174, Src: v6s, Dst: v6d},
			append(append([]byte{0, 0x60, 0x1c, 0x06}, v6s.AsSlice()...), v6d.AsSlice()...),
			cm.CMAHeaderFields{SrcPort: 7174, Src: v6s, Dst: v6d},
		},
	} {
		b := bytes.Repeat([]byte{0xff}, cm.CMAHeaderSize)
		if err := cm.CMAHeader(b).Encode(&c.f); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(b, c.want) {
			t.Errorf("%s\n got % x\nwant % x", c.name, b, c.want)
		}
		got, err := cm.ParseCMAHeader(b)
		if err != nil || got != c.back {
			t.Errorf("%s: ParseCMAHeader = %+v, %v, want %+v", c.name, got, err, c.back)
		}
	}
	for _, f := range []cm.CMAHeaderFields{{Src: v4s, Dst: v6d}, {Src: v6s, Dst: v4d}, {Src: v4s}, {Dst: v6d}, {Src: netip.AddrFrom16(v4s.As16()), Dst: v4d}} {
		b := bytes.Repeat([]byte{0xee}, cm.CMAHeaderSize)
		if err := cm.CMAHeader(b).Encode(&f); err == nil || bytes.Count(b, []byte{0xee}) != cm.CMAHeaderSize {
			t.Errorf("Encode(%+v) = %v, wrote % x", f, err, b)
		}
	}
	good := make([]byte, cm.CMAHeaderSize)
	good[1] = 0x40
	for _, c := range []struct {
		b    []byte
		want string
		err  error
	}{
		{good[:35], "cma_hdr length = 35", cm.ErrTruncated},
		{append([]byte{1}, good[1:]...), "cma_hdr cma_version = 1", cm.ErrUnsupported},
		{append([]byte{0, 0x50}, good[2:]...), "cma_hdr ip_version = 5", cm.ErrUnsupported},
		{append([]byte{0, 0x00}, good[2:]...), "cma_hdr ip_version = 0", cm.ErrUnsupported},
	} {
		_, err := cm.ParseCMAHeader(c.b)
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseCMAHeader = %v, want %q", err, c.want)
		}
	}
	// A longer buffer (the whole private data) parses its first 36 bytes;
	// the low nibble of the IP version byte is reserved.
	pd := make([]byte, cm.REQPrivateDataSize)
	copy(pd, good)
	pd[1] = 0x4f
	pd[40] = 0x99
	if f, err := cm.ParseCMAHeader(pd); err != nil || f.Src != netip.IPv4Unspecified() {
		t.Errorf("ParseCMAHeader(private data) = %+v, %v", f, err)
	}
	if cm.CMAREQPrivateDataSize != 56 || cm.CMASIDRREQPrivateDataSize != 180 {
		t.Errorf("user private data sizes %d, %d", cm.CMAREQPrivateDataSize, cm.CMASIDRREQPrivateDataSize)
	}
}

func TestServiceID(t *testing.T) {
	for _, c := range []struct {
		ps   cm.PortSpace
		port uint16
		sid  uint64
		name string
	}{
		{cm.PSTCP, 7174, 0x0000000001061c06, "TCP"},
		{cm.PSUDP, 7174, 0x0000000001111c06, "UDP"},
		{cm.PSIB, 1, 0x00000000013f0001, "IB"},
		{cm.PSIPoIB, 0xffff, 0x000000000002ffff, "IPoIB"},
	} {
		if got := cm.ServiceID(c.ps, c.port); got != c.sid {
			t.Errorf("ServiceID(%v, %d) = %#x, want %#x", c.ps, c.port, got, c.sid)
		}
		ps, port, ok := cm.SplitServiceID(c.sid)
		if !ok || ps != c.ps || port != c.port || ps.String() != c.name {
			t.Errorf("SplitServiceID(%#x) = %v %d %v", c.sid, ps, port, ok)
		}
	}
	for _, sid := range []uint64{0, 0x0000000001071c06, 0x0000000101061c06, 0x0200000000000001, 0x1061c06 << 32} {
		if ps, port, ok := cm.SplitServiceID(sid); ok {
			t.Errorf("SplitServiceID(%#x) = %v %d true", sid, ps, port)
		}
	}
	if s := cm.PortSpace(7).String(); s != "PortSpace(0x0007)" {
		t.Errorf("PortSpace(7) = %q", s)
	}
	// rdma_cm's IP port spaces fall under IB_CMA_SERVICE_ID; IPoIB's does
	// not.
	for _, ps := range []cm.PortSpace{cm.PSTCP, cm.PSUDP, cm.PSIB} {
		if cm.ServiceID(ps, 9)&cm.CMAServiceIDMask != cm.CMAServiceIDBase {
			t.Errorf("%v not under IB_CMA_SERVICE_ID", ps)
		}
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{cm.AttrREQ.String(), "REQ"},
		{cm.AttrSIDRREQ.String(), "SIDR_REQ"},
		{cm.AttrSIDRREP.String(), "SIDR_REP"},
		{cm.AttrAPR.String(), "APR"},
		{cm.AttrClassPortInfo.String(), "ClassPortInfo"},
		{cm.AttrID(0x1b).String(), "AttrID(0x001b)"},
		{cm.MethodSend.String(), "Send"},
		{cm.MethodGetResp.String(), "GetResp"},
		{cm.Method(0x42).String(), "Method(0x42)"},
		{cm.RejConsumer.String(), "consumer reject"},
		{cm.RejInvalidServiceID.String(), "invalid service ID"},
		{cm.RejTimeout.String(), "timeout"},
		{cm.RejInvalidCommInstance.String(), "invalid communication instance"},
		{cm.RejectReason(34).String(), "RejectReason(34)"},
		{cm.MTU1024.String(), "1024"},
		{cm.MTU(0).String(), "MTU(0)"},
		{cm.TransportUC.String(), "UC"},
		{cm.KindOther.String(), "other"},
		{cm.MsgKind(3).String(), "MsgKind(3)"},
		{cm.SIDRNoQP.String(), "no QP"},
		{cm.APRIsCurrent.String(), "path is the current one"},
		{cm.APRStatus(14).String(), "APRStatus(14)"},
	} {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
	if !cm.MethodGetResp.IsResponse() || cm.MethodSend.IsResponse() {
		t.Error("IsResponse")
	}
	for a := cm.AttrID(0); a < 0x30; a++ {
		if a.IsMessage() != (cm.NewMessage(a) != nil) {
			t.Errorf("%v: IsMessage and NewMessage disagree", a)
		}
		if m := cm.NewMessage(a); m != nil && m.AttributeID() != a {
			t.Errorf("NewMessage(%v) is a %v", a, m.AttributeID())
		}
	}
	// The reject reasons IBTA and Linux define, numbered as they number
	// them.
	for r, n := range map[cm.RejectReason]uint16{cm.RejNoQP: 1, cm.RejTimeout: 4, cm.RejInvalidCommInstance: 7, cm.RejInvalidServiceID: 8,
		cm.RejInvalidMTU: 26, cm.RejConsumer: 28, cm.RejInvalidClassVersion: 31, cm.RejVendorOptionNotSupp: 35} {
		if uint16(r) != n {
			t.Errorf("%v = %d, want %d", r, uint16(r), n)
		}
	}
}

func TestMTUAndTimeout(t *testing.T) {
	for m, n := range map[cm.MTU]int{cm.MTU256: 256, cm.MTU512: 512, cm.MTU1024: 1024, cm.MTU2048: 2048, cm.MTU4096: 4096, 0: 0, 6: 0, 15: 0} {
		if m.Bytes() != n || m.Valid() != (n != 0) {
			t.Errorf("MTU %d: Bytes %d Valid %v", m, m.Bytes(), m.Valid())
		}
		if n != 0 {
			if got, ok := cm.MTUFromBytes(n); !ok || got != m {
				t.Errorf("MTUFromBytes(%d) = %v %v", n, got, ok)
			}
		}
	}
	if _, ok := cm.MTUFromBytes(1500); ok {
		t.Error("MTUFromBytes(1500) ok")
	}
	for exp, want := range map[uint8]time.Duration{0: 4096 * time.Nanosecond, 14: 67108864 * time.Nanosecond, 20: 4294967296 * time.Nanosecond, 31: 4096 << 31 * time.Nanosecond, 32: 4096 * time.Nanosecond} {
		if got := cm.Timeout(exp); got != want {
			t.Errorf("Timeout(%d) = %v, want %v", exp, got, want)
		}
	}
}

func TestGID(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.3")
	g := cm.GIDFromAddr(a)
	if want := (cm.GID{10: 0xff, 11: 0xff, 12: 192, 13: 0, 14: 2, 15: 3}); g != want {
		t.Errorf("GIDFromAddr(%v) = % x", a, g[:])
	}
	if g.Addr() != a || g.String() != "192.0.2.3" {
		t.Errorf("Addr %v String %q", g.Addr(), g.String())
	}
	v6 := netip.MustParseAddr("fe80::5054:ff:fec0:203")
	if g := cm.GIDFromAddr(v6); g.Addr() != v6 {
		t.Errorf("IPv6 round trip %v", g.Addr())
	}
	if g := cm.GIDFromAddr(netip.Addr{}); g != (cm.GID{}) {
		t.Errorf("zero Addr gives % x", g[:])
	}
}

func TestAllocs(t *testing.T) {
	mad := newMAD(cm.AttrREQ)
	b := cm.REQ(cm.MAD(mad).Data())
	f := cm.REQFields{PathMTU: cm.MTU1024, LocalQPN: 7}
	h := cm.NewHeader(cm.AttrREQ, 1)
	n := testing.AllocsPerRun(100, func() {
		b.Encode(&f)
		f = b.Fields()
		_ = b.Check()
		_ = f.Decode(b)
		_ = cm.Encode(mad, &h, &f)
		_ = cm.MAD(mad).Header()
	})
	if n != 0 {
		t.Errorf("allocs = %v", n)
	}
}
