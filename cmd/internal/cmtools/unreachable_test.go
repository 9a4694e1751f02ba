//go:build linux

package cmtools

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
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

// TestUnreachableSharedNoCM: an address shared (udp/share) by a process
// that runs no connection manager drops the REQ in the group's steering
// program, and the kernel answers ICMP port unreachable: rping's
// explanation must not claim that nothing listens on UDP 4791 there (it
// did: "nothing listens on UDP 4791 there (no RoCEv2 device)").
func TestUnreachableSharedNoCM(t *testing.T) {
	if err := share.CheckCapabilities(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI runs as root, where sharing must be possible: %v", err)
		}
		t.Skipf("SKIPPED: this process may not share UDP 4791: %v", err)
	}
	const addr = "127.0.0.84"
	l, err := udp.ListenSocket(netip.MustParseAddr(addr), &udp.SocketOptions{Share: udp.ShareOn})
	if err != nil {
		t.Skipf("cannot share %s:4791 for the test: %v", addr, err)
	}
	dev, err := transport.NewDevice(l, transport.DeviceConfig{}) // a member without a CM
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	r := runCmd(t, ctx, "rping", "-c", "-a", addr, "--bind", "127.0.0.2", "-p", cmPort(), "--timeout", "20s")
	d := time.Since(start)
	if r.code != rpingExitFail || !strings.Contains(r.errOut, addr+":") || d > 3*time.Second ||
		strings.Contains(r.errOut, "nothing listens") || !strings.Contains(r.errOut, "none there runs a connection manager") {
		t.Errorf("rping to a shared address without a CM: exit %d after %v\n%s%s", r.code, d, r.out, r.errOut)
	}
}
