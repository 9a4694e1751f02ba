// Package ccsim holds the congestion-control simulations of the stack:
// N RC flows, each from its own transport Device, into one receiver behind
// a switch port of the in-memory network (memnet.MemNetwork.Bottleneck) with
// RED/ECN marking, run in virtual time (memnet.NewVirtualMemNetwork driven by
// a transport.ManualClock) so that a run is a deterministic function of
// its seed. Its tests assert what DCQCN must achieve there (goodput,
// fairness, no drops, a short queue) and what the same run without DCQCN
// loses; its benchmarks report the numbers. The package has no API: the
// harness is in its test files.
package ccsim
