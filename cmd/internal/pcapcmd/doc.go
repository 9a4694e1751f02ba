// Package pcapcmd is rocev2d's pcap command: `pcap check` reads pcap and
// pcapng captures with its own reader (reader.go: every pcapng interface's
// link type, every section; Ethernet, Linux cooked SLL and SLL2 as tcpdump
// -i any writes, raw IP, loopback), finds each frame's RoCEv2 packet
// through VLAN tags, tunnels and IP fragments (walk.go, reassembly.go),
// verifies its ICRC and layout and splits GSO datagrams; `pcap write-sample` writes a
// capture of every sample opcode. Commands returns it for rocev2d's
// dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, rocelayer, packet and the
// wire header packages; only rocev2d's main imports it.
package pcapcmd

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// commands are the package's commands, registered by their files' init.
var commands cli.Registry

// Commands are pcap, for rocev2d's dispatch.
func Commands() []cli.Command { return commands.Commands() }
