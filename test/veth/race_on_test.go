//go:build linux && race

package veth

// ackTimeout is the QPs' local ACK timeout code: 67 ms under the race
// detector, whose slowdown stalls the receive loops.
const ackTimeout = 14
