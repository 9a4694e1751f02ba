package cmtools

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestUnreachableSaysWhy: rping, rdma-client and udaddy to an address
// with nothing on UDP 4791 fail at once (the kernel's ICMP port
// unreachable), each with its tool's event line and the same
// explanation naming the address. udaddy used to wait 16 s for its SIDR
// retries and then blame a missing connection manager.
func TestUnreachableSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		code  int
		event string // in the tool's output (stdout or stderr)
	}{
		{[]string{"rping", "-c", "-a", "127.0.0.3", "--bind", "127.0.0.2", "-p", cmPort(), "--timeout", "20s"},
			rpingExitFail, "cma event RDMA_CM_EVENT_UNREACHABLE, error -111\n"},
		{[]string{"rdma-client", "-s", "127.0.0.3", "--bind", "127.0.0.2", "-p", cmPort(), "--timeout", "20s"},
			255, "rdma_client: end -1\n"},
		{[]string{"udaddy", "-s", "127.0.0.3", "-b", "127.0.0.2", "--port", cmPort(), "--timeout", "20s"},
			-111 & 0xff, "udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: -111\n"},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			r := runCmd(t, ctx, tc.args...)
			d := time.Since(start)
			if r.code != tc.code || !strings.Contains(r.out+r.errOut, tc.event) ||
				!strings.Contains(r.errOut, "127.0.0.3:") || !strings.Contains(r.errOut, "unreachable: "+unreachableWhy) || d > 3*time.Second {
				t.Errorf("%v: exit %d after %v\n%s%s", tc.args, r.code, d, r.out, r.errOut)
			}
		})
	}
}
