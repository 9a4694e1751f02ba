package rocelayer_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
)

// pcapHeader returns a classic pcap file header with the given magic, byte
// order and link type (all 32 bits of it).
func pcapHeader(bo binary.ByteOrder, magic, linkType uint32) []byte {
	h := make([]byte, 24)
	bo.PutUint32(h, magic)
	bo.PutUint16(h[4:], 2)
	bo.PutUint16(h[6:], 4)
	bo.PutUint32(h[16:], 65535)
	bo.PutUint32(h[20:], linkType)
	return h
}

// ngHeader returns a pcapng Section Header Block (with an option, so the
// IDB is not at a fixed offset) and an Interface Description Block.
func ngHeader(bo binary.ByteOrder, linkType uint16) []byte {
	shb := make([]byte, 36)
	bo.PutUint32(shb, 0x0a0d0d0a)
	bo.PutUint32(shb[4:], 36)
	bo.PutUint32(shb[8:], 0x1a2b3c4d)
	bo.PutUint16(shb[12:], 1)
	bo.PutUint64(shb[16:], ^uint64(0))
	bo.PutUint16(shb[24:], 4) // shb_userappl, 3 bytes + pad
	bo.PutUint16(shb[26:], 3)
	copy(shb[28:], "abc")
	bo.PutUint32(shb[32:], 36)
	idb := make([]byte, 20)
	bo.PutUint32(idb, 1)
	bo.PutUint32(idb[4:], 20)
	bo.PutUint16(idb[8:], linkType)
	bo.PutUint32(idb[12:], 262144)
	bo.PutUint32(idb[16:], 20)
	return append(shb, idb...)
}

func TestFileLinkType(t *testing.T) {
	le, be := binary.LittleEndian, binary.BigEndian
	tests := []struct {
		name string
		head []byte
		want uint32
		ok   bool
	}{
		{"pcap le sll2", pcapHeader(le, 0xa1b2c3d4, 276), 276, true},
		{"pcap be sll2", pcapHeader(be, 0xa1b2c3d4, 276), 276, true},
		{"pcap nano ethernet", pcapHeader(le, 0xa1b23c4d, 1), 1, true},
		{"pcap fcs bits", pcapHeader(le, 0xa1b2c3d4, 0x10000000|113), 113, true},
		{"pcap fcs present", pcapHeader(le, 0xa1b2c3d4, 0x24000001), 1, true},
		{"pcap short", pcapHeader(le, 0xa1b2c3d4, 276)[:20], 0, false},
		{"pcapng le sll2", ngHeader(le, 276), 276, true},
		{"pcapng be raw", ngHeader(be, 101), 101, true},
		{"pcapng no idb", ngHeader(le, 276)[:36], 0, false},
		{"pcapng bad bom", append([]byte{0x0a, 0x0d, 0x0d, 0x0a, 36, 0, 0, 0, 1, 2, 3, 4}, make([]byte, 24)...), 0, false},
		{"garbage", []byte("definitely not a capture file"), 0, false},
		{"empty", nil, 0, false},
	}
	for _, tt := range tests {
		got, err := rocelayer.FileLinkType(tt.head)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("%s: FileLinkType = %d, %v; want %d, ok %v", tt.name, got, err, tt.want, tt.ok)
		}
	}
}

func TestLinkDecoder(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	eth := samples[0].Frame
	ip := eth[14:]
	sll := append([]byte{0, 4, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x08, 0x00}, ip...)
	sll2 := append([]byte{0x08, 0x00, 0, 0, 0, 0, 0, 1, 0, 1, 4, 6, 2, 0, 0, 0, 0, 1, 0, 0}, ip...)
	null := append([]byte{2, 0, 0, 0}, ip...)
	loop := append([]byte{0, 0, 0, 2}, ip...)
	tests := []struct {
		lt    uint32
		frame []byte
	}{
		{rocelayer.LinkTypeEthernet, eth}, {rocelayer.LinkTypeLinuxSLL, sll}, {rocelayer.LinkTypeLinuxSLL2, sll2},
		{rocelayer.LinkTypeRaw, ip}, {rocelayer.LinkTypeRawOld, ip}, {rocelayer.LinkTypeRawOld2, ip},
		{rocelayer.LinkTypeIPv4, ip}, {rocelayer.LinkTypeNull, null}, {rocelayer.LinkTypeLoop, loop},
	}
	for _, tt := range tests {
		dec, err := rocelayer.LinkDecoder(tt.lt)
		if err != nil {
			t.Errorf("link type %d: %v", tt.lt, err)
			continue
		}
		p := gopacket.NewPacket(tt.frame, dec, gopacket.Default)
		if p.Layer(rocelayer.LayerTypeBTH) == nil {
			t.Errorf("link type %d: no BTH decoded: %v", tt.lt, p)
			continue
		}
		if err := rocelayer.VerifyICRC(p); err != nil {
			t.Errorf("link type %d: %v", tt.lt, err)
		}
	}
	if _, err := rocelayer.LinkDecoder(20); err == nil {
		t.Error("link type 20 (what 276 reads as in 8 bits) accepted")
	}
	if _, err := rocelayer.LinkDecoder(147); err == nil {
		t.Error("link type 147 accepted")
	}
}

func TestNetworkPacket(t *testing.T) {
	ip4 := []byte{0x45, 1, 2, 3}
	ip6 := []byte{0x60, 1, 2, 3}
	tests := []struct {
		lt    uint32
		frame []byte
		et    uint16
		pkt   []byte
		ok    bool
	}{
		{rocelayer.LinkTypeEthernet, append(make([]byte, 12), append([]byte{0x86, 0xdd}, ip6...)...), 0x86dd, ip6, true},
		{rocelayer.LinkTypeEthernet, make([]byte, 13), 0, nil, false},
		{rocelayer.LinkTypeLinuxSLL, append(make([]byte, 14), append([]byte{8, 0}, ip4...)...), 0x0800, ip4, true},
		{rocelayer.LinkTypeLinuxSLL2, append([]byte{8, 0}, append(make([]byte, 18), ip4...)...), 0x0800, ip4, true},
		{rocelayer.LinkTypeLinuxSLL2, make([]byte, 19), 0, nil, false},
		{rocelayer.LinkTypeRaw, ip6, 0x86dd, ip6, true},
		{rocelayer.LinkTypeIPv4, ip4, 0x0800, ip4, true},
		{rocelayer.LinkTypeNull, append([]byte{2, 0, 0, 0}, ip4...), 0x0800, ip4, true},
		{rocelayer.LinkTypeNull, append([]byte{0, 0, 0, 30}, ip6...), 0x86dd, ip6, true},
		{rocelayer.LinkTypeLoop, append([]byte{0, 0, 0, 24}, ip6...), 0x86dd, ip6, true},
		{20, ip4, 0, nil, false},
	}
	for _, tt := range tests {
		et, pkt, ok := rocelayer.NetworkPacket(tt.lt, tt.frame)
		if et != tt.et || !bytes.Equal(pkt, tt.pkt) || ok != tt.ok {
			t.Errorf("link type %d, % x: %#x % x %v; want %#x % x %v", tt.lt, tt.frame, et, pkt, ok, tt.et, tt.pkt, tt.ok)
		}
	}
}

func TestLinuxSLL2(t *testing.T) {
	in := &rocelayer.LinuxSLL2{ProtocolType: layers.EthernetTypeIPv6, InterfaceIndex: 0x01020304, ARPHRDType: 772,
		PacketType: layers.LinuxSLLPacketTypeOutgoing, Addr: []byte{1, 2, 3, 4, 5, 6}}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, in, gopacket.Payload{0xaa}); err != nil {
		t.Fatal(err)
	}
	want := []byte{0x86, 0xdd, 0, 0, 1, 2, 3, 4, 0x03, 0x04, 4, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0xaa}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("serialized % x, want % x", buf.Bytes(), want)
	}
	var out rocelayer.LinuxSLL2
	if err := out.DecodeFromBytes(buf.Bytes(), gopacket.NilDecodeFeedback); err != nil {
		t.Fatal(err)
	}
	if out.ProtocolType != in.ProtocolType || out.InterfaceIndex != in.InterfaceIndex || out.ARPHRDType != in.ARPHRDType ||
		out.PacketType != in.PacketType || !bytes.Equal(out.Addr, in.Addr) || !bytes.Equal(out.Payload, []byte{0xaa}) ||
		out.NextLayerType() != layers.LayerTypeIPv6 {
		t.Errorf("decoded %+v", out)
	}
	// An address length beyond 8 keeps 8 bytes; a short header is an error.
	long := append([]byte(nil), want...)
	long[11] = 200
	if err := out.DecodeFromBytes(long, gopacket.NilDecodeFeedback); err != nil || len(out.Addr) != 8 {
		t.Errorf("addr len 200: %v, %d bytes", err, len(out.Addr))
	}
	if err := out.DecodeFromBytes(want[:19], gopacket.NilDecodeFeedback); err == nil {
		t.Error("19-byte header accepted")
	}
	p := gopacket.NewPacket(want[:19], rocelayer.LayerTypeLinuxSLL2, gopacket.Default)
	if p.ErrorLayer() == nil {
		t.Error("truncated SLL2 frame without an error layer")
	}
}

// gsoDatagram returns the IPv4 packet of a UDP GSO datagram of the given
// UDP payloads (all but the last of one size) as Linux's segmentation
// would split it: segment k's ICRC computed with IPv4 ID id+k and its own
// lengths.
func gsoDatagram(t *testing.T, id uint16, pays ...[]byte) []byte {
	t.Helper()
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	hdr := append([]byte(nil), samples[0].Frame[14:14+28]...)
	var all []byte
	for k, p := range pays {
		seg := append(append([]byte(nil), hdr...), p...)
		binary.BigEndian.PutUint16(seg[2:], uint16(len(seg)))
		binary.BigEndian.PutUint16(seg[4:], id+uint16(k))
		binary.BigEndian.PutUint16(seg[24:], uint16(8+len(p)))
		if err := icrc.Put(seg); err != nil {
			t.Fatal(err)
		}
		all = append(all, seg[28:]...)
	}
	d := append(append([]byte(nil), hdr...), all...)
	binary.BigEndian.PutUint16(d[2:], uint16(len(d)))
	binary.BigEndian.PutUint16(d[4:], id)
	binary.BigEndian.PutUint16(d[24:], uint16(8+len(all)))
	return d
}

func TestGSOSegments(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	var big, small []byte
	for _, s := range samples {
		p := s.Frame[14+28:]
		if len(p) > len(big) {
			big = p
		}
		if small == nil || len(p) < len(small) {
			small = p
		}
	}
	three := gsoDatagram(t, 0xfffe, big, big, small) // the ID wraps
	segs := rocelayer.GSOSegments(three)
	if len(segs) != 3 {
		t.Fatalf("3-segment datagram: %d segments", len(segs))
	}
	for k, s := range segs {
		if err := icrc.Verify(s); err != nil {
			t.Errorf("segment %d: %v", k, err)
		}
		if id := binary.BigEndian.Uint16(s[4:]); id != 0xfffe+uint16(k) {
			t.Errorf("segment %d: ID %#x", k, id)
		}
		p := gopacket.NewPacket(s, layers.LayerTypeIPv4, gopacket.Default)
		if ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ip == nil || p.ErrorLayer() != nil {
			t.Errorf("segment %d does not decode: %v", k, p)
		} else if c := ip.Checksum; c != segChecksum(s) {
			t.Errorf("segment %d: IPv4 checksum %#x", k, c)
		}
	}
	if !bytes.Equal(segs[2][28:], small) {
		t.Error("last segment's payload differs")
	}
	// Not GSO: a single valid packet, a datagram with one bad segment, a
	// non-IP packet, a truncated one.
	if s := rocelayer.GSOSegments(samples[0].Frame[14:]); s != nil {
		t.Errorf("a single packet split into %d", len(s))
	}
	bad := append([]byte(nil), three...)
	bad[len(bad)-10] ^= 1
	if s := rocelayer.GSOSegments(bad); s != nil {
		t.Errorf("corrupt last segment: %d segments", len(s))
	}
	for _, b := range [][]byte{nil, {0x60}, three[:30], {0x45, 0, 0, 20}} {
		if s := rocelayer.GSOSegments(b); s != nil {
			t.Errorf("% x: %d segments", b, len(s))
		}
	}
}

// segChecksum recomputes an IPv4 header checksum.
func segChecksum(ip []byte) uint16 {
	var sum uint32
	for i := 0; i < 20; i += 2 {
		if i != 10 {
			sum += uint32(binary.BigEndian.Uint16(ip[i:]))
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// FuzzLinkTypeAndSLL2: the capture-header sniffing, the SLL2 decoder and
// the GSO split never panic on any input, and a split returns only
// segments with valid ICRCs.
func FuzzLinkTypeAndSLL2(f *testing.F) {
	f.Add(pcapHeader(binary.LittleEndian, 0xa1b2c3d4, 276))
	f.Add(ngHeader(binary.BigEndian, 276))
	f.Add([]byte{0x08, 0x00, 0, 0, 0, 0, 0, 1, 0, 1, 4, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x45})
	if samples, err := rocelayer.SampleFrames(); err == nil {
		f.Add(samples[0].Frame[14:])
	}
	var w bytes.Buffer
	if nw, err := pcapgo.NewNgWriter(&w, layers.LinkTypeEthernet); err == nil && nw.Flush() == nil {
		f.Add(w.Bytes())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if lt, err := rocelayer.FileLinkType(b); err == nil {
			rocelayer.LinkDecoder(lt)
		}
		for _, lt := range []uint32{0, 1, 101, 108, 113, 276} {
			rocelayer.NetworkPacket(lt, b)
		}
		gopacket.NewPacket(b, rocelayer.LayerTypeLinuxSLL2, gopacket.Default)
		if len(b) > 1<<14 {
			return
		}
		for k, s := range rocelayer.GSOSegments(b) {
			if err := icrc.Verify(s); err != nil {
				t.Fatalf("segment %d: %v", k, err)
			}
		}
	})
}

// TestHeaderOnlySize: the length of a packet without payload at the start
// of a UDP payload (GSOHeaderOnlySegments' segment size), a SACK block
// after an ACK's AETH included; 0 for opcodes with payload, undefined ones
// and a non-zero pad count.
func TestHeaderOnlySize(t *testing.T) {
	build := func(op bth.Opcode, sack []byte) []byte {
		f := rocelayer.SampleFields(op, 0)
		f.Payload = sack
		buf := make([]byte, 256)
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		return append(buf[:n], 0xee, 0xee, 0xee, 0xee) // the next packet's bytes
	}
	var sk [aeth.SACKMaxSize]byte
	sack := sk[:aeth.EncodeSACK(sk[:], []uint32{0x80000000, 1})]
	padded := build(bth.RCAck, nil)
	padded[1] |= 0x30 // pad count 3
	tests := []struct {
		name string
		b    []byte
		want int
	}{
		{"ack", build(bth.RCAck, nil), 20},
		{"sack nak", build(bth.RCAck, sack), 20 + len(sack)},
		{"read request", build(bth.RCReadRequest, nil), 32},
		{"compare swap", build(bth.RCCompareSwap, nil), 44},
		{"atomic ack", build(bth.RCAtomicAck, nil), 28},
		{"flush", build(bth.RCFlush, nil), 36},
		{"send", build(bth.RCSendOnly, nil), 0},
		{"pad count", padded, 0},
		{"undefined", []byte{0x1f, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}, 0},
		{"short", []byte{0x11, 0}, 0},
	}
	for _, tt := range tests {
		if got := rocelayer.HeaderOnlySize(tt.b); got != tt.want {
			t.Errorf("%s: HeaderOnlySize = %d, want %d", tt.name, got, tt.want)
		}
	}
}
