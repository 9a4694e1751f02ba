// Package veth holds tests only: RC transfers over kernel UDP sockets
// between two network namespaces joined by a veth pair, with the eBPF fault
// injector (udp/faults) on the path. They need root; without it they skip
// loudly (and fail when CI=true).
//
// It sits on top: it runs transport over udp.SocketLink, with
// internal/netns for the namespaces and udp/faults on the veth. Nothing
// imports it. Linux only.
package veth
