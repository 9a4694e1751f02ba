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

// rxConn is a receive socket outside Go's network poller that joins the
// poller only while the receiver keeps waiting. It implements
// syscall.RawConn (Control and Read) for the mmsg plumbing.
//
// Why not the poller for good: the poller registers a socket for the
// socket's life, so every datagram that arrives runs the epoll callback,
// and whenever a thread is parked in epoll_wait (on two cores there nearly
// always is one) the callback wakes it: an inter-processor wakeup per
// datagram, paid by whoever delivers the datagram (on loopback, the sending
// thread), even while the receiver is busy and never waits. In a VM each
// such wakeup is an expensive exit. perf on BenchmarkLinkVsRaw/plain counted
// 16 context switches per 64 packets for the Link against one for the raw
// socket, and the Link's exchange took 1.5 times as long.
//
// So the socket (non-blocking; every receive call is one attempt) joins
// Go's poller only when a Read finds it empty: a duplicate of its
// descriptor is opened as an os.File, which registers it with the poller
// (edge-triggered, as every Go socket), and the Read waits on that file.
// After leaveAfter Reads in a row found data without waiting, the
// duplicate is closed, which takes the socket out of the poller again: a
// busy receiver is in no epoll set, so arriving datagrams wake nobody,
// while a receiver that waits for every packet (a ping-pong) stays
// registered and pays per wait exactly what a plain net.UDPConn pays.
// A receiver that waits every few Reads (the requester of a stream of
// READs, whose responses come in bursts) would leave and join again
// every time, five system calls a round (the dup, os.NewFile's F_GETFL,
// two epoll_ctl and the close) and the os.File; so a socket that must
// join again within fewer Reads than the streak that made it leave
// doubles that streak (up to leaveMax), and one that stayed out at
// least that long halves it again (down to leaveAfter).
// (This used to be a private epoll instance, itself in the poller, that
// held the socket while a receiver waited; the nested instance cost every
// wakeup a second epoll callback and every poll a nested scan, ~10 % of an
// 8-byte ping-pong's round trip.) Every receive attempt made while the
// socket is registered runs inside the file's Read callback, after the
// poller reset its readiness, so a datagram that arrives before the
// attempt is received and one that arrives after it wakes the waiter
// (registering a socket that is already readable reports it at once): no
// wakeup is lost.
type rxConn struct {
	sock *fdConn // the receive socket (O_NONBLOCK): attempts outside a wait run on it

	// wf is, while the socket is registered (member), the duplicate of
	// its descriptor in Go's poller; nil otherwise. Only the receiver
	// sets it, Close and Wake read it.
	wf  atomic.Pointer[os.File]
	wrc syscall.RawConn // wf's RawConn (the receiver's)

	member bool                  // wf is open: the socket is in the poller
	streak int                   // Reads in a row that did not wait, while member
	need   int                   // streak after which the socket leaves (leaveAfter to leaveMax)
	out    int                   // Reads since the socket left the poller, while not member
	waited bool                  // the last Read waited for its datagram (receiver only)
	f      func(fd uintptr) bool // the running Read's callback (for waitFn)
	calls  int                   // waitFn calls in the running Read
	waitFn func(fd uintptr) bool // c.waitCall, bound once

	// probe makes the running Read's first attempt a peek (peekEmpty):
	// set when the Read before it waited (see waitCall).
	probe bool

	closed atomic.Bool
	waits  atomic.Uint64 // Reads that had to wait (tests)
	probes atomic.Uint64 // first attempts made as a peek that found the socket empty (tests)
	wake   atomic.Bool   // Wake was called: the running or next wait returns errWoken
}

// errWoken is what Read returns when Wake interrupted its wait (or its
// busy polling): no datagram was received.
var errWoken = errors.New("udp: receive woken")

// leaveAfter is how many Reads in a row must find data without waiting
// before the socket leaves the poller; a socket that joins again soon
// after it left needs up to leaveMax (see rxConn).
const (
	leaveAfter = 4
	leaveMax   = 64
)

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

// newRxConn wraps sock, a socket that only receives, and makes it
// non-blocking. On error sock is left open.
func newRxConn(sock *fdConn) (*rxConn, error) {
	var err error
	if cerr := sock.Control(func(fd uintptr) { err = unix.SetNonblock(int(fd), true) }); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, fmt.Errorf("receive socket non-blocking: %w", err)
	}
	c := &rxConn{sock: sock, need: leaveAfter, out: leaveMax}
	c.waitFn = c.waitCall
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
	c.probe = c.waited
	c.waited = false
	if !c.member {
		c.out++
		if done, err := c.sock.once(f); err != nil || done {
			return err
		}
		if err := c.join(); err != nil {
			return c.closedOr(err)
		}
	}
	c.f, c.calls = f, 0
	var err error
	for {
		err = c.wrc.Read(c.waitFn)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || c.closed.Load() {
			break
		}
		if c.woken() {
			c.f = nil
			return errWoken
		}
		// The deadline is in the past but no Wake is pending: a Wake
		// that was consumed already moved it late (its SetReadDeadline
		// raced with join's or woken's). Clear it and wait on.
		c.clearDeadline()
	}
	c.f = nil
	if err == nil && c.closed.Load() {
		err = net.ErrClosed // f may have seen the shutdown
	}
	if err != nil {
		return c.closedOr(err)
	}
	if c.calls > 1 {
		c.waits.Add(1)
		c.waited = true
		c.streak = 0
		return nil
	}
	c.noWait()
	return nil
}

// join registers the socket with Go's poller: a duplicate of its
// descriptor, opened as an os.File (which, being non-blocking, joins the
// poller). A Wake pending from before is carried over to the new file.
func (c *rxConn) join() error {
	nfd := -1
	var err error
	if cerr := c.sock.Control(func(fd uintptr) { nfd, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("dup receive socket: %w", err)
	}
	f := os.NewFile(uintptr(nfd), "rocev2-rx")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fmt.Errorf("receive socket: %w", err)
	}
	c.wrc = rc
	c.member = true
	c.streak = 0
	if c.out < c.need {
		c.need = min(2*c.need, leaveMax) // back soon: stay longer next time
	} else {
		c.need = max(c.need/2, leaveAfter)
	}
	c.out = 0
	c.wf.Store(f)
	// Close may have run before the Store and missed f; Wake may have
	// found no file to move the deadline of.
	if c.closed.Load() {
		c.leave()
		return net.ErrClosed
	}
	if c.wake.Load() {
		f.SetReadDeadline(time.Unix(1, 0))
	}
	return nil
}

// leave takes the socket out of Go's poller: it closes the duplicate.
func (c *rxConn) leave() error {
	c.member = false
	c.wrc = nil
	if f := c.wf.Swap(nil); f != nil {
		if err := f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("close receive socket duplicate: %w", err)
		}
	}
	return nil
}

// noWait counts a receive that did not wait; after need in a row the
// socket leaves the poller.
func (c *rxConn) noWait() {
	if !c.member {
		return
	}
	if c.streak++; c.streak < c.need {
		return
	}
	c.streak = 0
	// The Read that called this received datagrams: a failing close of
	// the duplicate must not turn them into an error (they would be
	// lost). On Linux close(2) releases the descriptor even when it
	// reports an error, so there is nothing left to undo; a closed link
	// is reported by the next Read.
	c.leave()
}

// Wake makes a Read that waits (or the next one to wait) return errWoken
// without a datagram: it sets the flag and moves the registered file's
// read deadline into the past, which ends the poller's wait at once (a
// socket registered later gets the deadline when it joins). The Read that
// reports the wake-up clears the flag and the deadline. A Wake that meets
// no waiting Read costs the next Read that would wait one early return.
// Safe to call from any goroutine.
func (c *rxConn) Wake() {
	if c.wake.Swap(true) {
		return // already pending
	}
	if f := c.wf.Load(); f != nil {
		f.SetReadDeadline(time.Unix(1, 0)) // fails harmlessly if the receiver just closed it
	}
}

// woken reports whether a Wake is pending and, if so, consumes it and
// clears the read deadline it set. Called by the receiver.
func (c *rxConn) woken() bool {
	if !c.wake.Swap(false) {
		return false
	}
	c.clearDeadline()
	return true
}

// clearDeadline clears the registered file's read deadline, unless a
// Wake is pending. Called by the receiver.
func (c *rxConn) clearDeadline() {
	f := c.wf.Load()
	if f == nil {
		return
	}
	f.SetReadDeadline(time.Time{})
	// A Wake after the flag was consumed found it clear and moved the
	// deadline into the past — possibly before the line above cleared
	// it. Put it back: a pending Wake always has its deadline in the
	// past. (Clearing the flag after the deadline, as this once did, lost
	// a Wake made in between: it saw the flag still set and left the
	// deadline alone.)
	if c.wake.Load() {
		f.SetReadDeadline(time.Unix(1, 0))
	}
}

// wakePending reports whether a Wake is pending (the busy-poll loop of
// mmsgState.poll gives up on it, so that the Read that follows returns).
func (c *rxConn) wakePending() bool { return c.wake.Load() }

// polled is noWait for a receive made by busy polling through Control
// (mmsgState.poll), which bypasses Read. An error (a closed link) is left
// to the next Read to report.
func (c *rxConn) polled() {
	c.waited = false
	if !c.member {
		c.out++
	}
	c.noWait()
}

// waitCall runs in the registered file's Read, after the poller reset
// its readiness: one receive attempt, on the duplicate descriptor (which
// the file keeps open while the Read runs).
//
// When the Read before this one waited (a ping-pong, whose answer is
// rarely there when the receiver comes back for it), the first attempt
// is a peek (peekEmpty): a socket found empty is waited for without the
// full receive call, whose msghdr, iovec and control buffer the kernel
// copies in even to report EAGAIN — ~0.55 µs against ~0.34 µs for the
// peek on this project's 2-vCPU machine, two such attempts per 8-byte
// ping-pong round trip (docs/PERFORMANCE.md, session 30). A peek that
// finds a datagram (or anything but EAGAIN) is followed by the full
// receive in the same call, so nothing is waited for that is already
// there; that costs one extra call, and the Read then did not wait, so
// the next one does not peek.
func (c *rxConn) waitCall(fd uintptr) bool {
	c.calls++
	if c.calls == 1 && c.probe && peekEmpty(fd) {
		c.probes.Add(1)
		return false
	}
	return c.f(fd)
}

// peekEmpty reports whether a non-blocking peek of no bytes on fd finds
// nothing to receive (EAGAIN). Any other outcome — a datagram, an
// error — is left to the full receive that follows: an error a peek
// returns is the socket's pending error (sk_err), which the peek
// consumes; on a receive-only socket without IP_RECVERR that is at most
// the ERESTARTSYS remnant the receive calls treat as EINTR.
func peekEmpty(fd uintptr) bool {
	for {
		_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, fd, 0, 0, unix.MSG_DONTWAIT|unix.MSG_PEEK, 0, 0)
		if e != unix.EINTR {
			return e == unix.EAGAIN
		}
	}
}

// closedOr returns net.ErrClosed once c is closed, else err.
func (c *rxConn) closedOr(err error) error {
	if c.closed.Load() || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// Close wakes a waiting Read (it returns net.ErrClosed), closes the
// registered duplicate and then the socket. A second Close returns
// net.ErrClosed.
func (c *rxConn) Close() error {
	if c.closed.Swap(true) {
		return net.ErrClosed
	}
	// Closing the duplicate wakes a Read waiting on it; the descriptor
	// itself is closed when that Read has left. The socket's Close then
	// waits for the calls in flight on the socket.
	if f := c.wf.Swap(nil); f != nil {
		f.Close()
	}
	return c.sock.Close()
}
