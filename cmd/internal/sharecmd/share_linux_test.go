//go:build linux

package sharecmd

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

// TestShareStatus: `rocev2d share status ADDR` lists the members of the
// group, their QPN ranges and listeners, and the drop counters.
func TestShareStatus(t *testing.T) {
	if code, _, _ := runIn(t, "share"); code != cli.ExitUsage {
		t.Errorf("share without arguments: exit %d", code)
	}
	if code, _, _ := runIn(t, "share", "status", "not-an-address"); code != cli.ExitUsage {
		t.Errorf("share status with a bad address: exit %d", code)
	}
	// What is wrong is said before the usage text (it was the usage
	// alone, or Go's ParseAddr("localhost"): unable to parse IP).
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"share"}, "rocev2d share: missing subcommand (status or remove)\n"},
		{[]string{"share", "stat", "127.0.0.1"}, `rocev2d share: unknown subcommand "stat"`},
		{[]string{"share", "status"}, "rocev2d share: missing ADDR\n"},
		{[]string{"share", "status", "127.0.0.1", "x"}, `rocev2d share: unexpected argument "x" after ADDR`},
		{[]string{"share", "status", "localhost"}, `rocev2d share: ADDR "localhost": not an IP address`},
		{[]string{"share", "remove", "[::1]:4791"}, "give the address alone (RoCEv2 always uses UDP port 4791)"},
	} {
		if code, _, errOut := runIn(t, tc.args...); code != cli.ExitUsage || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%q: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.msg)
		}
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("sharing needs root (CI=true: not skipping)")
		}
		t.Skip("SKIPPED LOUDLY: sharing an address needs root")
	}
	id := os.Getpid()
	addr := netip.AddrFrom4([4]byte{127, 97, byte(id >> 8), byte(id)})
	t.Cleanup(func() { share.Remove(netip.AddrPortFrom(addr, udp.Port), "") })
	if code, _, _ := runIn(t, "share", "status", addr.String()); code != cli.ExitFail {
		t.Errorf("status of an address nobody shares: exit %d, want %d", code, cli.ExitFail)
	}
	var links []*udp.SocketLink
	for range 2 {
		l, err := udp.ListenSocket(addr, &udp.SocketOptions{Share: udp.ShareOn})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		links = append(links, l)
	}
	first, _, err := links[1].LeaseQPNs()
	if err != nil {
		t.Fatal(err)
	}
	if err := links[0].ClaimService(cm.ServiceID(cm.PSTCP, 7174)); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runIn(t, "share", "status", addr.String())
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if code, _, _ := runIn(t, "share", "remove", addr.String()); code != cli.ExitFail {
		t.Errorf("remove with live members: exit %d, want %d", code, cli.ExitFail)
	}
	for _, want := range []string{"2 member(s)", fmt.Sprintf("pid %d", id), "live", "listens rdma_cm TCP port 7174", fmt.Sprintf("QPNs %#06x", first), "unowned QPN 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	for _, l := range links {
		l.Close()
	}
	// Members that closed are in TimeWait, not live: remove unpins.
	if code, out, errOut := runIn(t, "share", "remove", addr.String()); code != cli.ExitOK {
		t.Errorf("remove after the members closed: exit %d %s %s", code, out, errOut)
	}
	if code, _, _ := runIn(t, "share", "status", addr.String()); code != cli.ExitFail {
		t.Errorf("status after remove: exit %d, want %d", code, cli.ExitFail)
	}
}
