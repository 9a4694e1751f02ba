package transport

import (
	"sync"
	"sync/atomic"
	"time"
)

// timerKind names one of a QP's protocol timers. Every QP has one
// timerEntry per kind, embedded in the QP; adding a timer is one constant
// here and one case in QP.onTimer.
type timerKind uint8

const (
	timerRetrans  timerKind = iota // local ACK timeout (timers.go)
	timerRNR                       // RNR NAK back-off (timers.go)
	timerPace                      // DCQCN pacing: the requester may send again (cc.go)
	numTimerKinds                  // keep last
)

// timerEntry is one pending (or idle) timer of a QP in its device's
// timerQueue. All fields except qp and kind are owned by the queue and
// change only under its mutex.
type timerEntry struct {
	idx   int32 // index in the heap, -1 when not queued
	fired bool  // popped as due and not yet taken, re-armed or cancelled
	kind  timerKind
	qp    *QP
}

// timerQueue holds the pending timers of all the QPs of a device and
// arms exactly one Clock.AfterFunc, for the earliest deadline.
//
// It is a binary min-heap keyed by (deadline, arm sequence) with each
// entry's heap index kept in the entry: arm, re-arm (which moves an
// entry in place) and cancel are O(log n), firing is O(log n) per due
// entry, and nothing is allocated per arm once the heap's backing array
// has grown to the number of armed timers. A hashed timing wheel would
// make arm and cancel O(1), but its tick quantizes deadlines (an entry
// fires up to one tick late, and a tick fine enough for the 4 µs ACK
// timeout granularity means a wheel that spins while idle) and it needs
// a cascade for the 4.096 µs × 2^31 range of ACK timeouts; the heap fires
// every entry at exactly its deadline, in a deterministic order (equal
// deadlines in arm order), and log2(30,000) ≈ 15 steps is cheap next to
// what a timer does when it fires. The local ACK timer is re-armed
// lazily (progress only marks it pushed; the expiry then re-arms), so the
// heap is touched about four times per timeout period per busy QP (the
// lazy timer's check interval, QP.checkIn), not per packet.
//
// The single Clock timer is also re-armed lazily: it is moved only when
// a new earliest deadline lies before the one it is set for; cancelling
// the head leaves it set, and an expiry with nothing due re-arms for the
// new head.
type timerQueue struct {
	clock Clock
	fire  func(e *timerEntry) // called for every due entry, without mu held

	mu       sync.Mutex
	h        []timerSlot
	seq      uint64
	count    *timerStats // counts runs for tests (stats, in timerq_stats_test.go); nil in production
	timer    Timer       // the one AfterFunc; nil until first armed
	timerSet bool        // timer is pending
	timerAt  time.Time   // its deadline while timerSet
	closed   bool

	// armed is len(h), readable without mu (the send scheduler's
	// measure of how many QPs are busy, sched.go).
	armed atomic.Int32

	runMu sync.Mutex    // serializes run (a RealClock timer can fire twice at once)
	due   []*timerEntry // run's scratch list, under runMu
}

// timerSlot is one heap element: the entry's deadline and arm order are
// kept in the heap's own array, so that a sift compares keys in a few
// contiguous cache lines instead of loading the entries (one per QP,
// scattered over the QPs of a device: with 10,000 busy QPs a cache miss
// per comparison); only the entries that move are touched (their idx).
type timerSlot struct {
	when time.Time // the deadline
	seq  uint64    // arm order: breaks ties between equal deadlines
	e    *timerEntry
}

// newTimerQueue returns an empty queue on clock that calls fire for each
// expired entry.
func newTimerQueue(clock Clock, fire func(e *timerEntry)) *timerQueue {
	return &timerQueue{clock: clock, fire: fire}
}

// initEntry prepares e (one of qp's timers) for use with a timerQueue.
func (e *timerEntry) init(qp *QP, k timerKind) {
	*e = timerEntry{idx: -1, kind: k, qp: qp}
}

// arm sets e to fire d after now (the caller's reading of the clock). An
// entry already queued is moved to its new deadline and takes a new place
// among equal deadlines, as if inserted anew. A closed queue ignores it.
func (q *timerQueue) arm(e *timerEntry, now time.Time, d time.Duration) {
	when := now.Add(d)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	e.fired = false
	q.seq++
	if e.idx < 0 {
		e.idx = int32(len(q.h))
		q.h = append(q.h, timerSlot{when: when, seq: q.seq, e: e})
		q.armed.Store(int32(len(q.h)))
		q.up(int(e.idx))
	} else {
		sl := &q.h[e.idx]
		sl.when, sl.seq = when, q.seq
		if !q.up(int(e.idx)) {
			q.down(int(e.idx))
		}
	}
	if q.h[0].e == e {
		q.kickLocked(when)
	}
}

// cancel removes e from the queue; a due entry that was not taken yet will
// not be (take reports false). It reports whether e was pending or due.
func (q *timerQueue) cancel(e *timerEntry) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	was := e.fired || e.idx >= 0
	e.fired = false
	if e.idx >= 0 {
		q.remove(int(e.idx))
	}
	// The clock timer stays set even when the queue is empty: it fires
	// once for nothing, while stopping it and setting it again for the
	// next arm (a QP going idle and busy in turns) would cost two clock
	// operations per message.
	return was
}

// take reports whether e, handed to fire, is still due: not re-armed or
// cancelled since it was popped. The owner calls it under the lock it
// arms and cancels e with, so the answer holds while it handles the
// expiry. It consumes the expiry.
func (q *timerQueue) take(e *timerEntry) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	ok := e.fired
	e.fired = false
	return ok
}

// timerStats counts what a timerQueue's runs did, for tests that check
// that a timer ran or measure how many expiries a workload costs. A
// queue counts only once a test asked (timerQueue.stats sets count); the
// fields change under the queue's mutex.
type timerStats struct {
	fires    uint64 // clock timer expiries (runs)
	expiries uint64 // entries found due
}

// pending returns the number of queued entries.
func (q *timerQueue) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.h)
}

// close empties the queue and stops its clock timer; later arms are
// ignored. Entries handed to fire before close may still be taken.
func (q *timerQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for i := range q.h {
		q.h[i].e.idx = -1
		q.h[i] = timerSlot{}
	}
	q.h = q.h[:0]
	q.armed.Store(0)
	if q.timerSet {
		q.timer.Stop()
		q.timerSet = false
	}
}

// kickLocked makes the clock timer fire no later than when. It reads the
// clock afresh (not the caller's earlier reading), so that the timer is
// set for exactly when.
func (q *timerQueue) kickLocked(when time.Time) {
	if q.timerSet && !when.Before(q.timerAt) {
		return
	}
	d := when.Sub(q.clock.Now())
	if d < 0 {
		d = 0
	}
	q.timerSet, q.timerAt = true, when
	if q.timer == nil {
		q.timer = q.clock.AfterFunc(d, q.run)
		return
	}
	q.timer.Reset(d)
}

// run is the clock timer's function: it pops every entry whose deadline
// has been reached, re-arms the clock timer for the next one and hands
// the popped entries to fire, earliest first (ties in arm order).
func (q *timerQueue) run() {
	q.runMu.Lock()
	defer q.runMu.Unlock()
	q.mu.Lock()
	q.timerSet = false
	st := q.count
	if st != nil {
		st.fires++
	}
	now := q.clock.Now()
	due := q.due[:0]
	for len(q.h) > 0 && !q.h[0].when.After(now) {
		e := q.h[0].e
		q.remove(0)
		e.fired = true
		if st != nil {
			st.expiries++
		}
		due = append(due, e)
	}
	if len(q.h) > 0 && !q.closed {
		q.kickLocked(q.h[0].when)
	}
	q.mu.Unlock()
	for i, e := range due {
		q.fire(e)
		due[i] = nil
	}
	q.due = due[:0]
}

// less orders the heap: earlier deadline first, then arm order.
func (q *timerQueue) less(i, j int) bool {
	a, b := &q.h[i], &q.h[j]
	if a.when.Equal(b.when) {
		return a.seq < b.seq
	}
	return a.when.Before(b.when)
}

func (q *timerQueue) swap(i, j int) {
	q.h[i], q.h[j] = q.h[j], q.h[i]
	q.h[i].e.idx = int32(i)
	q.h[j].e.idx = int32(j)
}

// up moves entry i towards the root; it reports whether it moved.
func (q *timerQueue) up(i int) bool {
	moved := false
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.swap(i, p)
		i = p
		moved = true
	}
	return moved
}

// down moves entry i towards the leaves.
func (q *timerQueue) down(i int) {
	n := len(q.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			return
		}
		q.swap(i, m)
		i = m
	}
}

// remove takes entry i out of the heap.
func (q *timerQueue) remove(i int) {
	last := len(q.h) - 1
	e := q.h[i].e
	if i != last {
		q.swap(i, last)
	}
	q.h[last] = timerSlot{}
	q.h = q.h[:last]
	q.armed.Store(int32(last))
	e.idx = -1
	if i != last {
		if !q.up(i) {
			q.down(i)
		}
	}
}
