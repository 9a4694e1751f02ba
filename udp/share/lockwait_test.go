//go:build linux

package share

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLockWaitBounded: a lock file held by someone else (here another open
// file description of this process, as a stopped member's would be) makes
// flock give up after LockWait with ErrLockTimeout, naming the file and
// the holder's PID, instead of waiting forever; once released, it is
// taken at once. Before, a join behind a SIGSTOPped member hung for good.
func TestLockWaitBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "addr.lock")
	holder, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	old := LockWait
	LockWait = 200 * time.Millisecond
	defer func() { LockWait = old }()
	t0 := time.Now()
	f, err := flock(path)
	if err == nil {
		f.Close()
		t.Fatal("flock took a lock another file description holds")
	}
	if !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("error %v, want ErrLockTimeout", err)
	}
	if el := time.Since(t0); el < LockWait || el > LockWait+5*time.Second {
		t.Errorf("gave up after %v, want about %v", el, LockWait)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the lock file", err)
	}
	if pid := strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), "process "+pid) {
		t.Errorf("error %q does not name the holder, process %s", err, pid)
	}
	// Released: taken at once.
	unix.Flock(int(holder.Fd()), unix.LOCK_UN)
	t0 = time.Now()
	f, err = flock(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if el := time.Since(t0); el > time.Second {
		t.Errorf("free lock took %v", el)
	}
}

// TestSweepLocks: Sweep removes lock files whose group is not pinned in
// the bpffs it sees and that nobody holds (those of groups made under
// `ip netns exec`, whose private bpffs went with the command, piled up by
// the thousand), and keeps a held one and one whose group is pinned.
func TestSweepLocks(t *testing.T) {
	base, lockDir := t.TempDir(), t.TempDir()
	mk := func(name string) string {
		p := filepath.Join(lockDir, name+".lock")
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stale := mk("c1234_192.0.2.1_4791")
	held := mk("c1235_192.0.2.1_4791")
	pinned := mk("c1236_192.0.2.1_4791")
	other := filepath.Join(lockDir, "notalock")
	os.WriteFile(other, nil, 0o644)
	if err := os.Mkdir(filepath.Join(base, "c1236_192.0.2.1_4791"), 0o755); err != nil {
		t.Fatal(err)
	}
	h, err := os.OpenFile(held, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := unix.Flock(int(h.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	sweepLocks(base, lockDir)
	for _, c := range []struct {
		path string
		want bool
	}{{stale, false}, {held, true}, {pinned, true}, {other, true}} {
		_, err := os.Stat(c.path)
		if got := err == nil; got != c.want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(c.path), got, c.want)
		}
	}
}
