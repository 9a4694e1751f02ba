// Package cmtools is rocev2d's family of librdmacm tools, connecting
// through the IB connection manager (package rdmacm): rping, rdma-server /
// rdma-client, udaddy, cmtime and ucmatose, flag- and wire-compatible with librdmacm's
// examples of rdma-core 44, so that either side may be the real tool.
// Commands returns them for rocev2d's dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, rdmacm, transport and memreg;
// only rocev2d's main imports it.
package cmtools

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the librdmacm tools, registered by their files' init.
var commands cli.Registry

// Commands are rping, rdma-server, rdma-client, udaddy, cmtime and ucmatose, for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
