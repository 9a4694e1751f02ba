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

// busyClk is the busy mark's clock, set up by the first device on the
// wall clock (initBusyClock) before its receive goroutine starts.
var busyClk struct {
	once sync.Once
	tsc  bool      // marks are time-stamp counter ticks
	base time.Time // when the clock was set up (monotonic reading)
	tsc0 int64     // the counter at base
}

// initBusyClock sets up busyClk once; NewDevice calls it for a device on
// the wall clock before that device receives.
func initBusyClock() {
	busyClk.once.Do(func() {
		busyClk.tsc = tscUsable()
		busyClk.base = time.Now()
		busyClk.tsc0 = readTSC()
	})
}

// busyMark returns a mark of now on the busy clock: nonzero.
func busyMark() int64 {
	if busyClk.tsc {
		return readTSC() | 1
	}
	return int64(time.Since(busyClk.base)) | 1
}

// busyAge returns how long ago mark (busyMark's) was taken. On the
// time-stamp counter it converts ticks at the rate measured between
// initBusyClock and now.
func busyAge(mark int64) time.Duration {
	mono := time.Since(busyClk.base)
	if !busyClk.tsc {
		return mono - time.Duration(mark)
	}
	t := readTSC()
	if t <= busyClk.tsc0 || mono <= 0 {
		return 0 // no rate yet (or a counter that went back): not behind
	}
	return time.Duration(float64(t-mark) * float64(mono) / float64(t-busyClk.tsc0))
}
