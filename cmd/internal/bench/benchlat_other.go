//go:build !unix

package bench

import (
	"net"
	"time"
)

// rawRecvSpin receives one datagram into buf. Without a non-blocking
// recvfrom here it always waits in Go's poller: the raw baseline of a
// busy-poll row blocks (and rocev2's socket link, which busy-polls, is
// Linux-only).
func rawRecvSpin(c *net.UDPConn, buf []byte, spin time.Duration) (int, error) {
	n, _, err := c.ReadFromUDPAddrPort(buf)
	return n, err
}
