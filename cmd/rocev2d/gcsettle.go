package main

import (
	"os"
	"runtime/debug"
)

// gcPercent is rocev2d's GOGC when the environment sets none.
const gcPercent = 400

// The first garbage collection of a Go program starts at about 4 MB of
// heap (GOGC=100), and a rocev2d command's setup — the device, its queues
// and tables, the out-of-band exchange — allocates about 5 MB: so the
// first cycle used to start around the beginning of the timed phase. The
// transport's paths allocate next to nothing afterwards, so that cycle was
// the only one, and on a fast machine it costs a few ms.
//
// In the interop lab's 1-vCPU TCG VMs that cycle spans a good part of a
// run, and with GOMAXPROCS=1 its mark worker, assists and sweeping take the
// only P from the receive goroutine. With GOGC=400 the first cycle starts
// at about 16 MB, which a command's setup and run do not reach: the
// BenchmarkVM rows with GODEBUG=gctrace=1 show no cycle in an 8-byte
// pingpong (on the host: none in 2000 round trips, one before). What that
// is worth in the VMs is within their noise so far: GOGC=off beat the
// old default 4.0-4.1 ms against 5.5-8.6 ms alternating in one boot, but
// against GOGC=400 it was ahead in some rounds and behind in others. A
// command that keeps allocating (bench, demo) collects less often, on a
// heap a few times its live size. GOGC in the environment still wins.
func init() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
