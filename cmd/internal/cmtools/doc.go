// Package cmtools is rocev2d's family of librdmacm tools, connecting
// through the IB connection manager (package rdmacm): rping, rdma-server /
// rdma-client and udaddy, flag- and wire-compatible with librdmacm's
// examples of rdma-core 44, so that either side may be the real tool.
// Commands returns them for rocev2d's dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, rdmacm, transport and memreg;
// only rocev2d's main imports it. cli.go names package cli's helpers as
// the files used them in package main, so that the move changed nothing
// but their package line.
package cmtools
