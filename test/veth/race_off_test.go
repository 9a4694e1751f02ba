//go:build linux && !race

package veth

// ackTimeout is the QPs' local ACK timeout code (33.6 ms).
const ackTimeout = 13
