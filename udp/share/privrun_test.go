//go:build linux

package share

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/internal/netns"
	"golang.org/x/sys/unix"
)

// TestPrivateLockDirs: processes that share a network namespace but not
// /run (containers on the host's network, each with its own /run) each
// lock a file of their own, so the lock file alone did not serialize
// them: two members joining at the same moment could take the same slot
// (the one whose socket was replaced then taken for dead) and two leasing
// at once the same QPN range. The address's lock also holds a name in
// the network namespace's abstract socket space, which every process of
// the namespace sees; members that never share a lock directory here
// must still get distinct slots and ranges.
func TestPrivateLockDirs(t *testing.T) {
	needRoot(t)
	ap := netip.MustParseAddrPort("127.0.0.63:24791")
	if ok, err := Remove(ap, ""); err == nil && !ok {
		t.Fatal("a live group holds the test's address")
	}
	t.Cleanup(func() { Remove(ap, "") })
	const members, rounds = 8, 6
	for round := range rounds {
		socks := make([]*testSock, members)
		errs := make([]error, members)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range members {
			dir := t.TempDir() // a /run of its own
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				socks[i], errs[i] = tryJoin(ap, &Options{LockDir: dir})
			}()
		}
		close(start)
		wg.Wait()
		t.Cleanup(func() {
			for _, s := range socks {
				if s != nil {
					s.close()
				}
			}
		})
		slots := map[int]int{}
		for i, s := range socks {
			if errs[i] != nil {
				t.Fatalf("round %d: member %d: %v", round, i, errs[i])
			}
			if j, dup := slots[s.m.Slot()]; dup {
				t.Fatalf("round %d: members %d and %d both took slot %d", round, j, i, s.m.Slot())
			}
			slots[s.m.Slot()] = i
		}
		firsts := make([]uint32, members)
		for i, s := range socks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				first, _, err := s.m.LeaseQPNs()
				firsts[i], errs[i] = first, err
			}()
		}
		wg.Wait()
		ranges := map[uint32]int{}
		for i := range socks {
			if errs[i] != nil {
				t.Fatalf("round %d: lease of member %d: %v", round, i, errs[i])
			}
			if j, dup := ranges[firsts[i]]; dup {
				t.Fatalf("round %d: members %d and %d both leased QPNs from %#x", round, j, i, firsts[i])
			}
			ranges[firsts[i]] = i
		}
		for _, s := range socks {
			if !s.m.g.alive(s.m.Slot(), s.m.g.member(s.m.Slot())) {
				t.Fatalf("round %d: member in slot %d taken for dead", round, s.m.Slot())
			}
		}
		for _, s := range socks {
			s.close()
		}
	}
}

// TestAbstractLockWaitBounded: the namespace's lock name held by another
// socket makes lockAddr wait at most LockWait and fail with
// ErrLockTimeout naming the name and its holder; tryLockAddr does not
// take it; released (the holder's socket closed, as when it dies), it is
// taken at once.
func TestAbstractLockWaitBounded(t *testing.T) {
	key := fmt.Sprintf("test_%d_%d", os.Getpid(), time.Now().UnixNano())
	holder, _, err := tryAbstract(key, nil)
	if err != nil || holder < 0 {
		t.Fatalf("taking the free name: socket %d, %v", holder, err)
	}
	path := filepath.Join(t.TempDir(), "addr.lock")
	old := LockWait
	LockWait = 200 * time.Millisecond
	defer func() { LockWait = old }()
	if l, err := tryLockAddr(path, key, nil); l != nil || err != nil {
		l.Close()
		t.Fatalf("tryLockAddr took a held name: %v", err)
	}
	t0 := time.Now()
	l, err := lockAddr(path, key, nil)
	if err == nil {
		l.Close()
		unix.Close(holder)
		t.Fatal("lockAddr took a name another socket holds")
	}
	if !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("error %v, want ErrLockTimeout", err)
	}
	if el := time.Since(t0); el < LockWait {
		t.Errorf("gave up after %v, want at least %v", el, LockWait)
	}
	if !strings.Contains(err.Error(), abstractLockName(key)) || !strings.Contains(err.Error(), "process "+strconv.Itoa(os.Getpid())) {
		t.Errorf("error %q does not name the lock and its holder (process %d)", err, os.Getpid())
	}
	// The lock file was let go with the failure.
	if f, err := tryFlock(path); err != nil || f == nil {
		t.Fatalf("lock file still held after the timeout (%v)", err)
	} else {
		f.Close()
	}
	unix.Close(holder)
	t0 = time.Now()
	l, err = lockAddr(path, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el > time.Second {
		t.Errorf("free lock took %v", el)
	}
	// Held by l now: a second taker waits.
	if l2, err := tryLockAddr(path+"2", key, nil); l2 != nil || err != nil {
		l2.Close()
		t.Fatalf("a second lock of the name with another lock file: %v", err)
	}
	l.Close()
}

// TestNetnsRunner: the runner a member keeps runs its function in the
// network namespace it was made in, also when called from a thread of
// another one (the abstract lock's socket must be made there).
func TestNetnsRunner(t *testing.T) {
	needRoot(t)
	ns := netns.TestNew(t, "rocev2-sharelock")
	var run func(func() error) error
	var f *os.File
	var want unix.Stat_t
	if err := netns.Do(ns, func() error {
		run, f = netnsRunner()
		return unix.Stat("/proc/thread-self/ns/net", &want)
	}); err != nil {
		t.Fatal(err)
	}
	if run == nil {
		t.Fatal("no runner")
	}
	defer f.Close()
	var got unix.Stat_t
	if err := run(func() error { return unix.Stat("/proc/thread-self/ns/net", &got) }); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino {
		t.Fatalf("ran in namespace %d, want %d (the runner's)", got.Ino, want.Ino)
	}
	var mine unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &mine); err == nil && mine.Ino == want.Ino {
		t.Fatal("the test's own thread is in the runner's namespace: the test shows nothing")
	}
}
