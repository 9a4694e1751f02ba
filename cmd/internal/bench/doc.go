// Package bench is `rocev2d bench`: raw UDP baselines against the RoCEv2
// stack over loopback, side by side — goodput of WRITE, READ and SEND
// (without GSO against sendmmsg/recvmmsg, with GSO against UDP GSO+GRO; READ
// also against a request/response baseline) and 8-byte ping-pong latency,
// with the CPU time per MB or round trip of both, rows alternating raw and
// stack runs so both see the same moments of a noisy machine.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, transport, memreg and udp
// (and golang.org/x/sys for the raw baselines' system calls); only
// rocev2d's main imports it.
package bench
