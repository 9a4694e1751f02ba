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
	"time"

	"golang.org/x/sys/unix"
)

// fdConn is a send socket driven with blocking system calls, outside Go's
// network poller; it implements syscall.RawConn for the mmsg plumbing.
//
// Why the links send on their own socket: the poller registers a socket with
// epoll for input and output, edge-triggered. Each datagram a socket sends on
// lo (or a veth) is orphaned right away, which returns its send-buffer space
// (sock_wfree -> sk_write_space) and so runs the epoll callback, which wakes
// a thread parked in epoll_wait — an inter-processor wakeup per packet that
// nobody waits for. perf on BenchmarkLinkVsRaw/plain put ~14 % of the Link's
// send time there and none of the raw socket's. Receiving does not block
// either: a receive socket (rxConn) is read without waiting and waited for
// through Go's poller, whose spinning threads take an arriving datagram with
// less latency than a thread blocked in recvmmsg (an all-blocking variant
// doubled the 8-byte ping-pong RTT of rocev2d bench, 27 -> 60 µs); rxConn
// says how it keeps the poller from being woken per datagram.
//
// Sends block only when the send buffer is full. Close sets the closed flag
// and shuts the socket down, which wakes a blocked call (it then returns
// net.ErrClosed), waits for the calls in flight to leave, and only then
// closes the descriptor, so a number reused by a new socket is never used by
// an old call. SO_SNDTIMEO and SO_RCVTIMEO (pollInterval) bound every
// blocking call as a safety net.
type fdConn struct {
	fd     int
	mu     sync.RWMutex // shared by every call on fd, exclusive for close(2)
	closed atomic.Bool

	// tos is the TOS / traffic class byte the socket sends with when a
	// datagram carries no control message for it (IP_TOS/IPV6_TCLASS
	// socket option), and tosCand, tosRun the TOS other than tos the
	// last run of datagrams asked for and how long that run is; used by
	// SocketLink's sender under its send mutex (see sendTOS).
	tos, tosCand uint8
	tosRun       int
	tosSet       bool // tos was set (until then the kernel's default, 0)
}

// pollInterval bounds each blocking call: after it the call returns EAGAIN
// and Read/Write check for Close before blocking again.
const pollInterval = 200 * time.Millisecond

// openSocket creates a blocking socket of type typ and protocol proto in the
// family of ap, runs set on it, binds it to ap (port 0 for raw sockets) and
// returns it. Errors name the step and wrap the errno, so errors.Is(err,
// syscall.EADDRINUSE) and the like work; the caller adds the address.
func openSocket(ap netip.AddrPort, typ, proto int, set func(fd int) error) (*fdConn, error) {
	a := ap.Addr()
	family := unix.AF_INET
	if a.Is6() && !a.Is4In6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	fail := func(step string, err error) (*fdConn, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", step, err)
	}
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return fail("setsockopt IPV6_V6ONLY", err)
		}
	}
	tv := unix.NsecToTimeval(int64(pollInterval))
	for _, opt := range []int{unix.SO_RCVTIMEO, unix.SO_SNDTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return fail("setsockopt SO_RCVTIMEO/SO_SNDTIMEO", err)
		}
	}
	if set != nil {
		if err := set(fd); err != nil {
			return fail("options", err)
		}
	}
	var sa unix.Sockaddr
	if family == unix.AF_INET {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.Unmap().As4()}
	} else {
		s6 := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
		if z := a.Zone(); z != "" {
			if n, err := strconv.Atoi(z); err == nil {
				s6.ZoneId = uint32(n)
			} else if ifi, err := net.InterfaceByName(z); err == nil {
				s6.ZoneId = uint32(ifi.Index)
			} else {
				return fail("zone "+z, err)
			}
		}
		sa = s6
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	c := &fdConn{fd: fd}
	// A socket whose link was dropped without Close is closed when the
	// garbage collector finds it, as net's sockets are (Close is
	// idempotent, so this is harmless after a Close).
	runtime.SetFinalizer(c, (*fdConn).Close)
	return c, nil
}

// Control runs f on the descriptor (syscall.RawConn).
func (c *fdConn) Control(f func(fd uintptr)) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed.Load() {
		return net.ErrClosed
	}
	f(uintptr(c.fd))
	return nil
}

// Read calls f until it reports done (syscall.RawConn). f makes the blocking
// receive call itself; it reports false on EAGAIN (the SO_RCVTIMEO bound).
// After Close it returns net.ErrClosed, also when f was woken by the
// shutdown.
func (c *fdConn) Read(f func(fd uintptr) (done bool)) error { return c.loop(f) }

// Write is Read for sending (syscall.RawConn).
func (c *fdConn) Write(f func(fd uintptr) (done bool)) error { return c.loop(f) }

func (c *fdConn) loop(f func(fd uintptr) bool) error {
	for {
		if done, err := c.once(f); err != nil || done {
			return err
		}
	}
}

// once calls f once on the descriptor and returns what it reported, or
// net.ErrClosed after Close (also when f was woken by the shutdown).
func (c *fdConn) once(f func(fd uintptr) bool) (done bool, err error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed.Load() {
		return false, net.ErrClosed
	}
	done = f(uintptr(c.fd))
	if c.closed.Load() {
		return false, net.ErrClosed
	}
	return done, nil
}

// Close shuts the socket down (waking blocked calls), waits for the calls in
// flight and closes the descriptor. A second Close returns net.ErrClosed.
func (c *fdConn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	// On an unconnected socket shutdown fails with ENOTCONN but still marks
	// it shut down and wakes every waiter, which is all it is for here.
	unix.Shutdown(c.fd, unix.SHUT_RDWR)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := unix.Close(c.fd); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
