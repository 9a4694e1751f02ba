package transport

import (
	"sort"
	"sync"
	"time"
)

// Clock is the time source of a Device. Every protocol timer (local ACK
// timeout, RNR back-off) goes through it, so tests can drive time by hand
// with a ManualClock instead of sleeping.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or, for a ManualClock, from
	// Advance) once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a handle on a pending AfterFunc call. Its methods have the
// semantics of time.Timer.
type Timer interface {
	// Stop prevents the call from happening; it reports whether it stopped a pending call.
	Stop() bool
	// Reset re-arms the timer to fire after d; it reports whether it was pending.
	Reset(d time.Duration) bool
}

// RealClock is the wall clock (time.Now and time.AfterFunc).
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var _ Clock = RealClock{}

// ManualClock is a Clock whose time only moves when Advance is called.
// Timer functions run synchronously inside Advance, in deadline order, on
// the caller's goroutine. The zero value is not usable; use NewManualClock.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
	// lateTimers (set by this package's tests) makes a QP treat an ACK
	// timer that ran more than a timeout after its deadline as late
	// (QP.behind), as it does on the wall clock: the clock moved on
	// while the timer's function waited, as if the process had not been
	// scheduled. Off, a ManualClock's expiries are never late.
	lateTimers bool
	// lazyPush (set by this package's tests) gives a device on this
	// clock the wall clock's ACK timer: progress marks the timer pushed
	// without reading the clock (timers.pushed). Off, every push reads
	// this clock, which costs nothing, and moves the deadline exactly.
	lazyPush bool
}

type manualTimer struct {
	c       *ManualClock
	when    time.Time
	f       func()
	pending bool
}

// NewManualClock returns a ManualClock starting at start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f to run when the clock has been advanced by d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) Timer {
	t := &manualTimer{c: c, f: f}
	t.Reset(d)
	return t
}

// Pending returns the number of armed timers.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves the clock forward by d, firing every timer whose deadline
// is reached, earliest first. A timer re-armed by a fired function fires
// again within the same Advance if its new deadline is reached.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		if len(c.timers) == 0 {
			break
		}
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].when.Before(c.timers[j].when) })
		t := c.timers[0]
		if t.when.After(end) {
			break
		}
		c.timers = c.timers[1:]
		t.pending = false
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	// Never back: another Advance may have moved the clock further while
	// this one ran a timer function without the lock.
	if end.After(c.now) {
		c.now = end
	}
	c.mu.Unlock()
}

func (t *manualTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return t.removeLocked()
}

func (t *manualTimer) removeLocked() bool {
	if !t.pending {
		return false
	}
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			break
		}
	}
	t.pending = false
	return true
}

func (t *manualTimer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	was := t.removeLocked()
	t.when = c.now.Add(d)
	t.pending = true
	c.timers = append(c.timers, t)
	return was
}

var _ Clock = (*ManualClock)(nil)
