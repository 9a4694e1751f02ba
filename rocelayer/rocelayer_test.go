package rocelayer_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/test/goldendir"
)

// decode decodes an Ethernet frame without gopacket's panic recovery, so a
// panic in a decoder fails the test.
func decode(frame []byte) gopacket.Packet {
	return gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{SkipDecodeRecovery: true})
}

// isRoCE reports whether p carries UDP to port 4791.
func isRoCE(p gopacket.Packet) (*layers.UDP, bool) {
	u, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	return u, u != nil && u.DstPort == rocelayer.Port
}

type goldenFrame struct {
	name string
	num  int
	data []byte
}

// goldenRoCE returns every RoCEv2 frame of every golden capture.
func goldenRoCE(tb testing.TB) []goldenFrame {
	tb.Helper()
	var out []goldenFrame
	for _, path := range goldendir.PCAPs(tb) {
		frames, lt, err := readPCAP(path)
		if err != nil {
			tb.Fatal(err)
		}
		if lt != layers.LinkTypeEthernet {
			tb.Fatalf("%s: link type %v, want Ethernet", path, lt)
		}
		for i, f := range frames {
			if _, ok := isRoCE(decode(f)); ok {
				out = append(out, goldenFrame{filepath.Base(path), i + 1, f})
			}
		}
	}
	if len(out) == 0 {
		tb.Fatal("no RoCEv2 frames in the golden captures")
	}
	return out
}

// wantLayers returns the layer types the BTH decoder must produce for pk.
func wantLayers(pk *packet.Packet) []gopacket.LayerType {
	want := []gopacket.LayerType{rocelayer.LayerTypeBTH}
	h := pk.Info.Headers
	for _, x := range []struct {
		h bth.Header
		t gopacket.LayerType
	}{
		{bth.HdrRDETH, rocelayer.LayerTypeRDETH}, {bth.HdrDETH, rocelayer.LayerTypeDETH}, {bth.HdrFETH, rocelayer.LayerTypeFETH},
		{bth.HdrRETH, rocelayer.LayerTypeRETH}, {bth.HdrAtomicETH, rocelayer.LayerTypeAtomicETH},
		{bth.HdrAETH, rocelayer.LayerTypeAETH}, {bth.HdrAtomicAckETH, rocelayer.LayerTypeAtomicAckETH},
		{bth.HdrImmDt, rocelayer.LayerTypeImmDt}, {bth.HdrIETH, rocelayer.LayerTypeIETH},
		{bth.HdrCNPPad, rocelayer.LayerTypeCNPPad},
	} {
		if h&x.h != 0 {
			want = append(want, x.t)
		}
	}
	if len(pk.Payload) > 0 {
		want = append(want, gopacket.LayerTypePayload)
	}
	return want
}

// checkAgainstParse compares the gopacket view of a RoCEv2 frame with
// packet.Parse's view of its UDP payload.
func checkAgainstParse(t *testing.T, where string, p gopacket.Packet, udp *layers.UDP) {
	t.Helper()
	if el := p.ErrorLayer(); el != nil {
		t.Errorf("%s: decode error: %v", where, el.Error())
		return
	}
	var pk packet.Packet
	if err := pk.Parse(udp.Payload); err != nil {
		t.Errorf("%s: packet.Parse: %v", where, err)
		return
	}
	b, ok := p.Layer(rocelayer.LayerTypeBTH).(*rocelayer.BTH)
	if !ok {
		t.Errorf("%s: no BTH layer; layers %v", where, layerTypes(p))
		return
	}
	if got, want := b.Fields, pk.BTH.Fields(); got != want {
		t.Errorf("%s: BTH fields %+v, packet.Parse %+v", where, got, want)
	}
	if b.Info != pk.Info || b.ICRC != pk.ICRC {
		t.Errorf("%s: Info/ICRC %+v %#x, packet.Parse %+v %#x", where, b.Info, b.ICRC, pk.Info, pk.ICRC)
	}
	// The layers after UDP are exactly BTH, the opcode's headers, Payload.
	var got []gopacket.LayerType
	seen := false
	for _, l := range p.Layers() {
		if l.LayerType() == rocelayer.LayerTypeBTH {
			seen = true
		}
		if seen {
			got = append(got, l.LayerType())
		}
	}
	if want := wantLayers(&pk); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: layers %v, want %v", where, got, want)
	}
	if r, ok := p.Layer(rocelayer.LayerTypeRETH).(*rocelayer.RETH); ok && r.Fields != pk.RETH.Fields() {
		t.Errorf("%s: RETH %+v, packet.Parse %+v", where, r.Fields, pk.RETH.Fields())
	}
	if a, ok := p.Layer(rocelayer.LayerTypeAETH).(*rocelayer.AETH); ok && a.Fields != pk.AETH.Fields() {
		t.Errorf("%s: AETH %+v, packet.Parse %+v", where, a.Fields, pk.AETH.Fields())
	}
	if a, ok := p.Layer(rocelayer.LayerTypeAtomicETH).(*rocelayer.AtomicETH); ok && a.Fields != pk.AtomicETH.Fields() {
		t.Errorf("%s: AtomicETH %+v, packet.Parse %+v", where, a.Fields, pk.AtomicETH.Fields())
	}
	if a, ok := p.Layer(rocelayer.LayerTypeAtomicAckETH).(*rocelayer.AtomicAckETH); ok && a.OrigData != pk.AtomicAck.OrigData() {
		t.Errorf("%s: AtomicAckETH %#x, packet.Parse %#x", where, a.OrigData, pk.AtomicAck.OrigData())
	}
	if i, ok := p.Layer(rocelayer.LayerTypeImmDt).(*rocelayer.ImmDt); ok && i.Imm != pk.ImmDt.Imm() {
		t.Errorf("%s: ImmDt %#x, packet.Parse %#x", where, i.Imm, pk.ImmDt.Imm())
	}
	if i, ok := p.Layer(rocelayer.LayerTypeIETH).(*rocelayer.IETH); ok && i.RKey != pk.IETH.RKey() {
		t.Errorf("%s: IETH %#x, packet.Parse %#x", where, i.RKey, pk.IETH.RKey())
	}
	if d, ok := p.Layer(rocelayer.LayerTypeDETH).(*rocelayer.DETH); ok && d.Fields != pk.DETH.Fields() {
		t.Errorf("%s: DETH %+v, packet.Parse %+v", where, d.Fields, pk.DETH.Fields())
	}
	var pay []byte
	if app := p.ApplicationLayer(); app != nil {
		pay = app.Payload()
	}
	if !bytes.Equal(pay, pk.Payload) {
		t.Errorf("%s: payload %d bytes, packet.Parse %d", where, len(pay), len(pk.Payload))
	}
	if err := rocelayer.VerifyICRC(p); err != nil {
		t.Errorf("%s: VerifyICRC: %v", where, err)
	}
}

func layerTypes(p gopacket.Packet) []gopacket.LayerType {
	var out []gopacket.LayerType
	for _, l := range p.Layers() {
		out = append(out, l.LayerType())
	}
	return out
}

func TestGoldenDecode(t *testing.T) {
	for _, f := range goldenRoCE(t) {
		p := decode(f.data)
		udp, _ := isRoCE(p)
		checkAgainstParse(t, fmt.Sprintf("%s #%d", f.name, f.num), p, udp)
	}
}

// serializable returns p's layers as SerializableLayers.
func serializable(t *testing.T, p gopacket.Packet) []gopacket.SerializableLayer {
	t.Helper()
	var ls []gopacket.SerializableLayer
	for _, l := range p.Layers() {
		s, ok := l.(gopacket.SerializableLayer)
		if !ok {
			t.Fatalf("layer %v is not serializable", l.LayerType())
		}
		ls = append(ls, s)
	}
	return ls
}

// ipv6Twin synthesizes the IPv6 version of a golden IPv4 RoCEv2 frame
// (there is no golden IPv6 capture): the same Ethernet addresses, an IPv6
// header (the TOS as traffic class, a flow label, the TTL as hop limit,
// 2001:db8:: addresses with the IPv4 address in the low 32 bits), the
// same UDP ports with checksum 0 (as rxe sends over IPv6), the same
// RoCEv2 payload and the ICRC recomputed for the IPv6 header.
func ipv6Twin(t testing.TB, frame []byte) []byte {
	t.Helper()
	p := decode(frame)
	ip4, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	udp, isR := isRoCE(p)
	if !ok || !isR {
		t.Fatalf("not an IPv4 RoCEv2 frame: %v", layerTypes(p))
	}
	v6 := func(a net.IP) net.IP {
		b := net.ParseIP("2001:db8::")
		copy(b[12:], a.To4())
		return b
	}
	eth := *p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	eth.EthernetType = layers.EthernetTypeIPv6
	ip6 := &layers.IPv6{Version: 6, TrafficClass: ip4.TOS, FlowLabel: uint32(udp.SrcPort)<<4 | 0x9, NextHeader: layers.IPProtocolUDP,
		HopLimit: ip4.TTL, SrcIP: v6(ip4.SrcIP), DstIP: v6(ip4.DstIP)}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, &eth, ip6,
		&layers.UDP{SrcPort: udp.SrcPort, DstPort: udp.DstPort}, gopacket.Payload(append([]byte(nil), udp.Payload...))); err != nil {
		t.Fatal(err)
	}
	out := append([]byte(nil), buf.Bytes()...)
	if err := rocelayer.PutICRC(out, layers.LayerTypeEthernet); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGoldenSerializeRoundTrip re-serializes every golden RoCEv2 frame, and
// its synthesized IPv6 twin (ipv6Twin), from its decoded layers and
// compares the whole frame with the original: once as decoded
// (gopacket.SerializeLayers, no options) and once with lengths, pad count,
// IPv4 checksum and ICRC cleared and recomputed (SerializeLayers with
// FixLengths and ComputeChecksums).
func TestGoldenSerializeRoundTrip(t *testing.T) {
	var frames []goldenFrame
	for _, f := range goldenRoCE(t) {
		frames = append(frames, f, goldenFrame{f.name + " (IPv6 twin)", f.num, ipv6Twin(t, f.data)})
	}
	for _, f := range frames {
		where := fmt.Sprintf("%s #%d", f.name, f.num)
		p := decode(f.data)
		if err := rocelayer.VerifyICRC(p); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, serializable(t, p)...); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if !bytes.Equal(buf.Bytes(), f.data) {
			t.Errorf("%s: plain re-serialization differs:\n got %x\nwant %x", where, buf.Bytes(), f.data)
		}

		p = decode(f.data)
		switch ip := p.NetworkLayer().(type) {
		case *layers.IPv4:
			ip.Checksum, ip.Length, ip.IHL = 0, 0, 0
		case *layers.IPv6:
			ip.Length = 0
		default:
			t.Fatalf("%s: network layer %T", where, ip)
		}
		udp, _ := isRoCE(p)
		udp.Length = 0
		b := p.Layer(rocelayer.LayerTypeBTH).(*rocelayer.BTH)
		b.PadCount, b.ICRC = 0, 0
		if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, serializable(t, p)...); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if !bytes.Equal(buf.Bytes(), f.data) {
			t.Errorf("%s: recomputed serialization differs:\n got %x\nwant %x", where, buf.Bytes(), f.data)
		}
	}
}

// TestFromFieldsMatchesBuild checks that the layers FromFields returns
// serialize to exactly what packet.Build writes, for every sample opcode.
func TestFromFieldsMatchesBuild(t *testing.T) {
	for i, op := range rocelayer.SampleOpcodes() {
		f := rocelayer.SampleFields(op, i)
		want := make([]byte, packet.Len(op, len(f.Payload)))
		n, err := packet.Build(want, &f)
		if err != nil {
			t.Fatalf("%v: Build: %v", op, err)
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, rocelayer.FromFields(&f)...); err != nil {
			t.Fatalf("%v: %v", op, err)
		}
		if !bytes.Equal(buf.Bytes(), want[:n]) {
			t.Errorf("%v: FromFields\n got %x\nwant %x", op, buf.Bytes(), want[:n])
		}
	}
}

// TestSampleFrames decodes every sample frame and checks its fields against
// the values it was built from.
func TestSampleFrames(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	ops := map[bth.Opcode]bool{}
	for _, s := range samples {
		where := s.Fields.BTH.Opcode.String()
		p := decode(s.Frame)
		udp, ok := isRoCE(p)
		if !ok {
			t.Fatalf("%s: not RoCEv2: %v", where, layerTypes(p))
		}
		checkAgainstParse(t, where, p, udp)
		b := p.Layer(rocelayer.LayerTypeBTH).(*rocelayer.BTH)
		if b.Fields != s.Fields.BTH {
			t.Errorf("%s: BTH %+v, built from %+v", where, b.Fields, s.Fields.BTH)
		}
		if ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); !ok || ip.Checksum == 0 {
			t.Errorf("%s: IPv4 checksum not computed", where)
		}
		ops[b.Opcode] = true
	}
	for _, op := range []bth.Opcode{bth.RCSendFirst, bth.RCSendOnlyInv, bth.RCCompareSwap, bth.RCAtomicAck,
		bth.UCWriteOnlyImm, bth.UDSendOnly, bth.UDSendOnlyImm, bth.CNP} {
		if !ops[op] {
			t.Errorf("samples lack %v", op)
		}
	}
}

// TestFlushAtomicWrite: RC FLUSH (BTH, FETH, RETH) and RC ATOMIC_WRITE
// (BTH, RETH, 8 bytes) serialize from Fields and decode back, layer by
// layer, as packet.Parse sees them; they are not among the samples.
func TestFlushAtomicWrite(t *testing.T) {
	for _, op := range []bth.Opcode{bth.RCFlush, bth.RCAtomicWrite} {
		f := rocelayer.SampleFields(op, 3)
		f.FETH = 0x21 // selectivity 2, placement type 1
		if op == bth.RCAtomicWrite {
			f.Payload = []byte{1, 2, 3, 4, 5, 6, 7, 8}
		}
		eth := &layers.Ethernet{SrcMAC: rocelayer.SampleSrcMAC, DstMAC: rocelayer.SampleDstMAC, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
		udp := &layers.UDP{SrcPort: 0xc000, DstPort: rocelayer.Port}
		buf := gopacket.NewSerializeBuffer()
		ls := append([]gopacket.SerializableLayer{eth, ip, udp}, rocelayer.FromFields(&f)...)
		if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
			t.Fatal(err)
		}
		p := decode(buf.Bytes())
		u, ok := isRoCE(p)
		if !ok {
			t.Fatalf("%v: not RoCEv2: %v", op, layerTypes(p))
		}
		checkAgainstParse(t, op.String(), p, u)
		if err := rocelayer.VerifyICRC(p); err != nil {
			t.Errorf("%v: %v", op, err)
		}
		if fe, ok := p.Layer(rocelayer.LayerTypeFETH).(*rocelayer.FETH); (op == bth.RCFlush) != ok ||
			ok && (fe.PlacementType() != 1 || fe.SelectivityLevel() != 2) {
			t.Errorf("%v: FETH layer %+v", op, fe)
		}
	}
}

// frame builds an Ethernet/IPv4/UDP(4791) frame around a RoCEv2 UDP payload.
func frame(t testing.TB, udpPayload []byte) []byte {
	eth := &layers.Ethernet{SrcMAC: rocelayer.SampleSrcMAC, DstMAC: rocelayer.SampleDstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
	udp := &layers.UDP{SrcPort: 0xc001, DstPort: rocelayer.Port}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, ip, udp, gopacket.Payload(udpPayload)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestMalformed(t *testing.T) {
	ack := func(mod func([]byte) []byte) []byte {
		f := rocelayer.SampleFields(bth.RCAck, 1)
		b := make([]byte, packet.Len(bth.RCAck, 0))
		if _, err := packet.Build(b, &f); err != nil {
			t.Fatal(err)
		}
		return mod(b)
	}
	tests := []struct {
		name string
		pay  []byte
		want error
	}{
		{"short", []byte{0x11, 0, 0xff, 0xff}, packet.ErrTruncated},
		{"ack without AETH", ack(func(b []byte) []byte { return append(b[:12], 0, 0, 0, 0) }), packet.ErrTruncated},
		{"unknown opcode", ack(func(b []byte) []byte { b[0] = 0x1f; return b }), packet.ErrUnknownOpcode},
		{"TVer 1", ack(func(b []byte) []byte { b[1] |= 1; return b }), packet.ErrBadTVer},
		{"payload on ACK", ack(func(b []byte) []byte { return append(b, 1, 2, 3, 4) }), packet.ErrUnexpectedPayload},
		{"pad count beyond payload", ack(func(b []byte) []byte { b[0] = byte(bth.RCSendOnly); b[1] |= 0x30; return append(b[:12], 0, 0, 0, 0) }), packet.ErrBadPadCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := decode(frame(t, tt.pay))
			el := p.ErrorLayer()
			if el == nil {
				t.Fatalf("no error layer; layers %v", layerTypes(p))
			}
			if !errors.Is(el.Error(), tt.want) {
				t.Errorf("error %v, want %v", el.Error(), tt.want)
			}
			if p.Layer(rocelayer.LayerTypeBTH) != nil {
				t.Errorf("BTH layer added for a malformed packet")
			}
			var b rocelayer.BTH
			if err := b.DecodeFromBytes(tt.pay, gopacket.NilDecodeFeedback); !errors.Is(err, tt.want) {
				t.Errorf("DecodeFromBytes: %v, want %v", err, tt.want)
			}
		})
	}
}

// TestExtensionLayersStandalone decodes each extension header layer on its
// own: exact size works, one byte less is a truncation error.
func TestExtensionLayersStandalone(t *testing.T) {
	tests := []struct {
		l    gopacket.DecodingLayer
		size int
	}{
		{&rocelayer.RETH{}, 16}, {&rocelayer.AETH{}, 4}, {&rocelayer.AtomicETH{}, 28},
		{&rocelayer.AtomicAckETH{}, 8}, {&rocelayer.ImmDt{}, 4}, {&rocelayer.IETH{}, 4},
		{&rocelayer.DETH{}, 8}, {&rocelayer.CNPPad{}, 16}, {&rocelayer.RDETH{}, 4},
	}
	for _, tt := range tests {
		data := make([]byte, tt.size+3)
		for i := range data {
			data[i] = byte(i + 1)
		}
		if err := tt.l.DecodeFromBytes(data, gopacket.NilDecodeFeedback); err != nil {
			t.Errorf("%T: %v", tt.l, err)
		}
		l := tt.l.(gopacket.Layer)
		if len(l.LayerContents()) != tt.size || len(l.LayerPayload()) != 3 {
			t.Errorf("%T: contents %d payload %d", tt.l, len(l.LayerContents()), len(l.LayerPayload()))
		}
		if tt.l.NextLayerType() != gopacket.LayerTypePayload {
			t.Errorf("%T: next %v", tt.l, tt.l.NextLayerType())
		}
		// Serialize back: the same header bytes (the RDETH reserved byte is zero).
		buf := gopacket.NewSerializeBuffer()
		if err := tt.l.(gopacket.SerializableLayer).SerializeTo(buf, gopacket.SerializeOptions{}); err != nil {
			t.Fatal(err)
		}
		want := append([]byte(nil), data[:tt.size]...)
		switch tt.l.(type) {
		case *rocelayer.RDETH:
			want[0] = 0 // reserved
		case *rocelayer.DETH:
			want[4] = 0 // reserved
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("%T: serialized %x, want %x", tt.l, buf.Bytes(), want)
		}
		if err := tt.l.DecodeFromBytes(data[:tt.size-1], gopacket.NilDecodeFeedback); !errors.Is(err, packet.ErrTruncated) {
			t.Errorf("%T: short input: %v", tt.l, err)
		}
	}
}

// TestIPv6 serializes a RoCEv2 frame over IPv6 and decodes it back.
func TestIPv6(t *testing.T) {
	f := rocelayer.SampleFields(bth.RCWriteOnlyImm, 3)
	eth := &layers.Ethernet{SrcMAC: rocelayer.SampleSrcMAC, DstMAC: rocelayer.SampleDstMAC, EthernetType: layers.EthernetTypeIPv6}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, TrafficClass: 2, FlowLabel: 0x12345,
		SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
	udp := &layers.UDP{SrcPort: 0xc123, DstPort: rocelayer.Port}
	buf := gopacket.NewSerializeBuffer()
	ls := append([]gopacket.SerializableLayer{eth, ip, udp}, rocelayer.FromFields(&f)...)
	if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	p := decode(buf.Bytes())
	u, ok := isRoCE(p)
	if !ok {
		t.Fatalf("not RoCEv2: %v", layerTypes(p))
	}
	checkAgainstParse(t, "IPv6", p, u)
	// Masked IPv6 fields do not matter; the payload does.
	fr := append([]byte(nil), buf.Bytes()...)
	fr[14+1] ^= 0xff // traffic class low bits / flow label
	fr[14+7] = 1     // hop limit
	if err := rocelayer.VerifyICRC(decode(fr)); err != nil {
		t.Errorf("masked IPv6 fields changed the ICRC: %v", err)
	}
	fr[len(fr)-5] ^= 1
	if err := rocelayer.VerifyICRC(decode(fr)); !errors.Is(err, icrc.ErrMismatch) {
		t.Errorf("corrupted payload: %v, want ErrMismatch", err)
	}
}

func TestIPPacketErrors(t *testing.T) {
	p := gopacket.NewPacket([]byte{1, 2, 3}, layers.LayerTypeEthernet, gopacket.Default)
	if _, err := rocelayer.IPPacket(p); !errors.Is(err, rocelayer.ErrNoIP) {
		t.Errorf("no IP: %v", err)
	}
	eth := &layers.Ethernet{SrcMAC: rocelayer.SampleSrcMAC, DstMAC: rocelayer.SampleDstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, ip, gopacket.Payload(make([]byte, 20))); err != nil {
		t.Fatal(err)
	}
	if _, err := rocelayer.IPPacket(decode(buf.Bytes())); !errors.Is(err, rocelayer.ErrNoUDP) {
		t.Errorf("no UDP: %v", err)
	}
}

// FuzzDecode feeds arbitrary bytes behind an Ethernet/IPv4/UDP 4791 prefix
// to gopacket with the RoCEv2 layers; decoding must never panic, a decoded
// BTH must agree with packet.Parse, and serializing the decoded layers must
// not panic either.
func FuzzDecode(f *testing.F) {
	seeds := 0
	if dir, ok := goldendir.Seeds(f); ok {
		for _, path := range goldendir.Files(dir) {
			frames, _, err := readPCAP(path)
			if err != nil {
				f.Fatalf("golden capture %s: %v", path, err)
			}
			for _, fr := range frames {
				if u, ok := isRoCE(decode(fr)); ok {
					f.Add(append([]byte(nil), u.Payload...))
					seeds++
				}
			}
		}
		if seeds == 0 {
			goldendir.Missing(f, fmt.Errorf("no RoCEv2 frame in any *.pcap of %s", dir))
		}
	}
	if samples, err := rocelayer.SampleFrames(); err == nil {
		for _, s := range samples {
			f.Add(s.Frame[14+20+8:])
		}
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, pay []byte) {
		p := decode(frame(t, pay))
		var pk packet.Packet
		perr := pk.Parse(pay)
		b, ok := p.Layer(rocelayer.LayerTypeBTH).(*rocelayer.BTH)
		if ok != (perr == nil) {
			t.Fatalf("BTH layer %v, packet.Parse error %v", ok, perr)
		}
		if !ok {
			if p.ErrorLayer() == nil && len(pay) > 0 { // gopacket does not decode an empty UDP payload
				t.Fatalf("malformed payload without error layer: %v", perr)
			}
			return
		}
		if b.Fields != pk.BTH.Fields() {
			t.Fatalf("BTH %+v vs %+v", b.Fields, pk.BTH.Fields())
		}
		buf := gopacket.NewSerializeBuffer()
		var ls []gopacket.SerializableLayer
		for _, l := range p.Layers() {
			if s, ok := l.(gopacket.SerializableLayer); ok {
				ls = append(ls, s)
			}
		}
		_ = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, ls...)
	})
}

// readPCAP reads every frame of a pcap file.
func readPCAP(path string) ([][]byte, layers.LinkType, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	var out [][]byte
	for n := 1; ; n++ {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out, r.LinkType(), nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%s: frame %d: %w", path, n, err)
		}
		out = append(out, data)
	}
}
