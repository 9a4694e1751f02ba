// Package soak is rocev2d's soak command and its two child commands
// (soak-server, soak-client): CM connections that live and die as
// applications do, clients and server killed and restarted, every byte
// checked, and nothing left behind on the server. Commands returns the
// three for rocev2d's dispatch; soak starts its children as the running
// executable.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, rdmacm, transport, memreg and
// udp; only rocev2d's main imports it.
package soak

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the package's commands, registered by their files' init.
var commands cli.Registry

// Commands are soak, soak-server and soak-client, for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
