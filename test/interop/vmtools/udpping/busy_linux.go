package main

import (
	"net"
	"net/netip"
	"syscall"
)

// tryRead is one non-blocking recvfrom on c's socket: ok is false when
// no datagram is waiting.
func tryRead(c *net.UDPConn, buf []byte) (n int, from netip.AddrPort, ok bool, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, from, false, err
	}
	var rerr error
	var sa syscall.Sockaddr
	if err := rc.Control(func(fd uintptr) { n, sa, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_DONTWAIT) }); err != nil {
		return 0, from, false, err
	}
	if rerr == syscall.EAGAIN {
		return 0, from, false, nil
	}
	if rerr != nil {
		return 0, from, false, rerr
	}
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		from = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *syscall.SockaddrInet6:
		from = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return n, from, true, nil
}
