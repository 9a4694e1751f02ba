//go:build !(linux && amd64)

package transport

// readTSC is not used here (tscUsable reports false).
func readTSC() int64 { return 0 }

// tscUsable reports false: the busy mark uses the monotonic clock.
func tscUsable() bool { return false }
