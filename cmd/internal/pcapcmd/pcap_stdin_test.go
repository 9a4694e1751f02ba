package pcapcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// TestPcapCheckStdinAndDirectory: "-" reads the capture from the standard
// input (tcpdump -w - | rocev2d pcap check -; it was "open -: no such file
// or directory"), and a directory is named as one (it was "header: read
// DIR: is a directory (the file is shorter than a pcap header)").
func TestPcapCheckStdinAndDirectory(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	saved := stdin
	t.Cleanup(func() { stdin = saved })
	stdin = bytes.NewReader(pcapFile(65535, 1, 0, samples[4].Frame, samples[5].Frame))
	code, out, errOut := runIn(t, "pcap", "check", "-q", "-")
	if code != cli.ExitOK || !strings.Contains(out, "-: 2 frames, 2 RoCEv2 (ICRC ok 2, bad 0)") {
		t.Errorf("pcap check -: exit %d, want 0 and the frames read\n%s%s", code, out, errOut)
	}
	dir := t.TempDir()
	code, out, errOut = runIn(t, "pcap", "check", dir)
	if code != cli.ExitUsage || !strings.Contains(errOut, "is a directory") || strings.Contains(errOut, "shorter than a pcap header") {
		t.Errorf("pcap check DIR: exit %d, want %d and \"is a directory\" alone\n%s%s", code, cli.ExitUsage, out, errOut)
	}
}
