package main

import (
	"fmt"
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
	if name := os.Getenv("ROCEV2D_CPUPROFILE"); name != "" {
		cpuProfile(name, secs)
	}
	name := os.Getenv("ROCEV2D_TRACE")
	if name == "" {
		return
	}
	f, err := os.Create(name)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rocev2d: ROCEV2D_TRACE: %v\n", err)
		return
	}
	if err := trace.Start(f); err != nil {
		fmt.Fprintf(os.Stderr, "rocev2d: ROCEV2D_TRACE: %v\n", err)
		f.Close()
		return
	}
	time.AfterFunc(time.Duration(secs*float64(time.Second)), func() {
		trace.Stop()
		f.Close()
	})
}

// cpuProfile records a CPU profile into name for secs seconds.
func cpuProfile(name string, secs float64) {
	f, err := os.Create(name)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rocev2d: ROCEV2D_CPUPROFILE: %v\n", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "rocev2d: ROCEV2D_CPUPROFILE: %v\n", err)
		f.Close()
		return
	}
	time.AfterFunc(time.Duration(secs*float64(time.Second)), func() {
		pprof.StopCPUProfile()
		f.Close()
	})
}
