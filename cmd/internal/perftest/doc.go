// Package perftest is rocev2d's perftest family: write-bw, read-bw,
// send-bw, atomic-bw, write-lat, read-lat, send-lat and atomic-lat, each
// speaking perftest 4.5's out-of-band exchange (TCP, or rdma_cm with -R)
// and printing its result table, so that either side of a run may be the
// real ib_*_bw / ib_*_lat tool; with -b (bidirectional), -q (several QPs),
// --check (data verification between two rocev2d), --pcap and -v.
// Commands returns them for rocev2d's dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, cmd/internal/oob (perftest's
// exchange), cmd/internal/pcaptap, rdmacm, transport, memreg and udp; only
// rocev2d's main imports it.
package perftest

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the perftest commands, registered by perf_flags.go's init.
var commands cli.Registry

// Commands are the eight perftest commands (write-bw .. atomic-lat), for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
