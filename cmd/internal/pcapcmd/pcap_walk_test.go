//go:build unix

package pcapcmd

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// Outer addresses of the tunnels (never to be shown for the inner packet).
var outerSrc, outerDst = []byte{198, 51, 100, 1}, []byte{198, 51, 100, 2}

// ipv4Header returns a 20-byte IPv4 header of protocol proto before n
// bytes of payload, with its checksum.
func ipv4Header(proto byte, n int) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+n))
	h[8] = 64
	h[9] = proto
	copy(h[12:], outerSrc)
	copy(h[16:], outerDst)
	fixIPv4Checksum(h)
	return h
}

// ethIPv4 wraps an IPv4 packet in an Ethernet header.
func ethIPv4(ip []byte) []byte {
	return append([]byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00}, ip...)
}

// outer4 returns an Ethernet frame of an outer IPv4 packet of protocol
// proto carrying the given bytes.
func outer4(proto byte, parts ...[]byte) []byte {
	p := bytes.Join(parts, nil)
	return ethIPv4(append(ipv4Header(proto, len(p)), p...))
}

// roceIPv4 returns an IPv4 RoCEv2 packet (RC SEND_ONLY with n payload
// bytes, no DF bit) with its ICRC.
func roceIPv4(t *testing.T, n int) []byte {
	t.Helper()
	f := rocelayer.SampleFields(bth.RCSendOnly, 0)
	f.Payload = bytes.Repeat([]byte{0x5a}, n)
	ip := &layers.IPv4{Version: 4, TTL: 64, Id: 0x4242, Protocol: layers.IPProtocolUDP,
		SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
	udp := &layers.UDP{SrcPort: 0xc011, DstPort: rocelayer.Port}
	buf := gopacket.NewSerializeBuffer()
	ls := append([]gopacket.SerializableLayer{ip, udp}, rocelayer.FromFields(&f)...)
	if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// fragments cuts IPv4 packet ip into two fragments at off bytes of payload.
func fragments(ip []byte, off int) (first, second []byte) {
	first = append(append([]byte(nil), ip[:20]...), ip[20:20+off]...)
	second = append(append([]byte(nil), ip[:20]...), ip[20+off:]...)
	binary.BigEndian.PutUint16(first[2:], uint16(len(first)))
	binary.BigEndian.PutUint16(first[6:], 0x2000) // MF
	binary.BigEndian.PutUint16(second[2:], uint16(len(second)))
	binary.BigEndian.PutUint16(second[6:], uint16(off/8))
	fixIPv4Checksum(first[:20])
	fixIPv4Checksum(second[:20])
	return first, second
}

// TestPcapCheckWalk: RoCEv2 inside tunnels (GRE/ERSPAN II, GRE 0x6558,
// VXLAN, IPv4-in-IPv4) is checked against its inner IP header and shown
// with the inner addresses; an encapsulation not decoded is named and
// counted apart; legacy QinQ tags (0x9100, 0x9200) are VLAN tags; IPv4
// fragments of a RoCEv2 packet are reassembled (in order or not) or named
// when incomplete; a RoCEv2 packet's wrong IPv4 checksum is bad, a zero
// one a note, another frame's never fails the check; a UDP length shorter
// than the IP payload is named; a RoCEv2 packet after IPv6 extension
// headers is not checked but counted apart; a capture that cut only the
// FCS checks the whole IP packet.
func TestPcapCheckWalk(t *testing.T) {
	ip := roceIPv4(t, 16)
	eth := ethIPv4(ip)
	badIP := append([]byte(nil), ip...)
	badIP[len(badIP)-1] ^= 1
	erspan := append([]byte{0x10, 0x00, 0x88, 0xbe, 0, 0, 0, 1}, 0x10, 0, 0, 1, 0, 0, 0, 0)
	vxlan := []byte{0x30, 0x00, 0x12, 0xb5, 0, 0, 0, 0, 0x08, 0, 0, 0, 0, 0, 1, 0}
	binary.BigEndian.PutUint16(vxlan[4:], uint16(16+len(eth)))
	qinq := func(tpid uint16) []byte {
		tag := []byte{byte(tpid >> 8), byte(tpid), 0, 10, 0x81, 0x00, 0, 20}
		return append(append(append([]byte(nil), eth[:12]...), tag...), eth[12:]...)
	}
	big := roceIPv4(t, 1400)
	f1, f2 := fragments(big, 1000)
	wrongCsum := append([]byte(nil), eth...)
	wrongCsum[14+10] ^= 0x40
	zeroCsum := append([]byte(nil), eth...)
	zeroCsum[14+10], zeroCsum[14+11] = 0, 0
	tcpZero := outer4(6, make([]byte, 20))
	tcpZero[14+10], tcpZero[14+11] = 0, 0
	udpShort := append([]byte(nil), eth...)
	binary.BigEndian.PutUint16(udpShort[14+24:], binary.BigEndian.Uint16(udpShort[14+24:])-4)
	v6 := func() []byte {
		udp := ip[20:]
		h := make([]byte, 48)
		h[0] = 0x60
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(udp)))
		h[6], h[7] = 0, 64 // Hop-by-Hop, then UDP
		h[40] = 17
		h[42], h[43] = 1, 4 // PadN option, 4 bytes of padding
		return append([]byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd}, append(h, udp...)...)
	}()
	tests := []struct {
		name    string
		frames  [][]byte
		origLen int
		code    int
		want    []string
	}{
		{"erspan", [][]byte{outer4(47, erspan, eth)}, 0, cli.ExitOK, []string{"#1 192.0.2.1:49169 > 192.0.2.2:4791 RC_SEND_ONLY", "(in GRE/ERSPAN II) ok"}},
		{"gre teb", [][]byte{outer4(47, []byte{0, 0, 0x65, 0x58}, eth)}, 0, cli.ExitOK, []string{"#1 192.0.2.1:49169 > 192.0.2.2:4791", "(in GRE) ok"}},
		{"vxlan", [][]byte{outer4(17, vxlan, eth)}, 0, cli.ExitOK, []string{"#1 192.0.2.1:49169 > 192.0.2.2:4791", "(in VXLAN) ok"}},
		{"ipip", [][]byte{outer4(4, ip)}, 0, cli.ExitOK, []string{"#1 192.0.2.1:49169 > 192.0.2.2:4791", "(in IPv4-in-IP) ok"}},
		{"ipip bad inner", [][]byte{outer4(4, badIP)}, 0, cli.ExitFail, []string{"#1 192.0.2.1:49169 > 192.0.2.2:4791", "(in IPv4-in-IP) BAD: ICRC mismatch"}},
		{"gre mpls", [][]byte{outer4(47, []byte{0, 0, 0x88, 0x47}, eth)}, 0, cli.ExitOK, []string{"#1 encapsulation not supported: GRE protocol 0x8847 not decoded", "1 in an encapsulation not supported"}},
		{"qinq 9100", [][]byte{qinq(0x9100)}, 0, cli.ExitOK, []string{"1 RoCEv2 (ICRC ok 1, bad 0), 0 other"}},
		{"qinq 9200", [][]byte{qinq(0x9200)}, 0, cli.ExitOK, []string{"1 RoCEv2 (ICRC ok 1, bad 0), 0 other"}},
		{"fragments", [][]byte{ethIPv4(f1), ethIPv4(f2)}, 0, cli.ExitOK, []string{"#1 IPv4 fragment of a RoCEv2 packet", "#2 192.0.2.1:49169 > 192.0.2.2:4791 RC_SEND_ONLY", "pay=1400", "(reassembled from 2 IPv4 fragments, frames 1, 2) ok", "1 RoCEv2 (ICRC ok 1, bad 0)"}},
		{"fragments reversed", [][]byte{ethIPv4(f2), ethIPv4(f1)}, 0, cli.ExitOK, []string{"(reassembled from 2 IPv4 fragments, frames 1, 2) ok"}},
		{"fragment missing", [][]byte{ethIPv4(f1)}, 0, cli.ExitOK, []string{"#1 RoCEv2 packet in IPv4 fragments (frames 1): not reassembled (fragments missing), ICRC not checked", "1 RoCEv2 not checked"}},
		{"ipv4 checksum wrong", [][]byte{wrongCsum}, 0, cli.ExitFail, []string{"BAD: IPv4 header checksum 0x", "is wrong, should be 0x"}},
		{"ipv4 checksum 0", [][]byte{zeroCsum}, 0, cli.ExitOK, []string{"(IPv4 checksum 0: offloaded at the capture point?) ok"}},
		{"other checksum 0", [][]byte{tcpZero, eth}, 0, cli.ExitOK, []string{"#1 other frame with a bad IP header: IPv4 header checksum 0", "1 other frames with a bad IP header"}},
		{"udp length short", [][]byte{udpShort}, 0, cli.ExitFail, []string{"#1 192.0.2.1:49169 > 192.0.2.2:4791 BAD: malformed: UDP length 36 disagrees with the IP payload length 40"}},
		{"ipv6 extension header", [][]byte{v6}, 0, cli.ExitOK, []string{"#1 RoCEv2 packet after IPv6 extension headers (Hop-by-Hop): ICRC not checked", "1 RoCEv2 not checked"}},
		{"fcs cut", [][]byte{eth}, len(eth) + 4, cli.ExitOK, []string{"1 RoCEv2 (ICRC ok 1, bad 0)"}},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".pcap")
			writeFrames(t, path, layers.LinkTypeEthernet, tt.frames, tt.origLen)
			code, out, errOut := runIn(t, "pcap", "check", path)
			if code != tt.code {
				t.Errorf("exit %d, want %d\n%s%s", code, tt.code, out, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
				}
			}
			if strings.Contains(out, "198.51.100.") {
				t.Errorf("outer addresses shown:\n%s", out)
			}
		})
	}
}

// TestPcapCheckFragmentBound: reassembly holds at most maxFragDatagrams
// datagrams; the RoCEv2 ones given up are named, not checked, and do not
// fail the check.
func TestPcapCheckFragmentBound(t *testing.T) {
	first, _ := fragments(roceIPv4(t, 1400), 1000)
	n := maxFragDatagrams + 4
	frames := make([][]byte, n)
	for i := range frames {
		f := append([]byte(nil), first...)
		binary.BigEndian.PutUint16(f[4:], uint16(i)) // identification
		fixIPv4Checksum(f[:20])
		frames[i] = ethIPv4(f)
	}
	path := filepath.Join(t.TempDir(), "frags.pcap")
	writeFrames(t, path, layers.LinkTypeEthernet, frames, 0)
	code, out, errOut := runIn(t, "pcap", "check", "-q", path)
	if code != cli.ExitOK || !strings.Contains(out, itoa(n)+" RoCEv2 not checked") {
		t.Errorf("exit %d\n%s%s", code, out, errOut)
	}
	_, out, _ = runIn(t, "pcap", "check", path)
	if got := strings.Count(out, "not reassembled (reassembly bound"); got != 4 {
		t.Errorf("%d datagrams given up at the bound, want 4:\n%s", got, out)
	}
}

// TestPcapCheckFlushAtomicWrite: IBTA 1.5's RC FLUSH (BTH, FETH, RETH) and
// RC ATOMIC_WRITE (BTH, RETH, 8 bytes), as rdma_rxe sends them, check ok
// (they were "unknown opcode").
func TestPcapCheckFlushAtomicWrite(t *testing.T) {
	var frames [][]byte
	for _, op := range []bth.Opcode{bth.RCFlush, bth.RCAtomicWrite} {
		f := rocelayer.SampleFields(op, 1)
		f.FETH = 0x21
		if op == bth.RCAtomicWrite {
			f.Payload = []byte{1, 2, 3, 4, 5, 6, 7, 8}
		}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
		udp := &layers.UDP{SrcPort: 0xc011, DstPort: rocelayer.Port}
		buf := gopacket.NewSerializeBuffer()
		ls := append([]gopacket.SerializableLayer{ip, udp}, rocelayer.FromFields(&f)...)
		if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, ethIPv4(buf.Bytes()))
	}
	path := filepath.Join(t.TempDir(), "flush.pcap")
	writeFrames(t, path, layers.LinkTypeEthernet, frames, 0)
	code, out, errOut := runIn(t, "pcap", "check", path)
	for _, w := range []string{" RC_FLUSH qpn=", "FETH[sel=2 plt=1] RETH[", " RC_ATOMIC_WRITE qpn=", "pay=8 icrc=", "2 RoCEv2 (ICRC ok 2, bad 0)"} {
		if code != cli.ExitOK || !strings.Contains(out, w) {
			t.Errorf("exit %d, output lacks %q:\n%s%s", code, w, out, errOut)
		}
	}
}
