// Package cpudist measures how far apart, in cache terms, the first two
// CPUs the process runs on are: the round trip of one cache line between
// two threads pinned to them (RoundTrip), sampled around the runs of a
// benchmark (Watch).
//
// On a physical machine that is a constant of the hardware. In a virtual
// machine it also says where the host runs the virtual CPUs at the
// moment, which can change for seconds at a time: on one AMD EPYC host a
// 2-vCPU VM read 50-85 ns while its vCPUs shared an L3 cache and ~300 ns
// while they did not, and every loopback benchmark whose sender and
// receiver run on different CPUs (raw UDP and RoCEv2 alike) moved up to
// half as many bytes per CPU second meanwhile. rocev2d bench and rocev2d
// scale print what Watch saw, so that a run measured with the CPUs apart
// can be told from one measured with them close.
package cpudist

import "time"

// Watch keeps the RoundTrip samples taken around some runs. The zero
// Watch has no samples.
type Watch struct {
	N        int           // samples taken
	Min, Max time.Duration // the fastest and the slowest (valid when N > 0)
}

// Sample takes one RoundTrip sample (a fraction of a millisecond of both
// CPUs), unless the measurement cannot run here.
func (w *Watch) Sample() {
	if d, ok := RoundTrip(); ok {
		w.add(d)
	}
}

func (w *Watch) add(d time.Duration) {
	w.Merge(Watch{N: 1, Min: d, Max: d})
}

// Merge adds o's samples to w.
func (w *Watch) Merge(o Watch) {
	if o.N == 0 {
		return
	}
	if w.N == 0 || o.Min < w.Min {
		w.Min = o.Min
	}
	if w.N == 0 || o.Max > w.Max {
		w.Max = o.Max
	}
	w.N += o.N
}

// Apart reports whether w has a sample at twice best or more: during the
// runs it watched, the CPUs were at least twice as far apart as at their
// closest (best, the fastest sample of the whole benchmark).
func (w Watch) Apart(best time.Duration) bool {
	return w.N > 0 && best > 0 && w.Max >= 2*best
}
