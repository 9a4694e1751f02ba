//go:build linux

package share

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// die stops m as a killed process stops: no departure, its watch ended,
// its objects closed (its socket is the test's to close).
func (m *Member) die() {
	m.mu.Lock()
	if !m.closed {
		m.closed = true
		close(m.stop)
	}
	m.mu.Unlock()
	m.g.close()
}

// TestLivenessBySocket: a member is alive while its socket is in the
// array, whatever its PID says (a process in another PID namespace sees
// none of the others' PIDs: it took them all for dead and evicted them);
// once its socket closes (killed, or exec'd: close-on-exec) it goes to
// TimeWait, for its own TimeWait, not the sweeper's.
func TestLivenessBySocket(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	locks := t.TempDir()
	ap := netip.MustParseAddrPort("127.0.0.74:24791")
	a := join(t, ap, &Options{PinRoot: root, LockDir: locks, TimeWait: 30 * time.Second})
	b := join(t, ap, &Options{PinRoot: root, LockDir: locks, TimeWait: 10 * time.Millisecond})
	// A's PID as another PID namespace sees it: no such process.
	r := b.m.g.member(a.m.slot)
	r.PID, r.Start = 0x3ffffff0, 1
	if err := b.m.g.setMember(a.m.slot, r); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b.m.g.sweep(now, 10*time.Millisecond)
	if got := b.m.g.member(a.m.slot); got.State != stateLive {
		t.Fatalf("a member whose PID the sweeper cannot see, socket open: state %d, want live", got.State)
	}
	// A dies: its socket closes and leaves the array.
	slot := a.m.slot
	a.m.die()
	a.m = nil
	unix.Close(a.fd)
	a.fd = -1
	b.m.g.sweep(now, 10*time.Millisecond)
	got := b.m.g.member(slot)
	if got.State != stateTimeWait {
		t.Fatalf("a member whose socket closed: state %d, want TimeWait", got.State)
	}
	if d := time.Unix(0, got.FreeAt).Sub(now); d < 29*time.Second || d > 31*time.Second {
		t.Fatalf("TimeWait of %v, want the dead member's own 30 s (the sweeper's is 10 ms)", d)
	}
}

// TestRejectorReplaced: when the rejector dies, a live volunteer takes over
// within about a second though nobody joins or leaves (each member looks
// at its group every watchEvery).
func TestRejectorReplaced(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	o := &Options{PinRoot: root, LockDir: t.TempDir(), TimeWait: time.Second}
	ap := netip.MustParseAddrPort("127.0.0.75:24791")
	a := join(t, ap, o)
	b := join(t, ap, o)
	if err := a.m.VolunteerRejector(); err != nil {
		t.Fatal(err)
	}
	if err := b.m.VolunteerRejector(); err != nil {
		t.Fatal(err)
	}
	rejector := func() uint32 {
		var rej uint32
		b.m.g.cfg.Lookup(uint32(cfgRejector), &rej)
		return rej
	}
	if rejector() != uint32(a.m.slot)+1 {
		t.Fatalf("rejector %d, want the first volunteer (slot %d)", rejector(), a.m.slot)
	}
	a.m.die()
	a.m = nil
	unix.Close(a.fd)
	a.fd = -1
	for i := 0; rejector() != uint32(b.m.slot)+1; i++ {
		if i == 100 {
			t.Fatalf("rejector %d 10 s after the first one died, want slot %d", rejector(), b.m.slot)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNoSecondGroup: a process that would found a group on an address
// whose sockets it cannot see a group of (here a plain socket; in life a
// group pinned in another bpffs, or of another version) fails with
// ErrAddrInUse: its program would have replaced theirs and dropped their
// packets. The lock file goes with a removed group.
func TestNoSecondGroup(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	locks := t.TempDir()
	ap := netip.MustParseAddrPort("127.0.0.76:24791")
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		t.Fatal(err)
	}
	if n, err := boundSockets(ap); err != nil || n != 1 {
		t.Fatalf("boundSockets = %d, %v; want 1", n, err)
	}
	if n, err := boundSockets(netip.MustParseAddrPort("127.0.0.77:24791")); err != nil || n != 0 {
		t.Fatalf("boundSockets of another address = %d, %v; want 0", n, err)
	}
	_, err = Join(ap, &Options{PinRoot: root, LockDir: locks}, func(int) (int, error) {
		t.Fatal("Join opened a socket")
		return -1, nil
	})
	if !errors.Is(err, ErrAddrInUse) || !errors.Is(err, unix.EADDRINUSE) || !strings.Contains(err.Error(), "1 socket(s) are bound to UDP 127.0.0.76:24791") {
		t.Fatalf("Join: %v", err)
	}
	// No group came of it: no lock file either (nor of a Remove where
	// no group is).
	if _, err := Remove(netip.MustParseAddrPort("127.0.0.78:24791"), root); err == nil {
		t.Fatal("Remove of an address without a group succeeded")
	}
	if ents, _ := os.ReadDir(locks); len(ents) != 0 {
		t.Fatalf("lock files left by a failed Join and a Remove of nothing: %v", ents)
	}
	unix.Close(fd)
	// Now the address is free: a group, then its removal with its lock file.
	s := join(t, ap, &Options{PinRoot: root, LockDir: locks, TimeWait: time.Millisecond})
	s.close()
	time.Sleep(10 * time.Millisecond)
	if n := Sweep(root, locks, time.Millisecond); n != 1 {
		t.Fatalf("Sweep unpinned %d groups, want 1", n)
	}
	if ents, _ := os.ReadDir(locks); len(ents) != 0 {
		t.Fatalf("lock files left: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(root, "rocev2", shareDir, groupKey(ap))); !os.IsNotExist(err) {
		t.Fatalf("group still pinned: %v", err)
	}
}
