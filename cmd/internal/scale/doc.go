// Package scale is rocev2d's scale command: many RC QP pairs between two
// devices in one process, measuring the setup rate, the memory of an idle
// QP, goroutines, and the goodput of many QPs against one. Commands returns
// it for rocev2d's dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, transport, memreg, udp and
// udp/memnet; only rocev2d's main imports it.
package scale

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the package's commands, registered by their files' init.
var commands cli.Registry

// Commands are scale, for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
