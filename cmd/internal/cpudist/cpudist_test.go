package cpudist

import (
	"runtime"
	"testing"
	"time"
)

func TestWatchMergeApart(t *testing.T) {
	ns := func(n int) time.Duration { return time.Duration(n) }
	var w Watch
	if w.Apart(ns(50)) {
		t.Fatal("an empty watch is apart")
	}
	for _, d := range []int{60, 51, 83} {
		w.add(ns(d))
	}
	if w.N != 3 || w.Min != ns(51) || w.Max != ns(83) {
		t.Fatalf("after 60, 51, 83: %+v", w)
	}
	var o Watch
	o.add(ns(310))
	o.add(ns(290))
	all := w
	all.Merge(o)
	all.Merge(Watch{})
	if all.N != 5 || all.Min != ns(51) || all.Max != ns(310) {
		t.Fatalf("merged: %+v", all)
	}
	for _, tc := range []struct {
		w    Watch
		best time.Duration
		want bool
	}{
		{w, all.Min, false},       // 83 < 2*51
		{o, all.Min, true},        // 310 >= 102
		{w, ns(41), true},         // 83 >= 82
		{w, 0, false},             // no best: nothing to compare with
		{Watch{}, all.Min, false}, // no samples
		{all, all.Min, true},      // the merge keeps the slowest
		{Watch{N: 1, Min: ns(100), Max: ns(199)}, ns(100), false},
	} {
		if got := tc.w.Apart(tc.best); got != tc.want {
			t.Errorf("%+v.Apart(%v) = %v, want %v", tc.w, tc.best, got, tc.want)
		}
	}
}

func TestWatchSample(t *testing.T) {
	var w Watch
	if runtime.GOOS != "linux" || runtime.GOMAXPROCS(0) < 2 || runtime.NumCPU() < 2 {
		w.Sample()
		if w.N != 0 {
			t.Fatalf("sampled %d times without two CPUs to pin", w.N)
		}
		t.Skipf("RoundTrip needs Linux and two CPUs (GOOS %s, GOMAXPROCS %d, NumCPU %d)", runtime.GOOS, runtime.GOMAXPROCS(0), runtime.NumCPU())
	}
	// A sample is missing when the partner thread was not running for
	// 2^24 spins (a loaded machine: other tests' processes); three of
	// at most 50 tries must succeed.
	for i := 0; i < 50 && w.N < 3; i++ {
		w.Sample()
	}
	if w.N != 3 {
		t.Fatalf("%d samples in 50 tries, want 3", w.N)
	}
	if w.Min <= 0 || w.Max < w.Min || w.Max > 100*time.Microsecond {
		t.Fatalf("cache-line round trip %v-%v: not a plausible measurement", w.Min, w.Max)
	}
}
