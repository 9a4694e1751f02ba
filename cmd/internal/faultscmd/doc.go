// Package faultscmd is rocev2d's faults command (Linux, root): it attaches
// udp/faults' eBPF program to an interface and drops, duplicates, reorders
// and CE-marks RoCEv2 packets, GSO datagrams per segment, until
// interrupted, then prints what it did. Commands returns it for rocev2d's
// dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli and udp/faults; only rocev2d's
// main imports it.
package faultscmd

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the package's commands, registered by their files' init.
var commands cli.Registry

// Commands are faults, for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
