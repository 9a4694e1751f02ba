//go:build linux

package scale

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPU returns the user plus system CPU time of the process (every
// thread).
func processCPU() (time.Duration, bool) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// processSwitches returns the process's voluntary and involuntary context
// switches so far (every thread).
func processSwitches() (vol, invol int64, ok bool) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0, 0, false
	}
	return ru.Nvcsw, ru.Nivcsw, true
}
