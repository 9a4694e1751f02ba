//go:build unix

package bench

import (
	"net"
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// rawRecvSpin receives one datagram into buf: it polls the socket without
// blocking for up to spin, then waits in Go's poller.
func rawRecvSpin(c *net.UDPConn, buf []byte, spin time.Duration) (int, error) {
	if spin > 0 {
		rc, err := c.SyscallConn()
		if err != nil {
			return 0, err
		}
		var n int
		var e syscall.Errno
		try := func(fd uintptr) bool {
			r, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
				syscall.MSG_DONTWAIT, 0, 0)
			n, e = int(r), errno
			return true // never wait in the poller here
		}
		end := time.Now().Add(spin)
		for {
			if err := rc.Read(try); err != nil {
				return 0, err
			}
			if e == 0 {
				return n, nil
			}
			if e != syscall.EAGAIN && e != syscall.EINTR {
				return 0, e
			}
			if time.Now().After(end) {
				break
			}
			runtime.Gosched()
		}
	}
	n, _, err := c.ReadFromUDPAddrPort(buf)
	return n, err
}
