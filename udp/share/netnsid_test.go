//go:build linux

package share

import (
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestGroupKeyNotReused creates network namespaces one after another, each
// gone before the next is made, and checks that no two get the same group
// key. The kernel reuses a dead namespace's inode number at once, so a key
// made of it named a new namespace after a dead one, whose pinned group the
// new one then joined (and `share remove` in it removed).
func TestGroupKeyNotReused(t *testing.T) {
	needRoot(t)
	ap := netip.MustParseAddrPort("127.0.0.1:4791")
	runtime.LockOSThread()
	// The thread's namespace changes below: never hand it back to Go.
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if !strings.HasPrefix(groupKey(ap), "c") {
		var u unix.Utsname
		unix.Uname(&u)
		msg := "no SO_NETNS_COOKIE on kernel " + unix.ByteSliceToString(u.Release[:]) +
			": group keys fall back to the namespace's inode number, which is reused"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPED LOUDLY: " + msg)
	}
	seen := map[string]int{}
	inos := map[uint64]bool{}
	reused := 0
	for i := 0; i < 8; i++ {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Fatalf("unshare: %v", err)
		}
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			t.Fatal(err)
		}
		if inos[st.Ino] {
			reused++
		}
		inos[st.Ino] = true
		k := groupKey(ap)
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			t.Fatalf("setns back: %v", err)
		}
		if j, dup := seen[k]; dup {
			t.Fatalf("namespace %d got the key %q of namespace %d, which is gone", i, k, j)
		}
		seen[k] = i
		// Let the kernel's cleanup free the namespace (and its inode number).
		time.Sleep(50 * time.Millisecond)
	}
	if j, dup := seen[groupKey(ap)]; dup {
		t.Fatalf("the test's own namespace has the key of namespace %d", j)
	}
	t.Logf("%d namespaces, %d of them with a dead one's inode number; %d distinct keys", 8, reused, len(seen))
}
