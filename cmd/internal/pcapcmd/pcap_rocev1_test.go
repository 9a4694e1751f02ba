package pcapcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// TestPcapCheckRoCEv1: RoCE v1 frames (EtherType 0x8915, also behind a
// VLAN tag) are named and counted apart; they were counted among the
// "other frames skipped" without a word, so a RoCE v1 capture read as one
// without RoCE.
func TestPcapCheckRoCEv1(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	eth := samples[4].Frame
	// RoCE v1: the Ethernet header, a GRH (40 bytes, IPv6-like) and the
	// BTH onward (the RoCEv2 frame's UDP payload).
	v1 := append(append([]byte(nil), eth[:12]...), 0x89, 0x15)
	grh := make([]byte, 40)
	grh[0], grh[6], grh[7] = 0x60, 0x1b, 64
	v1 = append(append(v1, grh...), eth[14+20+8:]...)
	tagged := append(append(append([]byte(nil), v1[:12]...), 0x81, 0x00, 0, 7), v1[12:]...)
	path := filepath.Join(t.TempDir(), "v1.pcap")
	if err := os.WriteFile(path, pcapFile(65535, 1, 0, v1, eth, tagged), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runIn(t, "pcap", "check", path)
	if code != cli.ExitOK {
		t.Errorf("exit %d, want 0\n%s%s", code, out, errOut)
	}
	for _, w := range []string{
		"#1 RoCE v1 frame (EtherType 0x8915): not RoCEv2, not checked",
		"#3 RoCE v1 frame (EtherType 0x8915): not RoCEv2, not checked",
		": 3 frames, 1 RoCEv2 (ICRC ok 1, bad 0), 0 other frames skipped, 2 RoCE v1 frames (EtherType 0x8915, not checked)",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
		}
	}
}
