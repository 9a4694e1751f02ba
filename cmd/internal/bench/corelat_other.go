//go:build !linux

package bench

import "time"

// coreRTT is measured on Linux only (it pins threads to CPUs).
func coreRTT() (time.Duration, bool) { return 0, false }
