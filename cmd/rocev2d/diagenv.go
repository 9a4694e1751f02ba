package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"time"
)

// Diagnostics for runs where no flag can be added (inside the interop
// lab's VMs, through a harness): with ROCEV2D_TRACE=FILE set, every
// rocev2d command records the Go execution tracer into FILE for
// ROCEV2D_TRACE_SECONDS (default 3) seconds from its start — enough to
// see goroutine hand-offs, syscalls and scheduler latency with
// `go tool trace -pprof=sched FILE`. ROCEV2D_CPUPROFILE=FILE likewise
// writes a CPU profile (pprof) of the same seconds. Unset, nothing happens.
func init() {
	secs := 3.0
	if s := os.Getenv("ROCEV2D_TRACE_SECONDS"); s != "" {
		if v, err := strconv.ParseFloat(s, 64); err == nil && v > 0 {
			secs = v
		}
	}
	d := time.Duration(secs * float64(time.Second))
	if name := os.Getenv("ROCEV2D_CPUPROFILE"); name != "" {
		record("ROCEV2D_CPUPROFILE", name, d, pprof.StartCPUProfile, pprof.StopCPUProfile)
	}
	if name := os.Getenv("ROCEV2D_TRACE"); name != "" {
		record("ROCEV2D_TRACE", name, d, trace.Start, trace.Stop)
	}
}

// record creates the file name, starts a recording into it and stops it
// after d; a failure is reported on stderr under the variable's name env.
func record(env, name string, d time.Duration, start func(io.Writer) error, stop func()) {
	f, err := os.Create(name)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rocev2d: %s: %v\n", env, err)
		return
	}
	if err := start(f); err != nil {
		fmt.Fprintf(os.Stderr, "rocev2d: %s: %v\n", env, err)
		f.Close()
		return
	}
	time.AfterFunc(d, func() {
		stop()
		f.Close()
	})
}
