//go:build unix

package perftest

import (
	"net/netip"
	"strings"
	"testing"
)

// TestPerfMTUClamp: -m above what the interface holding the local address
// carries is lowered to it, as perftest lowers -m to the port's active
// MTU (rxe's: the interface's MTU less 80 bytes), with perftest's two
// lines and a line on stderr saying why. Both sides here believe they sit
// on a 1500-byte interface: they run path MTU 1024, where -m 4096 made
// every full packet fail on a real 1500-byte link ("transport retry
// counter exceeded", send_err).
func TestPerfMTUClamp(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	defer func(f func(netip.Addr) (string, int, bool)) { perfLinkOf = f }(perfLinkOf)
	perfLinkOf = func(netip.Addr) (string, int, bool) { return "eth9", 1500, true }
	srv, client := runPerfPairAt(t, mismatchSrv, mismatchCli, "write-bw", []string{"-n", "20", "-s", "8192", "-m", "4096", "--timeout", "20s"}, nil)
	mustPass(t, srv, client)
	for _, s := range []struct {
		side string
		o    perfOut
	}{{"server", srv}, {"client", client}} {
		if !strings.Contains(s.o.out, "Requested mtu is higher than active mtu \nChanging to active mtu - 3\n") || !strings.Contains(s.o.out, " Mtu             : 1024[B]") {
			t.Errorf("%s: stdout lacks perftest's lines or MTU 1024:\n%s", s.side, s.o.out)
		}
		if !strings.Contains(s.o.errOut, "-m 4096: eth9") || !strings.Contains(s.o.errOut, "has MTU 1500") || !strings.Contains(s.o.errOut, "running with 1024") {
			t.Errorf("%s: stderr %q", s.side, s.o.errOut)
		}
	}
	// An interface that carries -m leaves it alone.
	perfLinkOf = func(netip.Addr) (string, int, bool) { return "eth9", 9000, true }
	srv, client = runPerfPairAt(t, mismatchSrv, mismatchCli, "write-bw", []string{"-n", "20", "-s", "8192", "-m", "4096", "--timeout", "20s"}, nil)
	mustPass(t, srv, client)
	if strings.Contains(srv.out+client.out, "Changing to active mtu") || !strings.Contains(client.out, " Mtu             : 4096[B]") {
		t.Errorf("-m 4096 on a 9000-byte interface was changed:\n%s", client.out)
	}
}
