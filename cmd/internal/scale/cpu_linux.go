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
