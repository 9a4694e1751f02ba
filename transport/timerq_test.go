package transport

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var tqEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// tqHarness drives a timerQueue under a ManualClock against a reference
// model: the entries that should be pending, each with its deadline and
// arm sequence, kept as a slice sorted on demand.
type tqHarness struct {
	t     testing.TB
	clk   *ManualClock
	q     *timerQueue
	ents  []timerEntry // owner i's kind k is ents[i*numTimerKinds+k]
	fired []tqFire     // what the queue fired, in order
	// reference: deadline and arm order of every pending entry (ok=false: idle)
	ref    []tqRef
	refSeq uint64
	// onFire, when set, runs after an expiry is recorded (re-arms from
	// inside a firing, as a QP does).
	onFire func(i int)
	// eachFire checks every expiry against the reference's earliest entry
	// as it happens (O(entries) each: small harnesses), instead of the
	// whole Advance's expiries against a list computed before it (which
	// cannot know of re-arms from inside a firing).
	eachFire bool
}

// refMin returns the reference's earliest armed entry, or -1.
func (h *tqHarness) refMin() int {
	m := -1
	for i, r := range h.ref {
		if !r.ok {
			continue
		}
		if m < 0 || r.when.Before(h.ref[m].when) || (r.when.Equal(h.ref[m].when) && r.seq < h.ref[m].seq) {
			m = i
		}
	}
	return m
}

type tqFire struct {
	i   int
	at  time.Time
	due time.Time
}

type tqRef struct {
	ok   bool
	when time.Time
	seq  uint64
}

func newTQHarness(t testing.TB, owners int) *tqHarness {
	h := &tqHarness{t: t, clk: NewManualClock(tqEpoch)}
	h.ents = make([]timerEntry, owners*int(numTimerKinds))
	h.ref = make([]tqRef, len(h.ents))
	for i := range h.ents {
		h.ents[i].init(nil, timerKind(i%int(numTimerKinds)))
	}
	h.q = newTimerQueue(h.clk, func(e *timerEntry) {
		if !h.q.take(e) {
			return
		}
		i := h.index(e)
		now := h.clk.Now()
		if !h.ref[i].ok {
			t.Fatalf("entry %d fired, but it is not armed", i)
		}
		if h.eachFire {
			// It must be the reference's earliest entry (ties: arm order).
			if m := h.refMin(); m != i {
				t.Fatalf("entry %d (due %v seq %d) fired before entry %d (due %v seq %d)", i, h.ref[i].when.Sub(tqEpoch), h.ref[i].seq, m, h.ref[m].when.Sub(tqEpoch), h.ref[m].seq)
			}
			if !now.Equal(h.ref[i].when) {
				t.Fatalf("entry %d fired at %v, its deadline is %v", i, now.Sub(tqEpoch), h.ref[i].when.Sub(tqEpoch))
			}
		}
		h.fired = append(h.fired, tqFire{i: i, at: now, due: h.ref[i].when})
		h.ref[i].ok = false
		if h.onFire != nil {
			h.onFire(i)
		}
	})
	return h
}

func (h *tqHarness) index(e *timerEntry) int {
	for i := range h.ents {
		if &h.ents[i] == e {
			return i
		}
	}
	h.t.Fatalf("fire of an unknown entry")
	return -1
}

func (h *tqHarness) arm(i int, d time.Duration) {
	now := h.clk.Now()
	h.q.arm(&h.ents[i], now, d)
	h.refSeq++
	h.ref[i] = tqRef{ok: true, when: now.Add(d), seq: h.refSeq}
}

func (h *tqHarness) cancel(i int) {
	h.q.cancel(&h.ents[i])
	h.ref[i].ok = false
}

// expect returns, in firing order, the entries the reference says fire
// when the clock reaches end.
func (h *tqHarness) expect(end time.Time) []int {
	var due []int
	for i, r := range h.ref {
		if r.ok && !r.when.After(end) {
			due = append(due, i)
		}
	}
	slices.SortFunc(due, func(a, b int) int {
		if c := h.ref[a].when.Compare(h.ref[b].when); c != 0 {
			return c
		}
		if h.ref[a].seq < h.ref[b].seq {
			return -1
		}
		return 1
	})
	return due
}

// advance moves the clock by d and checks that exactly the expected
// entries fired, in order, each at its deadline.
func (h *tqHarness) advance(d time.Duration) {
	h.t.Helper()
	end := h.clk.Now().Add(d)
	var want []int
	if !h.eachFire {
		want = h.expect(end)
	}
	h.fired = h.fired[:0]
	h.clk.Advance(d)
	if !h.eachFire {
		h.check(want)
	}
	for _, f := range h.fired {
		if f.at.After(end) {
			h.t.Fatalf("entry %d fired at %v, after the Advance's end %v", f.i, f.at.Sub(tqEpoch), end.Sub(tqEpoch))
		}
	}
	for i, r := range h.ref {
		if r.ok && !r.when.After(end) {
			h.t.Fatalf("entry %d due %v not fired by %v", i, r.when.Sub(tqEpoch), end.Sub(tqEpoch))
		}
	}
}

func (h *tqHarness) check(want []int) {
	h.t.Helper()
	if len(h.fired) != len(want) {
		h.t.Fatalf("%d expiries, want %d", len(h.fired), len(want))
	}
	for k, f := range h.fired {
		if f.i != want[k] {
			h.t.Fatalf("expiry %d is entry %d, want %d", k, f.i, want[k])
		}
		if !f.at.Equal(f.due) {
			h.t.Fatalf("entry %d fired at %v, its deadline is %v", f.i, f.at.Sub(tqEpoch), f.due.Sub(tqEpoch))
		}
	}
}

// TestTimerQueueManyQPs: 10,000 QPs with both timers armed at mixed
// deadlines (many equal), some re-armed and some cancelled before they
// expire, the clock advanced in uneven steps: every expiry fires exactly
// once, at its deadline, within the Advance that reaches it, in deadline
// order with ties in arm order, and only one clock timer is ever pending.
func TestTimerQueueManyQPs(t *testing.T) {
	const qps = 10000
	tests := []struct {
		name   string
		spread time.Duration // deadlines in [1, spread] µs-grained
		grain  time.Duration
		step   time.Duration
		rearm  int // one in rearm entries is re-armed before it fires
		cancel int // one in cancel entries is cancelled
	}{
		{"distinct", 100 * time.Millisecond, time.Nanosecond, 7 * time.Millisecond, 0, 0},
		{"coarse ties", 100 * time.Millisecond, 10 * time.Millisecond, 3 * time.Millisecond, 0, 0},
		{"one deadline", time.Millisecond, time.Millisecond, 500 * time.Microsecond, 0, 0},
		{"rearm and cancel", 50 * time.Millisecond, 4096 * time.Nanosecond, 5 * time.Millisecond, 3, 5},
		{"step past all", 20 * time.Millisecond, time.Microsecond, time.Second, 4, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newTQHarness(t, qps)
			rng := rand.New(rand.NewPCG(1, uint64(tc.spread)))
			dl := func() time.Duration {
				return time.Duration(1+rng.Int64N(int64(tc.spread/tc.grain))) * tc.grain
			}
			for i := range h.ents {
				h.arm(i, dl())
			}
			if got := h.clk.Pending(); got != 1 {
				t.Fatalf("%d clock timers pending, want 1", got)
			}
			if got := h.q.pending(); got != len(h.ents) {
				t.Fatalf("queue holds %d, want %d", got, len(h.ents))
			}
			if tc.rearm > 0 {
				for i := 0; i < len(h.ents); i += tc.rearm {
					h.arm(i, dl())
				}
			}
			if tc.cancel > 0 {
				for i := 1; i < len(h.ents); i += tc.cancel {
					h.cancel(i)
				}
			}
			total := 0
			for steps := 0; h.q.pending() > 0; steps++ {
				if steps > 10000 {
					t.Fatal("queue not drained")
				}
				h.advance(tc.step)
				total += len(h.fired)
				if p := h.clk.Pending(); p > 1 {
					t.Fatalf("%d clock timers pending", p)
				}
			}
			want := len(h.ents)
			if tc.cancel > 0 {
				want -= (len(h.ents) + tc.cancel - 2) / tc.cancel
			}
			if total != want {
				t.Fatalf("%d expiries in all, want %d", total, want)
			}
			// Nothing more fires.
			h.advance(time.Hour)
			if len(h.fired) != 0 {
				t.Fatalf("%d expiries after the queue drained", len(h.fired))
			}
		})
	}
}

// TestTimerQueueRearmInFire: an entry re-armed from its own expiry (the
// lazy ACK timer finding its deadline moved) fires again within the same
// Advance when that deadline is reached, and not when it is not.
func TestTimerQueueRearmInFire(t *testing.T) {
	tests := []struct {
		name    string
		period  time.Duration
		advance time.Duration
		want    int
	}{
		{"ten periods", time.Millisecond, 10 * time.Millisecond, 10},
		{"just short", time.Millisecond, 10*time.Millisecond - 1, 9},
		{"none", time.Millisecond, time.Millisecond - 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newTQHarness(t, 3)
			h.eachFire = true
			h.onFire = func(i int) {
				if i == 0 {
					h.arm(0, tc.period)
				}
			}
			h.arm(0, tc.period)
			h.fired = nil
			h.clk.Advance(tc.advance)
			if len(h.fired) != tc.want {
				t.Fatalf("%d expiries, want %d", len(h.fired), tc.want)
			}
			for k, f := range h.fired {
				if want := tqEpoch.Add(time.Duration(k+1) * tc.period); !f.at.Equal(want) {
					t.Fatalf("expiry %d at %v, want %v", k, f.at.Sub(tqEpoch), want.Sub(tqEpoch))
				}
			}
		})
	}
}

// TestTimerQueueStaleExpiry: an entry found due and then re-armed or
// cancelled before its owner took it is not handled (take says no), and a
// re-armed one fires at its new deadline.
func TestTimerQueueStaleExpiry(t *testing.T) {
	clk := NewManualClock(tqEpoch)
	var e, other timerEntry
	e.init(nil, timerRetrans)
	other.init(nil, timerRNR)
	var q *timerQueue
	var log []string
	q = newTimerQueue(clk, func(x *timerEntry) {
		switch {
		case x == &other:
			// Runs first (armed first, same deadline): re-arms e, which
			// is already popped as due.
			if q.take(x) {
				log = append(log, "other")
				q.arm(&e, clk.Now(), time.Millisecond)
			}
		case x == &e:
			if q.take(x) {
				log = append(log, "e@"+clk.Now().Sub(tqEpoch).String())
			}
		}
	})
	q.arm(&other, tqEpoch, time.Millisecond)
	q.arm(&e, tqEpoch, time.Millisecond)
	clk.Advance(time.Millisecond)
	if want := []string{"other"}; !slices.Equal(log, want) {
		t.Fatalf("after 1ms: %q, want %q", log, want)
	}
	clk.Advance(time.Millisecond)
	if want := []string{"other", "e@2ms"}; !slices.Equal(log, want) {
		t.Fatalf("after 2ms: %q, want %q", log, want)
	}
	// Cancelled after being found due: not handled.
	q = newTimerQueue(clk, func(x *timerEntry) {
		if x == &other {
			q.take(x)
			q.cancel(&e)
			return
		}
		if q.take(x) {
			t.Fatal("a cancelled entry was handled")
		}
	})
	q.arm(&other, clk.Now(), time.Millisecond)
	q.arm(&e, clk.Now(), time.Millisecond)
	clk.Advance(time.Hour)
	if q.pending() != 0 {
		t.Fatalf("%d pending", q.pending())
	}
}

// TestTimerQueueClose: closing a queue with pending timers drops them and
// stops the clock timer; later arms are ignored.
func TestTimerQueueClose(t *testing.T) {
	h := newTQHarness(t, 1000)
	for i := range h.ents {
		h.arm(i, time.Duration(1+i)*time.Microsecond)
	}
	h.advance(100 * time.Microsecond)
	if len(h.fired) != 100 {
		t.Fatalf("%d fired before close, want 100", len(h.fired))
	}
	h.q.close()
	if h.q.pending() != 0 || h.clk.Pending() != 0 {
		t.Fatalf("after close: %d queued, %d clock timers", h.q.pending(), h.clk.Pending())
	}
	h.q.arm(&h.ents[0], h.clk.Now(), time.Microsecond)
	h.fired = h.fired[:0]
	h.clk.Advance(time.Hour)
	if len(h.fired) != 0 || h.q.pending() != 0 || h.clk.Pending() != 0 {
		t.Fatalf("after close and an arm: %d fired, %d queued, %d clock timers", len(h.fired), h.q.pending(), h.clk.Pending())
	}
}

// tqStepClock is a Clock with one timer that allocates nothing: step
// moves time to the timer's deadline and runs it.
type tqStepClock struct {
	now, at time.Time
	set     bool
	f       func()
}

func (c *tqStepClock) Now() time.Time { return c.now }
func (c *tqStepClock) AfterFunc(d time.Duration, f func()) Timer {
	c.f = f
	c.Reset(d)
	return c
}
func (c *tqStepClock) Reset(d time.Duration) bool {
	was := c.set
	c.at, c.set = c.now.Add(d), true
	return was
}
func (c *tqStepClock) Stop() bool {
	was := c.set
	c.set = false
	return was
}

// drain fires the timer until none is set; it returns how many times.
func (c *tqStepClock) drain() int {
	n := 0
	for c.set {
		c.now, c.set = c.at, false
		c.f()
		n++
	}
	return n
}

// TestTimerQueueNoAllocs: once the heap has room, arm, re-arm, cancel and
// firing allocate nothing.
func TestTimerQueueNoAllocs(t *testing.T) {
	clk := &tqStepClock{now: tqEpoch}
	ents := make([]timerEntry, 512)
	n := 0
	var q *timerQueue
	q = newTimerQueue(clk, func(e *timerEntry) {
		if q.take(e) {
			n++
		}
	})
	arm := func() {
		now := clk.Now()
		for i := range ents {
			q.arm(&ents[i], now, time.Duration(len(ents)-i)*time.Microsecond)
		}
		for i := 0; i < len(ents); i += 2 {
			q.arm(&ents[i], now, time.Duration(i+3)*time.Microsecond) // re-arm in place
		}
		for i := 1; i < len(ents); i += 4 {
			q.cancel(&ents[i])
		}
	}
	for i := range ents {
		ents[i].init(nil, timerRetrans)
	}
	arm()
	clk.drain() // the heap and the due list have grown
	n = 0
	allocs := testing.AllocsPerRun(20, func() {
		arm()
		clk.drain()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per round", allocs)
	}
	if want := 21 * (len(ents) - len(ents)/4); n != want {
		t.Fatalf("%d expiries, want %d", n, want)
	}
}

// TestTimerQueueReference runs random operation sequences against the
// sorted-slice reference (see FuzzTimerQueue).
func TestTimerQueueReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for range 200 {
		ops := make([]byte, 64+rng.IntN(512))
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		runTQOps(t, ops)
	}
}

// FuzzTimerQueue: any sequence of arms, re-arms, cancels and clock steps
// fires exactly what a sorted slice of deadlines says, in its order, each
// at its deadline.
func FuzzTimerQueue(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0x10, 0x11, 0x12, 0x93, 0x94, 0xd5, 0x40, 0x41, 0xff})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 4096 {
			ops = ops[:4096]
		}
		runTQOps(t, ops)
	})
}

// runTQOps interprets ops two bytes at a time: the op's top two bits pick
// arm, cancel, advance or arm-from-fire; the rest and the next byte give
// the entry and the duration (coarse, so that ties are common).
func runTQOps(t *testing.T, ops []byte) {
	const owners = 16
	h := newTQHarness(t, owners)
	h.eachFire = true
	rearmOnFire := make([]time.Duration, len(h.ents))
	h.onFire = func(i int) {
		if d := rearmOnFire[i]; d > 0 {
			rearmOnFire[i] = 0
			h.arm(i, d)
		}
	}
	for k := 0; k+1 < len(ops); k += 2 {
		op, arg := ops[k], ops[k+1]
		i := int(op&0x3f) % len(h.ents)
		d := time.Duration(arg%32) * 100 * time.Microsecond
		switch op >> 6 {
		case 0:
			h.arm(i, d)
		case 1:
			h.cancel(i)
		case 2:
			h.advance(d)
		case 3:
			rearmOnFire[i] = d + 100*time.Microsecond
			h.arm(i, d)
		}
	}
	// Drain: what re-arms from a firing is due by then too.
	for range 4 {
		h.advance(10 * time.Millisecond)
	}
	if n := h.q.pending(); n != 0 {
		t.Fatalf("%d entries pending after the drain", n)
	}
}
