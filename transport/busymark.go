package transport

import (
	"sync"
	"time"
)

// The busy mark of a received batch (Device.rxBusy) says when the batch
// began, so that an ACK timer that expires while a batch has been under
// way for longer than its timeout knows this process is behind on its
// input (QP.behind). It is written at the start of every batch and read
// only when such a timer expires, so it is kept in the cheapest clock
// there is: the CPU's time-stamp counter (one RDTSC, ~25 cycles) where
// the kernel itself keeps time with it (clocksource "tsc": a counter that
// runs at one rate on every CPU), converted to nanoseconds only when a
// timer asks; elsewhere the monotonic clock (time.Since: a vDSO call,
// ~86 instructions under callgrind, twice per 8-byte round trip).

// busyClock is a busy-mark clock: the time-stamp counter or the
// monotonic clock, and the reading its rate is measured from.
type busyClock struct {
	tsc  bool      // marks are time-stamp counter ticks
	base time.Time // when the clock was set up (monotonic reading)
	tsc0 int64     // the counter at base
}

// busyClk is the process's busy mark clock, set up by the first device on
// the wall clock (initBusyClock) before its receive goroutine starts and
// never changed after.
var (
	busyClk     busyClock
	busyClkOnce sync.Once
)

// initBusyClock sets up busyClk once; NewDevice calls it for a device on
// the wall clock before that device receives.
func initBusyClock() {
	busyClkOnce.Do(func() { busyClk = newBusyClock(tscUsable()) })
}

// newBusyClock returns a busy clock on the time-stamp counter (tsc) or
// the monotonic clock.
func newBusyClock(tsc bool) busyClock {
	return busyClock{tsc: tsc, base: time.Now(), tsc0: readTSC()}
}

// busyMark returns a mark of now on busyClk: nonzero.
func busyMark() int64 { return busyClk.mark() }

// busyAge returns how long ago mark (busyMark's) was taken.
func busyAge(mark int64) time.Duration { return busyClk.age(mark) }

// mark returns a mark of now on c: nonzero.
func (c *busyClock) mark() int64 {
	if c.tsc {
		return readTSC() | 1
	}
	return int64(time.Since(c.base)) | 1
}

// age returns how long ago mark (c.mark's) was taken. On the time-stamp
// counter it converts ticks at the rate measured between c's set-up and
// now.
func (c *busyClock) age(mark int64) time.Duration {
	mono := time.Since(c.base)
	if !c.tsc {
		return mono - time.Duration(mark)
	}
	t := readTSC()
	if t <= c.tsc0 || mono <= 0 {
		return 0 // no rate yet (or a counter that went back): not behind
	}
	return time.Duration(float64(t-mark) * float64(mono) / float64(t-c.tsc0))
}
