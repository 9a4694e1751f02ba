package bench

import (
	"bytes"
	"context"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// runIn runs `rocev2d bench args[1:]` (args[0] is "bench") in process and
// returns its exit status, stdout and stderr.
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	if len(args) == 0 || args[0] != "bench" {
		t.Fatalf("runIn %q: not a bench command line", args)
	}
	var stdout, stderr bytes.Buffer
	code := runBench(context.Background(), args[1:], &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// runInRetry is runIn, retried while UDP 4791 is taken by someone else
// (other tests of the repository use the loopback addresses).
func runInRetry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RetryBusy(func() (int, string, string) { return runIn(t, args...) })
}

// TestSocketOptions: bench's --gso forces GSO (no GSOAuto) and bench does
// not busy-poll unless told to.
func TestSocketOptions(t *testing.T) {
	b, err := parseBenchFlags([]string{"--gso"})
	if err != nil {
		t.Fatal(err)
	}
	if o := b.Sock.Options(true, 0); !o.GSO || o.GSOAuto || o.BusyPoll != 0 {
		t.Errorf("bench --gso: %+v", o)
	}
}
