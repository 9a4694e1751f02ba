// Package demo is rocev2d's demo command: two endpoints in one process,
// on loopback UDP sockets or the in-memory network (--mem, with loss,
// duplication, reordering and CE marks), run every RC operation and check
// each byte; --pcap writes what they sent. Commands returns it for
// rocev2d's dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, cmd/internal/pcaptap,
// transport, memreg, udp and udp/memnet; only rocev2d's main imports it.
package demo

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the package's commands, registered by their files' init.
var commands cli.Registry

// Commands are demo, for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
