//go:build unix

package perftest

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// TestPerfTClass: --tclass puts the traffic class in the IP TOS byte of
// every packet of the test QPs, both directions (each side sets it on its
// own QP); -S is taken (0..15) and changes nothing on the wire; both are
// range-checked naming the flag.
func TestPerfTClass(t *testing.T) {
	for _, b := range []struct {
		args []string
		want string
	}{
		{[]string{"--tclass", "256"}, "--tclass 256: traffic class must be between 0 and 255"},
		{[]string{"--tclass=-1"}, "--tclass -1: traffic class must be between 0 and 255"},
		{[]string{"--tclass", "32", "-R", "--bind", "127.0.0.1"}, "--tclass 32 with -R"},
		{[]string{"-S", "16"}, "-S 16: service level must be between 0 and 15"},
		{[]string{"-T", "32"}, "-T: perftest's type of service of rdma_cm QPs"},
	} {
		code, _, e := runIn(t, append([]string{"write-bw"}, b.args...)...)
		if code != 2 || !strings.Contains(e, b.want) {
			t.Errorf("write-bw %v: exit %d, stderr %q, want exit 2 with %q", b.args, code, e, b.want)
		}
	}
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	for _, tc := range []struct {
		args []string
		tos  uint8
	}{
		{[]string{"--tclass", "104", "-S", "3"}, 104}, // DSCP 26 (AF31)
		{[]string{"-S", "3"}, 0},
	} {
		file := filepath.Join(t.TempDir(), "tc.pcap")
		srv, cli := runPerfPairExtra(t, "write-bw", append([]string{"-n", "20", "-s", "2048"}, tc.args...), []string{"--pcap", file})
		mustPass(t, srv, cli)
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		r, err := pcapgo.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		n, fromSrv := 0, 0
		for {
			data, _, err := r.ReadPacketData()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			p := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
			ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			if !ok {
				t.Fatalf("packet %d has no IPv4 header", n)
			}
			if ip.TOS&^3 != tc.tos {
				t.Errorf("%v: packet %d %v -> %v: TOS %#x, want DSCP/traffic class %#x", tc.args, n, ip.SrcIP, ip.DstIP, ip.TOS, tc.tos)
			}
			if ip.SrcIP.String() == "127.0.0.2" {
				fromSrv++
			}
			n++
		}
		f.Close()
		if n < 40+1 || fromSrv == 0 {
			t.Errorf("%v: capture holds %d packets, %d from the server; want the 40 WRITEs and ACKs", tc.args, n, fromSrv)
		}
	}
}
