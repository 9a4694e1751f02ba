//go:build linux

package cpudist

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRoundTripLeavesAffinity: the calling thread keeps its CPU mask (the
// pinned threads are the measurement's own and exit with it), so that the
// goroutines Go runs on it later are not pinned to one CPU.
func TestRoundTripLeavesAffinity(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	if before.Count() < 2 || runtime.GOMAXPROCS(0) < 2 {
		t.Skipf("needs two CPUs: affinity has %d, GOMAXPROCS %d", before.Count(), runtime.GOMAXPROCS(0))
	}
	d, ok := RoundTrip()
	if !ok {
		t.Fatal("RoundTrip failed with two CPUs")
	}
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("affinity after RoundTrip %v, before %v", after, before)
	}
	t.Logf("cache-line round trip %v", d)
}
