package transport

import (
	"bytes"
	"os"
)

// readTSC returns the CPU's time-stamp counter (RDTSC; tsc_linux_amd64.s).
func readTSC() int64

// tscUsable reports whether the kernel keeps time with the time-stamp
// counter (clocksource "tsc"): it does only where the counter runs at a
// constant rate and in step on every CPU.
func tscUsable() bool {
	b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	return err == nil && bytes.Equal(bytes.TrimSpace(b), []byte("tsc"))
}
