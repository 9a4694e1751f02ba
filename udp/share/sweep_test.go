//go:build linux

package share

import (
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSweep: a group whose only member died without leaving (its record
// names a process that has exited, its socket is closed) is put in
// TimeWait by one sweep and unpinned by the next once TimeWait has passed;
// a group with a live member, and a group whose lock another process
// holds, stay pinned. Before, such groups stayed pinned until reboot.
func TestSweep(t *testing.T) {
	needRoot(t)
	root := t.TempDir() // a bpffs of the test's own (Join mounts it)
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	locks := t.TempDir()
	const tw = 50 * time.Millisecond
	o := &Options{PinRoot: root, LockDir: locks, TimeWait: tw}
	dead := netip.MustParseAddrPort("127.0.0.71:24791")
	live := netip.MustParseAddrPort("127.0.0.72:24791")
	held := netip.MustParseAddrPort("127.0.0.73:24791")

	// A process that has exited: its PID and start time match nothing.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	gone := uint32(cmd.Process.Pid)
	kill := func(s *testSock) {
		r := s.m.g.member(s.m.slot)
		r.PID, r.Start = gone, 12345
		if err := s.m.g.setMember(s.m.slot, r); err != nil {
			t.Fatal(err)
		}
		s.m.die() // as the kernel closes a killed process's objects
		s.m = nil
		unix.Close(s.fd)
		s.fd = -1
	}
	kill(join(t, dead, o))
	join(t, live, o)
	kill(join(t, held, o))
	pinned := func(ap netip.AddrPort) bool {
		_, err := os.Stat(dirName(root, ap))
		return err == nil
	}
	for _, ap := range []netip.AddrPort{dead, live, held} {
		if !pinned(ap) {
			t.Fatalf("%v: no group pinned after join", ap)
		}
	}
	lf, err := flock(lockName(locks, held))
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()

	if n := Sweep(root, locks, tw); n != 0 || !pinned(dead) {
		t.Fatalf("first sweep unpinned %d groups (dead member just found: TimeWait first)", n)
	}
	time.Sleep(2 * tw)
	if n := Sweep(root, locks, tw); n != 1 {
		t.Errorf("second sweep unpinned %d groups, want 1", n)
	}
	if pinned(dead) {
		t.Error("the dead member's group is still pinned after its TimeWait")
	}
	if !pinned(live) {
		t.Error("the live member's group was unpinned")
	}
	if !pinned(held) {
		t.Error("a group whose lock another process holds was unpinned")
	}
	lf.Close()
	Sweep(root, locks, tw)
	time.Sleep(2 * tw)
	if n := Sweep(root, locks, tw); pinned(held) {
		t.Errorf("the released group is still pinned (%d unpinned)", n)
	}
	// The address can be joined again afterwards: a fresh group.
	s := join(t, dead, o)
	if s.m.Slot() != 0 {
		t.Errorf("slot %d in the fresh group, want 0", s.m.Slot())
	}
}
