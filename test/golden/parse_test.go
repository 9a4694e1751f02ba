package golden

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestParseTxt checks that every golden .txt parses completely: every
// "## packets" line is understood and every tool output names its QPs.
func TestParseTxt(t *testing.T) {
	for _, p := range PCAPs(t) {
		txt := strings.TrimSuffix(p, ".pcap") + ".txt"
		c, err := ParseTxt(txt)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d packets, %d addrs, %d imm, server %v client %v", filepath.Base(txt), len(c.Packets), len(c.Addrs), len(c.SentImm), c.Server, c.Client)
		if !c.Server.IsValid() || !c.Client.IsValid() {
			t.Errorf("%s: server/client addresses missing", txt)
		}
	}
}
