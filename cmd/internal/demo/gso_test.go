//go:build unix

package demo

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestDemoGSO runs the demo over UDP sockets with --gso and checks its
// capture: every case passes and every ICRC verifies.
func TestDemoGSO(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a few MB over loopback sockets")
	}
	file := filepath.Join(t.TempDir(), "demo-gso.pcap")
	code, out, errOut := runInRetry(t, "demo", "--gso", "--pcap", file)
	if code != cli.ExitOK || !strings.Contains(out, "PASS: all 27 cases checked byte for byte") {
		t.Fatalf("demo --gso: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runIn(t, "pcap", "check", "-q", file)
	if code != cli.ExitOK || !strings.Contains(out, " 0 bad") || strings.Contains(out, " 0 RoCEv2 packets") {
		t.Fatalf("pcap check after demo --gso: exit %d\n%s%s", code, out, errOut)
	}
}

// TestDemoSocketOptions: demo builds its socket options from --gso and
// --busy-poll (it polls only when --busy-poll says so).
func TestDemoSocketOptions(t *testing.T) {
	const us7 = 7 * time.Microsecond
	d, err := parseDemoFlags([]string{"--gso", "--busy-poll", "7us"})
	if err != nil {
		t.Fatal(err)
	}
	if o := d.Sock.Options(true, 0); !o.GSO || o.BusyPoll != us7 {
		t.Errorf("demo --gso --busy-poll 7us: %+v", o)
	}
	d, err = parseDemoFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := d.Sock.Options(false, 0); o.BusyPoll != 0 {
		t.Errorf("demo without --busy-poll polls: %+v", o)
	}
}
