//go:build unix

package pcapcmd

import (
	"encoding/binary"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// gsoFrame returns an Ethernet frame holding n packets of opcode op as one
// UDP GSO datagram, as a capture before segmentation sees it: each packet
// is built (with its ICRC) as the segment the kernel makes of the
// datagram (IPv4: identification id+k), and the datagram is the first
// segment's headers with the lengths of all.
func gsoFrame(t *testing.T, v6 bool, op bth.Opcode, n int) []byte {
	t.Helper()
	var hdr, pay []byte
	for k := range n {
		f := rocelayer.SampleFields(op, k)
		udp := &layers.UDP{SrcPort: 0xc011, DstPort: rocelayer.Port}
		var ip gopacket.SerializableLayer = &layers.IPv4{Version: 4, TTL: 64, Id: 0x100 + uint16(k),
			Protocol: layers.IPProtocolUDP, SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
		if v6 {
			ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
				SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
		}
		buf := gopacket.NewSerializeBuffer()
		ls := append([]gopacket.SerializableLayer{ip, udp}, rocelayer.FromFields(&f)...)
		if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
			t.Fatal(err)
		}
		hl := 20
		if v6 {
			hl = 40
		}
		seg := buf.Bytes()
		if k == 0 {
			hdr = append([]byte(nil), seg[:hl+8]...)
		}
		pay = append(pay, seg[hl+8:]...)
	}
	d := append(hdr, pay...)
	hl := len(hdr) - 8
	binary.BigEndian.PutUint16(d[hl+4:], uint16(8+len(pay)))
	etype := []byte{0x08, 0x00}
	if v6 {
		binary.BigEndian.PutUint16(d[4:], uint16(8+len(pay)))
		etype = []byte{0x86, 0xdd}
	} else {
		binary.BigEndian.PutUint16(d[2:], uint16(len(d)))
		fixIPv4Checksum(d[:hl])
	}
	eth := append(append([]byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1}, etype...), d...)
	return eth
}

// fixIPv4Checksum recomputes the checksum of IPv4 header h.
func fixIPv4Checksum(h []byte) {
	h[10], h[11] = 0, 0
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
}

// TestPcapCheckGSOHeaderOnly: GSO datagrams of packets without payload
// (batched ACKs, READ requests, CmpSwap, atomic ACKs), IPv4 and IPv6, are
// split at the first packet's length and every segment checked; a bad
// segment is named. Before, packet.Parse rejected the datagram
// ("unexpected payload") and the split was never tried.
func TestPcapCheckGSOHeaderOnly(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		op   bth.Opcode
		n    int
		want string
	}{
		{bth.RCAck, 3, "RC_ACKNOWLEDGE"},
		{bth.RCReadRequest, 4, "RC_RDMA_READ_REQUEST"},
		{bth.RCCompareSwap, 8, "RC_COMPARE_SWAP"},
		{bth.RCAtomicAck, 2, "RC_ATOMIC_ACKNOWLEDGE"},
	}
	for _, v6 := range []bool{false, true} {
		for _, tt := range tests {
			name := tt.op.String()
			if v6 {
				name += "_v6"
			}
			t.Run(name, func(t *testing.T) {
				path := filepath.Join(dir, name+".pcap")
				writeFrames(t, path, layers.LinkTypeEthernet, [][]byte{gsoFrame(t, v6, tt.op, tt.n)}, 0)
				code, out, errOut := runIn(t, "pcap", "check", path)
				if code != cli.ExitOK || !strings.Contains(out, "1 frames, "+itoa(tt.n)+" RoCEv2 (ICRC ok "+itoa(tt.n)+", bad 0)") ||
					!strings.Contains(out, " #1."+itoa(tt.n)+" ") || !strings.Contains(out, tt.want) {
					t.Errorf("exit %d\n%s%s", code, out, errOut)
				}
				// A corrupted second segment is named; the others pass.
				f := gsoFrame(t, v6, tt.op, tt.n)
				f[len(f)-1] ^= 0x01 // the last segment's ICRC
				writeFrames(t, path, layers.LinkTypeEthernet, [][]byte{f}, 0)
				code, out, _ = runIn(t, "pcap", "check", path)
				if code != cli.ExitFail || !strings.Contains(out, "#1: GSO segment "+itoa(tt.n)+"/"+itoa(tt.n)+": ICRC mismatch") ||
					!strings.Contains(out, "ok "+itoa(tt.n-1)+", bad 1") {
					t.Errorf("corrupted: exit %d\n%s", code, out)
				}
			})
		}
	}
}

// itoa is strconv.Itoa.
func itoa(n int) string { return strconv.Itoa(n) }

// TestPcapCheckGSORealCapture: the GSO datagrams of packets without
// payload in a real tcpdump -i any capture of rocev2d demo
// (testdata/tcpdump_any_gso_nopayload.txt) split into 58 good packets.
func TestPcapCheckGSORealCapture(t *testing.T) {
	code, out, errOut := runIn(t, "pcap", "check", "-q", "testdata/tcpdump_any_gso_nopayload.pcap")
	want := "8 frames, 58 RoCEv2 (ICRC ok 58, bad 0), 0 other frames skipped, 8 GSO datagrams split into their packets"
	if code != cli.ExitOK || !strings.Contains(out, want) {
		t.Errorf("exit %d, output lacks %q:\n%s%s", code, want, out, errOut)
	}
}
