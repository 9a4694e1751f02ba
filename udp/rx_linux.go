//go:build linux

package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rxConn is a receive socket outside Go's network poller, waited for
// through a private epoll instance that is in the poller, and in that
// instance only while the receiver keeps waiting. It implements
// syscall.RawConn (Control and Read) for the mmsg plumbing.
//
// Why not the poller directly: the poller registers a socket for good, so
// every datagram that arrives runs the epoll callback, and whenever a thread
// is parked in epoll_wait (on two cores there nearly always is one) the
// callback wakes it: an inter-processor wakeup per datagram, paid by whoever
// delivers the datagram (on loopback, the sending thread), even while the
// receiver is busy and never waits. In a VM each such wakeup is an expensive
// exit. perf on BenchmarkLinkVsRaw/plain counted 16 context switches per 64
// packets for the Link against one for the raw socket, and the Link's
// exchange took 1.5 times as long.
//
// So the socket joins the private instance ep (level-triggered EPOLLIN)
// only when a Read finds it empty, and leaves again after leaveAfter Reads
// in a row found data without waiting: a busy receiver is in no epoll set,
// so arriving datagrams wake nobody, while a receiver that waits for every
// packet (a ping-pong) stays in the set and pays nothing extra per wait.
// Every receive attempt made while the socket is in ep runs inside ep's
// Read callback, after the poller has reset ep's readiness, so a datagram
// that arrives before the attempt is received and one that arrives after
// it wakes the waiter: no wakeup is lost.
type rxConn struct {
	sock *fdConn         // the receive socket; only non-blocking calls run on it
	ep   *os.File        // epoll instance, in Go's poller; holds sock while member
	erc  syscall.RawConn // ep's RawConn

	ev      unix.EpollEvent        // EPOLLIN for sock
	member  bool                   // sock is in ep
	streak  int                    // Reads in a row that did not wait, while member
	f       func(fd uintptr) bool  // the running Read's callback (for waitFn)
	calls   int                    // waitFn calls in the running Read
	waitFn  func(efd uintptr) bool // c.waitCall, bound once
	leaveFn func(efd uintptr)      // c.leaveCall, bound once
	waitErr error                  // error of waitFn or leaveFn

	closed atomic.Bool
	waits  atomic.Uint64 // Reads that had to wait (tests)
	wake   atomic.Bool   // Wake was called: the running or next wait returns errWoken
}

// errWoken is what Read returns when Wake interrupted its wait (or its
// busy polling): no datagram was received.
var errWoken = errors.New("udp: receive woken")

// leaveAfter is how many Reads in a row must find data without waiting
// before the socket leaves the epoll set.
const leaveAfter = 4

var _ syscall.RawConn = (*rxConn)(nil)

// openRecvSocket opens a socket for receiving (see openSocket for the
// arguments and errors) and wraps it in an rxConn.
func openRecvSocket(ap netip.AddrPort, typ, proto int, set func(fd int) error) (*rxConn, error) {
	sock, err := openSocket(ap, typ, proto, set)
	if err != nil {
		return nil, err
	}
	c, err := newRxConn(sock)
	if err != nil {
		sock.Close()
		return nil, err
	}
	return c, nil
}

// newRxConn wraps sock, a socket that only receives. On error sock is left
// open.
func newRxConn(sock *fdConn) (*rxConn, error) {
	efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(efd, true); err != nil {
		unix.Close(efd)
		return nil, fmt.Errorf("epoll fd non-blocking: %w", err)
	}
	c := &rxConn{sock: sock, ev: unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(sock.fd)}}
	// A non-blocking descriptor given to os.NewFile goes into the poller.
	c.ep = os.NewFile(uintptr(efd), "rocev2-rx-epoll")
	if c.erc, err = c.ep.SyscallConn(); err != nil {
		c.ep.Close()
		return nil, fmt.Errorf("epoll fd: %w", err)
	}
	c.waitFn = c.waitCall
	c.leaveFn = c.leaveCall
	return c, nil
}

// Control runs f on the receive socket's descriptor (syscall.RawConn).
func (c *rxConn) Control(f func(fd uintptr)) error { return c.sock.Control(f) }

// Write is not supported: the socket only receives.
func (c *rxConn) Write(func(fd uintptr) bool) error {
	return errors.New("udp: receive socket does not send")
}

// Read calls f (a non-blocking receive) until it reports done, waiting
// for the socket to become readable in between (syscall.RawConn). After
// Close it returns net.ErrClosed. Calls must not overlap (the links hold
// their receive mutex).
func (c *rxConn) Read(f func(fd uintptr) bool) error {
	if !c.member {
		if done, err := c.sock.once(f); err != nil || done {
			return err
		}
	}
	c.f, c.calls, c.waitErr = f, 0, nil
	err := c.erc.Read(c.waitFn)
	c.f = nil
	if err == nil {
		err = c.waitErr
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) && c.woken() {
			return errWoken
		}
		return c.closedOr(err)
	}
	if c.calls > 1 {
		c.waits.Add(1)
		c.streak = 0
		return nil
	}
	return c.noWait()
}

// noWait counts a receive that did not wait; after leaveAfter in a row the
// socket leaves the epoll set.
func (c *rxConn) noWait() error {
	if !c.member {
		return nil
	}
	if c.streak++; c.streak < leaveAfter {
		return nil
	}
	c.streak = 0
	c.waitErr = nil
	if err := c.erc.Control(c.leaveFn); err != nil {
		return c.closedOr(err)
	}
	if c.waitErr != nil {
		return c.closedOr(c.waitErr)
	}
	return nil
}

// Wake makes a Read that waits (or the next one to wait) return errWoken
// without a datagram: it sets the flag and moves the epoll instance's read
// deadline into the past, which ends the poller's wait at once. The Read
// that reports the wake-up clears the flag and the deadline. A Wake that
// meets no waiting Read costs the next Read that would wait one early
// return. Safe to call from any goroutine.
func (c *rxConn) Wake() {
	if c.wake.Swap(true) {
		return // already pending
	}
	c.ep.SetReadDeadline(time.Unix(1, 0))
}

// woken reports whether a Wake is pending and, if so, consumes it and
// clears the read deadline it set.
func (c *rxConn) woken() bool {
	if !c.wake.Swap(false) {
		return false
	}
	c.ep.SetReadDeadline(time.Time{})
	// A Wake after the Swap found the flag clear and moved the deadline
	// into the past — possibly before the line above cleared it. Put it
	// back: a pending Wake always has its deadline in the past. (Clearing
	// the flag after the deadline, as this once did, lost a Wake made in
	// between: it saw the flag still set and left the deadline alone.)
	if c.wake.Load() {
		c.ep.SetReadDeadline(time.Unix(1, 0))
	}
	return true
}

// wakePending reports whether a Wake is pending (the busy-poll loop of
// mmsgState.poll gives up on it, so that the Read that follows returns).
func (c *rxConn) wakePending() bool { return c.wake.Load() }

// polled is noWait for a receive made by busy polling through Control
// (mmsgState.poll), which bypasses Read. An error (a closed link) is left
// to the next Read to report.
func (c *rxConn) polled() { c.noWait() }

// waitCall runs in ep's Read, after the poller reset ep's readiness: it
// makes the socket a member of ep if it is not, then tries the receive.
func (c *rxConn) waitCall(efd uintptr) bool {
	c.calls++
	if !c.member {
		if err := c.epollCtl(efd, unix.EPOLL_CTL_ADD, "add"); err != nil {
			c.waitErr = err
			return true
		}
		c.member = true
	}
	done, err := c.sock.once(c.f)
	if err != nil {
		c.waitErr = err
		return true
	}
	return done
}

// leaveCall takes the socket out of ep (runs in ep's Control).
func (c *rxConn) leaveCall(efd uintptr) {
	c.waitErr = c.epollCtl(efd, unix.EPOLL_CTL_DEL, "del")
	c.member = false
}

// epollCtl adds the socket to, or removes it from, the epoll instance efd.
func (c *rxConn) epollCtl(efd uintptr, op int, name string) (err error) {
	if cerr := c.sock.Control(func(fd uintptr) {
		if e := unix.EpollCtl(int(efd), op, int(fd), &c.ev); e != nil {
			err = fmt.Errorf("epoll_ctl %s: %w", name, e)
		}
	}); cerr != nil {
		return cerr
	}
	return err
}

// closedOr returns net.ErrClosed once c is closed, else err.
func (c *rxConn) closedOr(err error) error {
	if c.closed.Load() || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// Close wakes a waiting Read (it returns net.ErrClosed), closes the epoll
// instance and then the socket. A second Close returns net.ErrClosed.
func (c *rxConn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	// ep.Close wakes a Read waiting for ep and waits for the calls on ep
	// in flight; the socket's Close then waits for those on the socket.
	c.ep.Close()
	return c.sock.Close()
}
