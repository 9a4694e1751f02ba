//go:build unix

package pcapcmd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// TestPcapCheckCutInUDPHeader: a snap length that keeps the UDP
// destination port but not the whole UDP header (38 to 41 bytes of an
// Ethernet/IPv4 frame, 58 to 61 of an IPv6 one) leaves a truncated RoCEv2
// packet, named with its ports. Before, 38 and 39 bytes made it one of the
// "other frames skipped" and 40 and 41 a RoCEv2 packet "0 > 0 ... inside
// the BTH" (ports of a UDP header gopacket did not have).
func TestPcapCheckCutInUDPHeader(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	eth := samples[4].Frame
	v6 := ethIPv6(roceIPv6(t, 64))
	frames := []cutFrame{{eth, 38}, {eth, 40}, {eth, 41}, {v6, 58}, {v6, 61}, {eth, 36}}
	path := filepath.Join(t.TempDir(), "cut.pcap")
	writeCut(t, path, frames)
	code, out, errOut := runIn(t, "pcap", "check", path)
	if code != cli.ExitOK {
		t.Errorf("exit %d, want 0\n%s%s", code, out, errOut)
	}
	for _, w := range []string{
		"#1 192.0.2.1:49173 > 192.0.2.2:4791 truncated by the capture (38 of ",
		"#2 192.0.2.1:49173 > 192.0.2.2:4791 truncated by the capture (40 of ",
		"#3 192.0.2.1:49173 > 192.0.2.2:4791 truncated by the capture (41 of ",
		"#4 [2001:db8::1]:49169 > [2001:db8::2]:4791 truncated by the capture (58 of ",
		"#5 [2001:db8::1]:49169 > [2001:db8::2]:4791 truncated by the capture (61 of ",
		"bytes, inside the UDP header): ICRC not checked",
		// 36 bytes end inside the source port: nothing tells RoCEv2.
		": 6 frames, 5 RoCEv2 (ICRC ok 0, bad 0), 1 other frames skipped, 5 truncated by the capture",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
		}
	}
	if strings.Contains(out, ":0 >") {
		t.Errorf("ports shown as 0:\n%s", out)
	}
}
