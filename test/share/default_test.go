//go:build linux

package share_test

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

// TestDefaultShares: with the default options a second link on the same
// address joins the group (today's code: EADDRINUSE); ShareOff opts out
// (and cannot join a group).
func TestDefaultShares(t *testing.T) {
	needRoot(t)
	a := testAddrs(14)
	addr, other := a[12], a[13]
	t.Cleanup(func() { share.Remove(netip.AddrPortFrom(addr, udp.Port), "") })
	l1, err := udp.ListenSocket(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Close()
	l2, err := udp.ListenSocket(addr, nil)
	if err != nil {
		t.Fatalf("second default link on %v: %v", addr, err)
	}
	defer l2.Close()
	if !l1.Shared() || !l2.Shared() || l1.ShareStats().Slot == l2.ShareStats().Slot {
		t.Errorf("shared %v %v, slots %d %d", l1.Shared(), l2.Shared(), l1.ShareStats().Slot, l2.ShareStats().Slot)
	}
	if _, err := udp.ListenSocket(addr, &udp.SocketOptions{Share: udp.ShareOff}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("ShareOff on a shared address: %v, want EADDRINUSE", err)
	}
	l3, err := udp.ListenSocket(other, &udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Close()
	if l3.Shared() {
		t.Error("ShareOff link reports Shared")
	}
	if _, err := udp.ListenSocket(other, nil); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("default link on an address held unshared: %v, want EADDRINUSE", err)
	}
}
