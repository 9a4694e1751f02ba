package transport

import (
	"testing"
	"time"
)

// stats returns how often q's clock timer fired and how many entries were
// found due since q first counted: the first call starts the counting
// (returning zeros), so a test calls it once before what it measures.
// Production queues never count (timerQueue.count stays nil).
func (q *timerQueue) stats() (fires, expiries uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.count == nil {
		q.count = new(timerStats)
	}
	return q.count.fires, q.count.expiries
}

// TestTimerQueueCountsOnlyWhenAsked: a queue keeps no statistics until a
// test asks for them (production queues carry a nil pointer and a nil
// check per run, no counters); once asked, runs and due entries are
// counted exactly.
func TestTimerQueueCountsOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		name              string
		entries           int // armed, all due at the same deadline
		rounds            int // arm all, advance past the deadline
		wantFires, wantEx uint64
	}{
		{"one entry once", 1, 1, 1, 1},
		{"three entries, one run each round", 3, 2, 2, 6},
		{"nothing armed", 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := NewManualClock(tqEpoch)
			var fired int
			q := newTimerQueue(clk, func(*timerEntry) { fired++ })
			ents := make([]timerEntry, tc.entries)
			for i := range ents {
				ents[i].init(nil, timerRetrans)
			}
			// Uncounted: a round before stats was asked leaves count nil.
			for i := range ents {
				q.arm(&ents[i], clk.Now(), time.Millisecond)
			}
			clk.Advance(2 * time.Millisecond)
			if q.count != nil {
				t.Fatal("a queue nobody asked counts")
			}
			if f, x := q.stats(); f != 0 || x != 0 {
				t.Fatalf("first stats = %d, %d; want 0, 0", f, x)
			}
			for r := 0; r < tc.rounds; r++ {
				for i := range ents {
					q.arm(&ents[i], clk.Now(), time.Millisecond)
				}
				clk.Advance(2 * time.Millisecond)
			}
			f, x := q.stats()
			if f != tc.wantFires || x != tc.wantEx {
				t.Fatalf("stats = %d fires, %d expiries; want %d, %d", f, x, tc.wantFires, tc.wantEx)
			}
			if want := tc.entries * (tc.rounds + 1); fired != want {
				t.Fatalf("fired %d entries, want %d", fired, want)
			}
		})
	}
}
