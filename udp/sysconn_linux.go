//go:build linux

package udp

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysConn is a socket the Go netpoller does not know: a blocking file
// descriptor used with plain blocking system calls (recvmmsg waits in the
// kernel, on a thread of its own).
//
// Why not net.UDPConn: a socket registered with the netpoller (epoll, edge
// triggered, EPOLLIN|EPOLLOUT) gets an epoll callback for every datagram it
// sends (the freed send buffer is "write space") and every one it receives,
// and the callbacks wake the netpoller's thread. On loopback that cost
// about a third of the packet rate of per-packet and sendmmsg sending
// (BenchmarkLinkVsRaw). A blocked receive is woken by the kernel directly.
//
// sysConn implements syscall.RawConn. Close shuts the socket down, which
// wakes blocked calls, waits for every call in progress to return and then
// closes the descriptor, so a call never reaches a reused descriptor.
type sysConn struct {
	fd      int
	ops     sync.RWMutex // held shared by every call on fd; exclusively by Close around close(2)
	closed  atomic.Bool
	cleanup runtime.Cleanup // closes fd if the sysConn is dropped without Close
}

var _ syscall.RawConn = (*sysConn)(nil)

// openSocket creates a blocking socket, runs set on it and binds it to sa.
// Errors name the step ("socket: ...", "bind: ...") and wrap the errno.
func openSocket(family, typ, proto int, sa unix.Sockaddr, set func(fd int) error) (*sysConn, error) {
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("setsockopt IPV6_V6ONLY: %w", err)
		}
	}
	if set != nil {
		if err := set(fd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind: %w", err)
	}
	c := &sysConn{fd: fd}
	// Like an os.File or net.UDPConn, a socket whose owner was dropped
	// without Close is closed by the garbage collector, so a leaked link
	// does not hold its address:port for the rest of the process.
	c.cleanup = runtime.AddCleanup(c, func(fd int) { unix.Close(fd) }, fd)
	return c, nil
}

// sockaddr returns addr:port as a socket address (the zone of an IPv6
// address, a name or an index, becomes its scope ID).
func sockaddr(addr netip.Addr, port int) (unix.Sockaddr, error) {
	if addr.Is4() {
		return &unix.SockaddrInet4{Port: port, Addr: addr.As4()}, nil
	}
	sa := &unix.SockaddrInet6{Port: port, Addr: addr.As16()}
	if z := addr.Zone(); z != "" {
		if n, err := strconv.ParseUint(z, 10, 32); err == nil {
			sa.ZoneId = uint32(n)
		} else {
			ifi, err := net.InterfaceByName(z)
			if err != nil {
				return nil, fmt.Errorf("zone %q: %w", z, err)
			}
			sa.ZoneId = uint32(ifi.Index)
		}
	}
	return sa, nil
}

// Control calls f with the descriptor.
func (c *sysConn) Control(f func(fd uintptr)) error {
	c.ops.RLock()
	defer c.ops.RUnlock()
	if c.closed.Load() {
		return net.ErrClosed
	}
	f(uintptr(c.fd))
	return nil
}

// Read calls f until it reports done. It returns net.ErrClosed when the
// socket is closed before or while f ran (a receive woken by Close returns
// nothing useful).
func (c *sysConn) Read(f func(fd uintptr) bool) error {
	c.ops.RLock()
	defer c.ops.RUnlock()
	for {
		if c.closed.Load() {
			return net.ErrClosed
		}
		done := f(uintptr(c.fd))
		if c.closed.Load() {
			return net.ErrClosed
		}
		if done {
			return nil
		}
	}
}

// Write is Read for sending: a send woken by Close (EPIPE) reports
// net.ErrClosed.
func (c *sysConn) Write(f func(fd uintptr) bool) error { return c.Read(f) }

// Close wakes the calls blocked on the socket (shutdown), waits for them
// and closes the descriptor. Closing again returns net.ErrClosed.
func (c *sysConn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	// On an unconnected socket shutdown fails with ENOTCONN but still marks
	// it shut down and wakes every waiter.
	unix.Shutdown(c.fd, unix.SHUT_RDWR)
	c.ops.Lock()
	defer c.ops.Unlock()
	c.cleanup.Stop()
	return unix.Close(c.fd)
}
