//go:build linux

package udp

import (
	"errors"
	"net/netip"
	"os"
	"syscall"
	"testing"
)

// Test helpers shared by the Linux socket tests (SocketLink, RawLink).

// Loopback addresses for socket tests. Linux routes all of 127.0.0.0/8 to
// lo, so two links can both bind port 4791. The pair is derived from the
// process ID, which keeps these tests clear of the 127.0.0.0/16 users
// (cmd/rocev2d runs on 127.0.0.1 and 127.0.0.2) and of a concurrent run of
// this package (see TestLoopbackPair).
var sockA, sockB = testLoopbackPair(os.Getpid())

// testLoopbackPair maps a process ID to 127.b1.b2.1 and 127.b1.b2.2 with b1
// in [40, 240) and b2 in [1, 251): distinct for process IDs that differ by
// less than 50000.
func testLoopbackPair(pid int) (netip.Addr, netip.Addr) {
	b1, b2 := byte(40+pid%200), byte(1+(pid/200)%250)
	return netip.AddrFrom4([4]byte{127, b1, b2, 1}), netip.AddrFrom4([4]byte{127, b1, b2, 2})
}

// testLoopbackThird is a third address next to sockA and sockB.
func testLoopbackThird() netip.Addr {
	b := sockA.As4()
	b[3] = 3
	return netip.AddrFrom4(b)
}

// TestLoopbackPair: the pairs of any two PIDs below 50000 (pid_max is 32768
// by default) are disjoint, and none touches 127.0.0.0/16 (127.0.0.1 and
// 127.0.0.2 are cmd/rocev2d's) or a 127.x.0.0/24.
func TestLoopbackPair(t *testing.T) {
	owner := make(map[netip.Addr]int)
	for pid := range 50000 {
		a, b := testLoopbackPair(pid)
		for _, x := range []netip.Addr{a, b} {
			if x4 := x.As4(); x4[0] != 127 || x4[1] == 0 || x4[2] == 0 {
				t.Fatalf("pid %d: %v is not in 127.0.0.0/8 outside 127.0.0.0/16 and 127.x.0.0/24", pid, x)
			}
			if p, ok := owner[x]; ok {
				t.Fatalf("pids %d and %d share %v", p, pid, x)
			}
			owner[x] = pid
		}
	}
}

func listenPair(t testing.TB) (*SocketLink, *SocketLink) {
	t.Helper()
	return listenPairOpts(t, nil, nil)
}

func listenPairOpts(t testing.TB, oa, ob *SocketOptions) (*SocketLink, *SocketLink) {
	t.Helper()
	a, err := ListenSocket(sockA, oa)
	if err != nil {
		t.Fatalf("ListenSocket(%v): %v", sockA, err)
	}
	b, err := ListenSocket(sockB, ob)
	if err != nil {
		a.Close()
		t.Fatalf("ListenSocket(%v): %v", sockB, err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func listenRaw(t testing.TB, addr netip.Addr) *RawLink {
	t.Helper()
	l, err := ListenRaw(addr, nil)
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		t.Skipf("raw sockets need CAP_NET_RAW: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// listenLoopback6 opens a SocketLink on [::1], closed at cleanup. It
// skips (loudly when the port is taken) where that is not possible.
func listenLoopback6(t *testing.T, o *SocketOptions) *SocketLink {
	t.Helper()
	l, err := ListenSocket(netip.IPv6Loopback(), o)
	if err != nil {
		if errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT) {
			t.Skipf("no IPv6 loopback here: %v", err)
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			t.Skipf("SKIPPED: [::1]:4791 is in use (another run of these tests?): %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// forGRO runs test as subtests with a receiver without ("plain"+suffix)
// and with ("GRO"+suffix) UDP GRO.
func forGRO(t *testing.T, suffix string, test func(t *testing.T, receiver *SocketOptions)) {
	for _, gro := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "GRO"}[gro]+suffix, func(t *testing.T) {
			test(t, &SocketOptions{NoGRO: !gro})
		})
	}
}
