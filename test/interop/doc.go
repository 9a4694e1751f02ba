//go:build linux

// Package interop runs rocev2d against Linux soft-RoCE: it boots Debian's
// kernel with rdma_rxe in qemu inside a network namespace it creates
// (192.0.2.0/24), runs rdma-core's and perftest's tools in the VM against
// rocev2d on the host side, and checks every exchange (captures decoded and
// ICRC-checked, rxe's counters, the tools' results). README.md has the
// cells and how to run them (ROCEV2_INTEROP=1, root).
//
// Tests only; Linux only. It sits on top: it builds and drives the rocev2d
// command, runs the transport package directly over a udp.SocketLink for the
// immediate-data cells, decodes captures with the wire packages, and uses
// internal/netns, udp/faults and test/goldendir. Nothing imports it.
package interop
