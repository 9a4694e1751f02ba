package golden_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/test/golden"
)

// rocePacket is one RoCEv2 frame of a golden capture, decoded.
type rocePacket struct {
	num   int
	frame []byte
	gp    gopacket.Packet
	ip    []byte // IP header .. ICRC (aliases frame)
	udp   *layers.UDP
	pk    packet.Packet
	src   netip.Addr
	dst   netip.Addr
}

// loadRoCE decodes every RoCEv2 frame (UDP destination port 4791) of a
// capture. Frames that fail to decode fail the test.
func loadRoCE(t *testing.T, path string) []*rocePacket {
	t.Helper()
	frames, lt, err := golden.ReadPCAP(path)
	if err != nil {
		t.Fatal(err)
	}
	if lt != rocelayer.LinkTypeEthernet {
		t.Fatalf("%s: link type %v", path, lt)
	}
	var out []*rocePacket
	for _, f := range frames {
		where := fmt.Sprintf("%s #%d", filepath.Base(path), f.Num)
		if f.Len != len(f.Data) {
			t.Fatalf("%s: frame truncated by the capture (%d of %d bytes)", where, len(f.Data), f.Len)
		}
		if r := decodeRoCE(t, where, f.Num, f.Data); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// decodeRoCE decodes an Ethernet frame; nil if it is not RoCEv2 (UDP to
// 4791). A RoCEv2 frame that fails to decode fails the test.
func decodeRoCE(t *testing.T, where string, num int, frame []byte) *rocePacket {
	t.Helper()
	gp := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true, SkipDecodeRecovery: true})
	udp, _ := gp.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if udp == nil || udp.DstPort != rocelayer.Port {
		return nil
	}
	if el := gp.ErrorLayer(); el != nil {
		t.Fatalf("%s: decode: %v", where, el.Error())
	}
	r := &rocePacket{num: num, frame: frame, gp: gp, udp: udp}
	var err error
	if r.ip, err = rocelayer.IPPacket(gp); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if err := r.pk.Parse(udp.Payload); err != nil {
		t.Fatalf("%s: packet.Parse: %v", where, err)
	}
	src, dst := gp.NetworkLayer().NetworkFlow().Endpoints()
	r.src, _ = netip.AddrFromSlice(src.Raw())
	r.dst, _ = netip.AddrFromSlice(dst.Raw())
	return r
}

// v6Addr is the IPv6 address the synthesized IPv6 frames use for an IPv4
// host of the captures: 192.0.2.x -> 2001:db8::c000:2xx (documentation
// prefix, the IPv4 address in the low 32 bits).
func v6Addr(a netip.Addr) netip.Addr {
	b := netip.MustParseAddr("2001:db8::").As16()
	a4 := a.Unmap().As4()
	copy(b[12:], a4[:])
	return netip.AddrFrom16(b)
}

// toIPv6 synthesizes the IPv6 twin of a golden IPv4 RoCEv2 frame — there is
// no golden IPv6 capture: the same Ethernet addresses, an IPv6 header with
// the IPv4 TOS as traffic class, a flow label, the TTL as hop limit and
// the v6Addr addresses, the same UDP ports with checksum 0 (as rxe sends
// over IPv6), the same RoCEv2 payload, and the ICRC recomputed for the
// IPv6 header (icrc.Put).
func toIPv6(t *testing.T, where string, p *rocePacket) *rocePacket {
	t.Helper()
	ip4, ok := p.gp.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !ok {
		t.Fatalf("%s: not IPv4", where)
	}
	eth := *p.gp.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	eth.EthernetType = layers.EthernetTypeIPv6
	ip6 := &layers.IPv6{Version: 6, TrafficClass: ip4.TOS, FlowLabel: uint32(p.udp.SrcPort)<<4 | 0x5,
		NextHeader: layers.IPProtocolUDP, HopLimit: ip4.TTL,
		SrcIP: v6Addr(p.src).AsSlice(), DstIP: v6Addr(p.dst).AsSlice()}
	udp := &layers.UDP{SrcPort: p.udp.SrcPort, DstPort: p.udp.DstPort}
	buf := gopacket.NewSerializeBuffer()
	pay := append([]byte(nil), p.udp.Payload...)
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, &eth, ip6, udp, gopacket.Payload(pay)); err != nil {
		t.Fatalf("%s: IPv6 twin: %v", where, err)
	}
	frame := append([]byte(nil), buf.Bytes()...)
	if err := icrc.Put(frame[14:]); err != nil {
		t.Fatalf("%s: IPv6 twin: icrc.Put: %v", where, err)
	}
	r := decodeRoCE(t, where+" (IPv6 twin)", p.num, frame)
	if r == nil {
		t.Fatalf("%s: IPv6 twin is not RoCEv2", where)
	}
	return r
}

// TestGoldenCaptures is the first "Must show": every RoCEv2 packet
// of every golden capture decodes, its ICRC verifies, its fields equal what
// the capture's .txt states, and re-encoding it from its decoded fields
// reproduces the captured bytes (UDP payload with packet.Build, whole frame
// with rocelayer).
func TestGoldenCaptures(t *testing.T) {
	total := 0
	for _, path := range golden.PCAPs(t) {
		name := filepath.Base(path)
		t.Run(strings.TrimSuffix(name, ".pcap"), func(t *testing.T) {
			c, err := golden.ParseTxt(strings.TrimSuffix(path, ".pcap") + ".txt")
			if err != nil {
				t.Fatal(err)
			}
			pkts := loadRoCE(t, path)
			if len(pkts) != len(c.Packets) {
				t.Errorf("%d RoCEv2 frames, the .txt lists %d", len(pkts), len(c.Packets))
			}
			byNum := map[int]*rocePacket{}
			for _, p := range pkts {
				byNum[p.num] = p
			}
			for _, l := range c.Packets {
				p := byNum[l.Frame]
				if p == nil {
					t.Errorf("frame %d listed in the .txt is not a RoCEv2 frame of the capture", l.Frame)
					continue
				}
				where := fmt.Sprintf("%s #%d", name, l.Frame)
				if err := icrc.Verify(p.ip); err != nil {
					t.Errorf("%s: icrc.Verify: %v", where, err)
				}
				compareLine(t, where, p, &l)
				reencode(t, where, p)
				total++
			}
			checkToolOutput(t, name, c, pkts)
		})
	}
	t.Logf("%d golden RoCEv2 packets checked", total)
	if total < 803 {
		t.Errorf("only %d golden packets checked; INDEX.md lists 803", total)
	}
}

// compareLine compares a decoded packet with its .txt line, field by field.
func compareLine(t *testing.T, where string, p *rocePacket, l *golden.Line) {
	t.Helper()
	b := p.pk.BTH
	eq := func(field string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %s = %v, .txt says %v", where, field, got, want)
		}
	}
	eq("src", p.src, l.Src)
	eq("src port", uint16(p.udp.SrcPort), l.SrcPort)
	eq("dst", p.dst, l.Dst)
	eq("opcode", b.Opcode().String(), l.Opcode)
	eq("dqpn", b.DestQP(), l.DQPN)
	eq("psn", uint32(b.PSN()), l.PSN)
	eq("AckReq", b.AckReq(), l.AckReq)
	eq("pkey", b.PKey(), l.PKey)
	eq("payload length", len(p.pk.Payload), l.Pay)
	eq("icrc", p.pk.ICRC, l.ICRC)
	// rocelayer's view agrees with packet's.
	bl := p.gp.Layer(rocelayer.LayerTypeBTH).(*rocelayer.BTH)
	eq("rocelayer ICRC", bl.ICRC, l.ICRC)
	eq("rocelayer opcode", bl.Opcode.String(), l.Opcode)

	eq("RETH present", p.pk.RETH != nil, l.RETH != nil)
	if p.pk.RETH != nil && l.RETH != nil {
		eq("RETH va", p.pk.RETH.VA(), l.RETH.VA)
		eq("RETH rkey", p.pk.RETH.RKey(), l.RETH.RKey)
		eq("RETH len", p.pk.RETH.DMALength(), l.RETH.Len)
	}
	eq("AETH present", p.pk.AETH != nil, l.AETH != nil)
	if p.pk.AETH != nil && l.AETH != nil {
		eq("AETH syndrome", p.pk.AETH.Syndrome().String(), l.AETH.Syndrome)
		eq("AETH msn", p.pk.AETH.MSN(), l.AETH.MSN)
		if p.pk.AETH.Syndrome().Type() == aeth.TypeACK {
			eq("AETH credits (rxe: no limit)", p.pk.AETH.Syndrome().Credits(), uint8(aeth.NoCreditLimit))
		}
	}
	eq("AtomicETH present", p.pk.AtomicETH != nil, l.AtomicETH != nil)
	if p.pk.AtomicETH != nil && l.AtomicETH != nil {
		eq("AtomicETH va", p.pk.AtomicETH.VA(), l.AtomicETH.VA)
		eq("AtomicETH rkey", p.pk.AtomicETH.RKey(), l.AtomicETH.RKey)
		eq("AtomicETH swap_add", p.pk.AtomicETH.SwapAdd(), l.AtomicETH.SwapAdd)
		eq("AtomicETH compare", p.pk.AtomicETH.Compare(), l.AtomicETH.Compare)
	}
	eq("AtomicAckETH present", p.pk.AtomicAck != nil, l.AtomicAck != nil)
	if p.pk.AtomicAck != nil && l.AtomicAck != nil {
		eq("AtomicAckETH orig", p.pk.AtomicAck.OrigData(), *l.AtomicAck)
	}
	eq("ImmDt present", p.pk.ImmDt != nil, l.Imm != nil)
	if p.pk.ImmDt != nil && l.Imm != nil {
		eq("ImmDt", p.pk.ImmDt.Imm(), *l.Imm)
	}
	eq("IETH present", p.pk.IETH != nil, l.IETH != nil)
	if p.pk.IETH != nil && l.IETH != nil {
		eq("IETH rkey", p.pk.IETH.RKey(), *l.IETH)
	}
	eq("DETH present", p.pk.DETH != nil, l.DETH != nil)
	if p.pk.DETH != nil && l.DETH != nil {
		eq("DETH qkey", p.pk.DETH.QKey(), l.DETH.QKey)
		eq("DETH srcqp", p.pk.DETH.SrcQP(), l.DETH.SrcQP)
	}
}

// reencode rebuilds the packet from its decoded fields: packet.Build plus
// the ICRC (icrc.Put over the rebuilt IP packet) must give the captured UDP
// payload, and rocelayer (decoded Ethernet/IP/UDP layers + FromFields +
// SerializeLayers) the whole captured frame.
func reencode(t *testing.T, where string, p *rocePacket) {
	t.Helper()
	f := p.pk.Fields()
	udpHdr := len(p.ip) - len(p.udp.Payload)
	ip := make([]byte, len(p.ip))
	copy(ip, p.ip[:udpHdr]) // captured IP and UDP headers
	n, err := packet.Build(ip[udpHdr:], &f)
	if err != nil {
		t.Errorf("%s: packet.Build: %v", where, err)
		return
	}
	if udpHdr+n != len(ip) {
		t.Errorf("%s: packet.Build wrote %d bytes, captured UDP payload has %d", where, n, len(p.udp.Payload))
		return
	}
	if err := icrc.Put(ip); err != nil {
		t.Errorf("%s: icrc.Put: %v", where, err)
	}
	if !bytes.Equal(ip[udpHdr:], p.udp.Payload) {
		t.Errorf("%s: packet.Build + icrc.Put\n got %x\nwant %x", where, ip[udpHdr:], p.udp.Payload)
	}

	eth := *p.gp.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	var ipl gopacket.SerializableLayer
	switch l := p.gp.NetworkLayer().(type) {
	case *layers.IPv4:
		ip4 := *l
		ip4.Checksum, ip4.Length, ip4.IHL = 0, 0, 0
		ipl = &ip4
	case *layers.IPv6:
		ip6 := *l
		ip6.Length = 0
		ipl = &ip6
	default:
		t.Errorf("%s: network layer %T", where, l)
		return
	}
	udp := *p.udp
	udp.Length = 0
	ls := append([]gopacket.SerializableLayer{&eth, ipl, &udp}, rocelayer.FromFields(&f)...)
	buf := gopacket.NewSerializeBuffer()
	if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Errorf("%s: rocelayer.SerializeLayers: %v", where, err)
		return
	}
	if !bytes.Equal(buf.Bytes(), p.frame) {
		t.Errorf("%s: rocelayer frame\n got %x\nwant %x", where, buf.Bytes(), p.frame)
	}
}

// checkToolOutput cross-checks the QPN/PSN/RKey/VAddr values the tools
// printed against the packets.
func checkToolOutput(t *testing.T, name string, c *golden.Capture, pkts []*rocePacket) {
	t.Helper()
	perHost := map[netip.Addr]int{}
	seen := map[golden.Addr]bool{}
	var addrs []golden.Addr
	for _, a := range c.Addrs {
		k := a
		k.Text = ""
		if !seen[k] {
			seen[k] = true
			perHost[a.Host]++
			addrs = append(addrs, a)
		}
	}
	rkeyChecked := 0
	for _, a := range addrs {
		where := fmt.Sprintf("%s: %v %q", name, a.Host, a.Text)
		// Packets to the host address its QP.
		found := false
		for _, p := range pkts {
			if p.dst == a.Host && p.pk.BTH.DestQP() == a.QPN {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: no packet to QPN %#x", where, a.QPN)
		}
		// The host's first request carries its initial PSN; a UD sender
		// names its QP in the DETH.
		if perHost[a.Host] == 1 {
			for _, p := range pkts {
				if p.src != a.Host || !p.pk.Info.Request {
					continue
				}
				if uint32(p.pk.BTH.PSN()) != a.PSN {
					t.Errorf("%s: first request #%d has PSN %v, tool printed %#x", where, p.num, p.pk.BTH.PSN(), a.PSN)
				}
				break
			}
			for _, p := range pkts {
				if p.src == a.Host && p.pk.DETH != nil && p.pk.DETH.SrcQP() != a.QPN {
					t.Errorf("%s: #%d DETH srcqp %#x, tool printed QPN %#x", where, p.num, p.pk.DETH.SrcQP(), a.QPN)
				}
			}
		}
		// Remote accesses to the host use its RKey and stay in its buffer.
		if !a.HasRKey {
			continue
		}
		for _, p := range pkts {
			if p.dst != a.Host {
				continue
			}
			var rkey uint32
			var va uint64
			switch {
			case p.pk.RETH != nil:
				rkey, va = p.pk.RETH.RKey(), p.pk.RETH.VA()
			case p.pk.AtomicETH != nil:
				rkey, va = p.pk.AtomicETH.RKey(), p.pk.AtomicETH.VA()
			default:
				continue
			}
			rkeyChecked++
			if rkey != a.RKey {
				t.Errorf("%s: #%d rkey %#x, tool printed %#x", where, p.num, rkey, a.RKey)
			}
			if va < a.VAddr || va-a.VAddr >= 1<<20 {
				t.Errorf("%s: #%d va %#x outside the buffer at %#x", where, p.num, va, a.VAddr)
			}
		}
	}
	for _, p := range pkts {
		if (p.pk.RETH != nil || p.pk.AtomicETH != nil) && len(addrs) > 0 && rkeyChecked == 0 && hasRKeys(addrs) {
			t.Errorf("%s: remote-access packets but none matched a printed RKey", name)
			break
		}
	}
	// Immediate data the client reported sending, in order.
	if len(c.SentImm) > 0 {
		var got []uint32
		for _, p := range pkts {
			if p.src == c.Client && p.pk.ImmDt != nil {
				got = append(got, p.pk.ImmDt.Imm())
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(c.SentImm) {
			t.Errorf("%s: ImmDt sent %x, client printed %x", name, got, c.SentImm)
		}
	}
}

func hasRKeys(addrs []golden.Addr) bool {
	for _, a := range addrs {
		if a.HasRKey {
			return true
		}
	}
	return false
}

// TestGoldenBitFlips: flipping any single bit of a covered byte of a golden
// packet makes ICRC verification fail; changing a masked field (IPv4:
// TOS/ECN, TTL, header checksum; IPv6: traffic class, flow label, hop
// limit; UDP checksum, BTH byte 4) does not. Each packet is checked as
// captured (IPv4) and as its synthesized IPv6 twin (toIPv6). The gopacket
// checker path (rocelayer.VerifyICRC) is exercised on one flip per byte of
// the first packet of each capture.
func TestGoldenBitFlips(t *testing.T) {
	flips := 0
	for _, path := range golden.PCAPs(t) {
		name := filepath.Base(path)
		for i, p := range loadRoCE(t, path) {
			where := fmt.Sprintf("%s #%d", name, p.num)
			if p.ip[0]>>4 != 4 || p.ip[0]&0xf != 5 {
				t.Fatalf("%s: not a 20-byte IPv4 header", where)
			}
			flips += bitFlips(t, where, p, i == 0)
			flips += bitFlips(t, where+" (IPv6 twin)", toIPv6(t, where, p), i == 0)
		}
	}
	t.Logf("%d single-bit flips rejected", flips)
}

// bitFlips flips every covered bit of p's IP packet (IPv4 with a 20-byte
// header, or IPv6) and sets its masked fields to other values; checker
// also flips one bit per byte through rocelayer.VerifyICRC. It returns the
// number of flips.
func bitFlips(t *testing.T, where string, p *rocePacket, checker bool) int {
	t.Helper()
	const udpHdr = 8
	ipHdr := 20
	// maskedBits returns the bits of IP byte off the ICRC does not cover.
	maskedBits := func(off int) byte {
		switch off {
		case 1, 8, 10, 11: // TOS, TTL, header checksum
			return 0xff
		}
		return 0
	}
	// plain: flips of these bytes are plain mismatches (addresses, ports,
	// everything from the BTH on); length, version and protocol fields
	// may be reported as malformed instead.
	plain := func(off int) bool {
		return off >= 12 && off < ipHdr || off >= ipHdr && off < ipHdr+4 || off >= ipHdr+udpHdr
	}
	sets := []struct {
		off int
		v   byte
	}{{1, 0xff}, {1, 0x03}, {8, 1}, {8, 0xff}, {10, 0x12}, {11, 0x34}}
	if p.ip[0]>>4 == 6 {
		ipHdr = 40
		maskedBits = func(off int) byte {
			switch off {
			case 0: // traffic class, high nibble
				return 0x0f
			case 1, 2, 3, 7: // traffic class low nibble, flow label, hop limit
				return 0xff
			}
			return 0
		}
		plain = func(off int) bool { return off >= 8 && off < ipHdr+4 || off >= ipHdr+udpHdr }
		sets = []struct {
			off int
			v   byte
		}{{0, 0x6f}, {1, 0xff}, {1, 0x30}, {2, 0xab}, {3, 0xcd}, {7, 1}, {7, 0xff}}
	}
	masked := func(off int) byte {
		if off == ipHdr+6 || off == ipHdr+7 || off == ipHdr+udpHdr+4 { // UDP checksum, BTH byte 4
			return 0xff
		}
		return maskedBits(off)
	}
	flips := 0
	ip := append([]byte(nil), p.ip...)
	for off := range ip {
		m := masked(off)
		for bit := 0; bit < 8; bit++ {
			if m&(1<<bit) != 0 {
				continue
			}
			ip[off] ^= 1 << bit
			err := icrc.Verify(ip)
			if err == nil || plain(off) && !errors.Is(err, icrc.ErrMismatch) {
				t.Fatalf("%s: flipping bit %d of IP byte %d: icrc.Verify = %v", where, bit, off, err)
			}
			ip[off] ^= 1 << bit
			flips++
		}
		if checker && m != 0xff {
			fr := append([]byte(nil), p.frame...)
			for bit := 0; bit < 8; bit++ {
				if m&(1<<bit) == 0 {
					fr[14+off] ^= 1 << bit
					break
				}
			}
			gp := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.DecodeOptions{SkipDecodeRecovery: true})
			if err := rocelayer.VerifyICRC(gp); err == nil && gp.ErrorLayer() == nil {
				t.Errorf("%s: checker accepted a flip of IP byte %d", where, off)
			}
		}
	}
	// Masked fields may take any value.
	sets = append(sets, []struct {
		off int
		v   byte
	}{{ipHdr + 6, 0xab}, {ipHdr + 7, 0xcd}, {ipHdr + udpHdr + 4, 0xc0}, {ipHdr + udpHdr + 4, 0x3f}}...)
	for _, m := range sets {
		ip := append([]byte(nil), p.ip...)
		ip[m.off] = m.v
		if err := icrc.Verify(ip); err != nil {
			t.Fatalf("%s: setting masked byte %d to %#x: %v", where, m.off, m.v, err)
		}
	}
	if err := icrc.Verify(p.ip); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return flips
}

// TestGoldenIPv6Twins checks every golden packet's synthesized IPv6 twin
// (toIPv6): its ICRC verifies, its fields equal the .txt line's (with the
// twin's addresses), and re-encoding it from its decoded fields gives the
// twin's bytes (packet.Build + icrc.Put, and rocelayer over an IPv6 layer).
// The ICRC must differ from the IPv4 one (the addresses are covered).
func TestGoldenIPv6Twins(t *testing.T) {
	total := 0
	for _, path := range golden.PCAPs(t) {
		name := filepath.Base(path)
		c, err := golden.ParseTxt(strings.TrimSuffix(path, ".pcap") + ".txt")
		if err != nil {
			t.Fatal(err)
		}
		byNum := map[int]*rocePacket{}
		for _, p := range loadRoCE(t, path) {
			byNum[p.num] = p
		}
		for _, l := range c.Packets {
			p := byNum[l.Frame]
			if p == nil {
				t.Fatalf("%s: frame %d of the .txt is not RoCEv2", name, l.Frame)
			}
			where := fmt.Sprintf("%s #%d (IPv6 twin)", name, l.Frame)
			p6 := toIPv6(t, where, p)
			if err := icrc.Verify(p6.ip); err != nil {
				t.Errorf("%s: icrc.Verify: %v", where, err)
			}
			if p6.pk.ICRC == p.pk.ICRC {
				t.Errorf("%s: IPv6 ICRC %#x equals the IPv4 one", where, p6.pk.ICRC)
			}
			l6 := l
			l6.Src, l6.Dst, l6.ICRC = v6Addr(l.Src), v6Addr(l.Dst), p6.pk.ICRC
			compareLine(t, where, p6, &l6)
			reencode(t, where, p6)
			total++
		}
	}
	t.Logf("%d IPv6 twins checked", total)
}

// TestGoldenOpcodeNames checks that every opcode name in the .txt files
// parses back to the opcode (bth.ParseOpcode) and prints the same.
func TestGoldenOpcodeNames(t *testing.T) {
	for _, path := range golden.PCAPs(t) {
		c, err := golden.ParseTxt(strings.TrimSuffix(path, ".pcap") + ".txt")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range c.Packets {
			op, ok := bth.ParseOpcode(l.Opcode)
			if !ok || op.String() != l.Opcode {
				t.Errorf("%s: %q -> %v %v", filepath.Base(path), l.Opcode, op, ok)
			}
		}
	}
}
