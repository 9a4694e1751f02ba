// Package sharecmd is rocev2d's share command: `share status ADDR` lists
// the processes sharing an address's UDP port 4791 (udp/share's steering
// map), `share remove ADDR` removes a stale one (Linux). Commands returns it
// for rocev2d's dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, udp and udp/share; only rocev2d's
// main imports it.
package sharecmd

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the package's commands, registered by their files' init.
var commands cli.Registry

// Commands are share, for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
