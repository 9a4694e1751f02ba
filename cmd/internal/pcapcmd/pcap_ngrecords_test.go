package pcapcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// TestPcapCheckPcapngNumbering: a systemd Journal Export Block and Custom
// Blocks take a frame number in Wireshark (tshark lists them as frames), so
// the packets after them keep Wireshark's numbers; they were not counted
// and every later packet's number was smaller than Wireshark's.
func TestPcapCheckPcapngNumbering(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	eth := samples[4].Frame
	bad := append([]byte(nil), eth...)
	bad[len(bad)-1] ^= 1
	pen := []byte{0xd9, 0x7e, 0, 0, 'x'} // PEN 32473 (documentation), data
	file := bytes.Join([][]byte{shbBlock(0), idbBlock(1), epbBlock(0, eth),
		ngBlock(9, []byte("MESSAGE=hi\n\n")), epbBlock(0, bad),
		ngBlock(0xbad, pen), ngBlock(4, []byte{0, 0, 0, 0}), ngBlock(0x40000bad, pen), epbBlock(0, eth)}, nil)
	path := filepath.Join(t.TempDir(), "records.pcapng")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runIn(t, "pcap", "check", path)
	if code != cli.ExitFail {
		t.Errorf("exit %d, want %d\n%s%s", code, cli.ExitFail, out, errOut)
	}
	for _, w := range []string{"records.pcapng #1 192.0.2.", "records.pcapng #3 192.0.2.", "records.pcapng #6 192.0.2.",
		": 3 frames, 3 RoCEv2 (ICRC ok 2, bad 1), 0 other frames skipped", "records.pcapng #3: ICRC mismatch"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
		}
	}
}
