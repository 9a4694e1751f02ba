//go:build linux

package rdmacm

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/internal/netns"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// A Dial to an on-link address where no host answers ARP: the kernel
// gives up on the neighbour (about 3 s) and reports ICMP host unreachable
// to the sending socket (IP_RECVERR); Dial ends then with ErrUnreachable
// (EHOSTUNREACH) naming the address, long before its 16 REQs (16 s) run
// out.
func TestDialHostUnreachableFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for ARP to fail (~3-4 s)")
	}
	p := netns.TestPair(t, netns.PairConfig{Prefix: "rdmacm-hu", IfPrefix: "hu",
		AddrA: netip.MustParseAddr("192.0.2.1"), AddrB: netip.MustParseAddr("192.0.2.2")})
	l := netns.MustGet(t, p.NsA, func() (*udp.SocketLink, error) {
		return udp.ListenSocket(p.AddrA, &udp.SocketOptions{Share: udp.ShareOff})
	})
	dev, err := transport.NewDevice(l, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	to := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.99"), 7500) // on-link, nobody there
	start := time.Now()
	_, err = Dial(ctxT(t, 30*time.Second), dev, to, nil) // default: 1 s response timeout, 15 retries
	el := time.Since(start)
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Fatalf("Dial to an absent on-link host after %v: %v, want ErrUnreachable (EHOSTUNREACH); link %+v", el, err, l.Stats())
	}
	if !strings.Contains(err.Error(), to.Addr().String()) {
		t.Errorf("error %q does not name %v", err, to.Addr())
	}
	if s := StatsOf(dev); s.Unreachable == 0 {
		t.Errorf("Unreachable not counted: %+v", s)
	}
	t.Logf("%v after %v", err, el)
}
