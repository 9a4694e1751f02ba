//go:build linux

package udp

import (
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// errWatch reads the ICMP errors of a SocketLink's send sockets. The
// sockets have IP_RECVERR (IPV6_RECVERR): Linux queues each ICMP error for
// a datagram they sent on their error queue (without it an unconnected
// UDP socket never hears of them) and flags the socket with POLLERR. The
// send sockets are blocking and outside Go's poller (see fdConn), so they
// are watched through an epoll instance of their own, which is in Go's
// poller: a goroutine waits on it without holding a thread, and drains
// the error queue of each socket it reports.
type errWatch struct {
	ep      *os.File // the epoll descriptor, non-blocking, in Go's poller
	epfd    int
	mu      sync.Mutex
	socks   map[int32]*fdConn
	handler atomic.Pointer[func(*ICMPError)]
	count   atomic.Uint64 // ICMP errors read
	done    chan struct{}
}

// newErrWatch starts watching. It refers to no link (a link dropped
// without Close is collected, and its cleanup stops the watcher).
func newErrWatch() (*errWatch, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll nonblock: %w", err)
	}
	w := &errWatch{ep: os.NewFile(uintptr(epfd), "udp-errqueue"), epfd: epfd, socks: map[int32]*fdConn{},
		done: make(chan struct{})}
	go w.loop()
	return w, nil
}

// add watches c's error queue.
func (w *errWatch) add(c *fdConn) error {
	return c.Control(func(fd uintptr) {
		w.mu.Lock()
		w.socks[int32(fd)] = c
		w.mu.Unlock()
		// EPOLLERR is reported whether asked for or not; asking for
		// nothing else keeps ordinary traffic out.
		unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, int(fd), &unix.EpollEvent{Events: unix.EPOLLERR, Fd: int32(fd)})
	})
}

// close stops the watcher and waits for it (before the sockets close, so
// that no descriptor number is reused under it). Closing twice is
// harmless.
func (w *errWatch) close() {
	w.ep.Close()
	<-w.done
	// The handler (a device's) refers back to the link, which the
	// link's cleanup keeps w alive for: dropping it lets both go.
	w.handler.Store(nil)
	w.mu.Lock()
	w.socks = map[int32]*fdConn{}
	w.mu.Unlock()
}

func (w *errWatch) loop() {
	defer close(w.done)
	rc, err := w.ep.SyscallConn()
	if err != nil {
		return
	}
	var evs [16]unix.EpollEvent
	buf := make([]byte, 512)
	oob := make([]byte, 512)
	rc.Read(func(fd uintptr) bool {
		n, err := unix.EpollWait(int(fd), evs[:], 0)
		if err != nil || n <= 0 {
			return false // wait until the epoll descriptor is readable
		}
		for _, ev := range evs[:n] {
			w.mu.Lock()
			c := w.socks[ev.Fd]
			w.mu.Unlock()
			if c != nil {
				w.drain(c, buf, oob)
			}
		}
		return false // until Close
	})
}

// drain reads c's error queue to the end and reports each ICMP error.
func (w *errWatch) drain(c *fdConn, buf, oob []byte) {
	c.Control(func(fd uintptr) {
		for i := 0; i < 1024; i++ { // bounded: the queue is bounded by the socket's receive buffer
			n, oobn, _, from, err := unix.Recvmsg(int(fd), buf, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
			if err != nil {
				return // EAGAIN: drained
			}
			var dst netip.Addr
			switch sa := from.(type) {
			case *unix.SockaddrInet4:
				dst = netip.AddrFrom4(sa.Addr)
			case *unix.SockaddrInet6:
				dst = netip.AddrFrom16(sa.Addr).Unmap()
			}
			e, ok := parseErrQueue(dst, buf[:n], oob[:oobn])
			if !ok {
				continue
			}
			w.count.Add(1)
			if h := w.handler.Load(); h != nil {
				(*h)(e)
			}
		}
	})
}

// parseErrQueue makes an ICMPError of one message read from an error
// queue: dst its name (the bounced packet's destination), payload its
// data (the packet's quoted UDP payload), oob its control messages. It
// reports false when no IP_RECVERR / IPV6_RECVERR message describes an
// ICMP error. It never panics on any input.
func parseErrQueue(dst netip.Addr, payload, oob []byte) (*ICMPError, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, false
	}
	for _, m := range msgs {
		if !(m.Header.Level == unix.SOL_IP && m.Header.Type == unix.IP_RECVERR) &&
			!(m.Header.Level == unix.SOL_IPV6 && m.Header.Type == unix.IPV6_RECVERR) {
			continue
		}
		e := &ICMPError{Dst: dst}
		if !parseExtendedErr(m.Data, e) {
			return nil, false
		}
		e.Payload = append([]byte(nil), payload...)
		return e, true
	}
	return nil, false
}

// icmpRetryBudget reports errnos a send returns because an ICMP error
// arrived for an earlier datagram (IP_RECVERR sets the socket's error; the
// datagram of the failed call was not sent, and is sent again): it is how many consecutive failed calls (no datagram sent
// in between) a send retries for errno e. ECONNREFUSED comes only from an
// ICMP port unreachable, never from the local route, and a burst of them
// fails as many calls as the error queue held errors (each read of the
// queue re-arms the socket's error with the next one), so its budget is
// large; the others can also be the route's own and persist, so a few.
func icmpRetryBudget(e syscall.Errno) int {
	switch e {
	case unix.ECONNREFUSED:
		return 4096
	case unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.ENONET, unix.EPROTO:
		return 8
	}
	return 0
}
