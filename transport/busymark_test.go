package transport

import (
	"testing"
	"time"
)

// busyMarkAgo returns a mark on busyClk taken ago before now (tests: a
// batch that began then).
func busyMarkAgo(ago time.Duration) int64 {
	initBusyClock()
	c := &busyClk
	if !c.tsc {
		return int64(time.Since(c.base)-ago) | 1
	}
	mono, t := time.Since(c.base), readTSC()
	return (t - int64(float64(ago)*float64(t-c.tsc0)/float64(mono))) | 1
}

// TestBusyMark: the age of a busy mark (a batch's start, rxBusy) is the
// time since it was taken in nanoseconds, on the time-stamp counter where
// the kernel keeps time with it and on the monotonic clock elsewhere:
// between what the monotonic clock measured from right after the mark to
// right before the age was asked and from right before the mark to right
// after (2 % and 100 µs of slack for the counter's rate). Fails when the
// counter's ticks are taken for nanoseconds (a factor of the CPU's GHz)
// or the rate is inverted. Clocks of its own: the process's (busyClk)
// is left alone.
func TestBusyMark(t *testing.T) {
	for _, tsc := range []bool{true, false} {
		if tsc && !tscUsable() {
			t.Logf("time-stamp counter not used here (clocksource not tsc): only the monotonic clock")
			continue
		}
		c := newBusyClock(tsc)
		for _, sleep := range []time.Duration{0, 3 * time.Millisecond, 30 * time.Millisecond} {
			t0 := time.Now()
			m := c.mark()
			t1 := time.Now()
			time.Sleep(sleep)
			t2 := time.Now()
			age := c.age(m)
			t3 := time.Now()
			lo, hi := t2.Sub(t1), t3.Sub(t0)
			if m == 0 || age < lo*98/100-100*time.Microsecond || age > hi*102/100+100*time.Microsecond {
				t.Errorf("tsc %v, sleep %v: mark %d, age %v; the monotonic clock says between %v and %v", tsc, sleep, m, age, lo, hi)
			}
		}
	}
}
