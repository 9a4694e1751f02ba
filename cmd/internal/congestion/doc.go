// Package congestion is `rocev2d congestion`: N RC flows into one
// bottleneck of the in-memory network's switch model (package memnet: drain
// rate, buffer, RED/ECN marking, tail drop), in virtual time so that a run
// is a function of its seed, with each flow's goodput and DCQCN rate, the
// queue depth, CNPs, marks and drops per interval written as CSV and as an
// SVG plot (cmd/internal/svgplot).
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, cmd/internal/svgplot,
// transport, memreg, dcqcn and udp/memnet; only rocev2d's main imports it.
package congestion
