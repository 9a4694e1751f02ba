//go:build !linux

package scale

import "time"

// processCPU is not measured here.
func processCPU() (time.Duration, bool) { return 0, false }

// processSwitches is not measured here.
func processSwitches() (vol, invol int64, ok bool) { return 0, 0, false }
