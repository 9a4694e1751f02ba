//go:build linux

package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds the socket plumbing SocketLink and RawLink share.

// sockLink is the part of SocketLink and RawLink that is the same: the
// socket, its batched send and receive state, and the counters.
type sockLink struct {
	rc    syscall.RawConn // receives: an rxConn (non-blocking calls, waits through Go's poller)
	tx    *fdConn         // sends: blocking, outside the poller (see fdConn)
	addr  netip.Addr      // normalised (unmapped, no zone)
	batch int

	sendMu sync.Mutex
	send   mmsgState

	recvMu sync.Mutex
	recv   mmsgState
	kdrops kernelDrops // SO_RXQ_OVFL as the receive path saw it

	counters
}

// kernelDrops accumulates the socket's 32-bit cumulative drop count that
// SO_RXQ_OVFL attaches to received datagrams into a 64-bit total.
type kernelDrops struct {
	last  uint32        // the count last seen (under recvMu)
	total atomic.Uint64 // its 64-bit continuation: total mod 2^32 == last
}

// see takes a count from a received datagram. Called with recvMu held;
// datagrams arrive in queueing order, so the count never goes back
// (differences are taken modulo 2^32).
func (k *kernelDrops) see(v uint32) {
	if d := v - k.last; d != 0 && d < 1<<31 {
		k.last = v
		k.total.Add(uint64(d))
	}
}

// KernelDrops returns the number of datagrams the kernel dropped on the
// receiving socket (full receive buffer) before a datagram that Recv
// received since: the count SO_RXQ_OVFL attaches to each datagram queued
// after a drop, read without a system call. It lags Stats().DropKernel
// (exact, one getsockopt) by the drops after the last datagram received.
// 0 on a RawLink (its packet socket does not report them this way).
func (l *sockLink) KernelDrops() uint64 { return l.kdrops.total.Load() }

// init sets l up in place for receiving on rc and sending on tx, for
// address addr, batch messages per call, sendIovs iovecs per sent message.
func (l *sockLink) init(rc syscall.RawConn, tx *fdConn, addr netip.Addr, batch, sendIovs int) {
	l.rc, l.tx, l.addr, l.batch = rc, tx, addr, batch
	l.send.init(batch, sendIovs, unix.SYS_SENDMMSG)
	l.recv.init(batch, 1, unix.SYS_RECVMMSG)
}

// LocalAddr returns the bound address (IPv4-mapped addresses unmapped).
func (l *sockLink) LocalAddr() netip.Addr { return l.addr }

// BatchSize returns the number of datagrams per sendmmsg/recvmmsg call.
func (l *sockLink) BatchSize() int { return l.batch }

// Stats returns a snapshot of the link's counters. DropKernel is the
// receive socket's drop count at this moment (SO_MEMINFO, one
// getsockopt), continued past 2^32 with the count the receive path saw
// (KernelDrops).
func (l *sockLink) Stats() Stats {
	st := l.stats()
	seen := l.kdrops.total.Load()
	st.DropKernel = seen
	if l.rc != nil { // nil in a link that was never opened (tests, fuzzing)
		l.rc.Control(func(fd uintptr) {
			if now, ok := socketDrops(fd); ok {
				st.DropKernel = reconcileDrops(seen, now)
			}
		})
	}
	return st
}

// RecvBacklog reports whether datagrams wait unread in the receive
// socket (SIOCINQ: the size of the next one, not 0 when one is there).
func (l *sockLink) RecvBacklog() bool {
	if l.rc == nil {
		return false
	}
	n := 0
	l.rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			n = v
		}
	})
	return n > 0
}

// reconcileDrops returns the 64-bit drop count whose low 32 bits are now
// (the socket's count, which wraps) and which is not below seen (the
// 64-bit count received datagrams reported earlier).
func reconcileDrops(seen uint64, now uint32) uint64 {
	return seen + uint64(now-uint32(seen))
}

// socketDrops returns the socket's count of datagrams dropped on receive
// (SK_MEMINFO_DROPS of SO_MEMINFO); false if the kernel does not say.
func socketDrops(fd uintptr) (uint32, bool) {
	const skMeminfoDrops = 8 // index in the u32 array (include/uapi/linux/sock_diag.h)
	var mi [16]uint32
	n := uint32(unsafe.Sizeof(mi))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&mi[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 || n < (skMeminfoDrops+1)*4 {
		return 0, false
	}
	return mi[skMeminfoDrops], true
}

// errRestartSys is ERESTARTSYS (512), a kernel-internal errno that Linux
// (6.1 at least) can hand to user space through recvmmsg: a blocking
// recvmmsg interrupted by a signal (Go preempts goroutines with SIGURG)
// after it received some datagrams returns those and leaves -ERESTARTSYS in
// the socket's sk_err, which the next call on the socket returns. The links
// never block in recvmmsg, but treat it like EINTR all the same.
const errRestartSys = unix.Errno(512)

// mmsgState is the preallocated argument block of one sendmmsg or recvmmsg
// caller, plus the in/out values of the RawConn callback (kept in the
// struct so the callback is one method value bound at init, not allocated
// per call).
type mmsgState struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	ctrl  []byte                  // cmsgSpace per message

	segs []int // send: packets in each message (1, or a GSO group)

	usedIovs int    // send: iovecs the last buildSend filled (cleared after the send)
	calls    uint64 // send: system calls made (tests)

	trap  uintptr               // unix.SYS_SENDMMSG or unix.SYS_RECVMMSG
	flags uintptr               // 0 to send (blocking), MSG_DONTWAIT to receive
	fn    func(fd uintptr) bool // s.call
	ctl   func(fd uintptr)      // s.fn for RawConn.Control, result in ctlDone (bound once: no allocation per try)

	ctlDone bool

	spin     time.Duration // receive: busy-poll this long before waiting (SocketOptions.BusyPoll)
	spinHits uint64        // receive: calls served by busy polling (tests)

	off, cnt int        // messages hdrs[off:cnt] still to transfer
	n        int        // result: messages transferred by the last call
	errno    unix.Errno // result: error of the last call
}

// init sets s up in place for batch messages of iovPerMsg iovecs each,
// transferred with trap (unix.SYS_SENDMMSG or unix.SYS_RECVMMSG).
func (s *mmsgState) init(batch, iovPerMsg int, trap uintptr) {
	*s = mmsgState{
		hdrs:  make([]unix.Mmsghdr, batch),
		iovs:  make([]unix.Iovec, batch*iovPerMsg),
		names: make([]unix.RawSockaddrInet6, batch),
		ctrl:  make([]byte, batch*cmsgSpace),
		segs:  make([]int, batch),
		trap:  trap,
	}
	if trap == unix.SYS_RECVMMSG {
		s.flags = unix.MSG_DONTWAIT // rxConn waits
	}
	for i := range s.hdrs {
		h := &s.hdrs[i].Hdr
		h.Iov = &s.iovs[i*iovPerMsg]
		h.SetIovlen(iovPerMsg)
		h.Name = (*byte)(unsafe.Pointer(&s.names[i]))
		s.segs[i] = 1
	}
	s.fn = s.call
	s.ctl = func(fd uintptr) { s.ctlDone = s.fn(fd) }
}

// call is the RawConn callback: one sendmmsg/recvmmsg of hdrs[off:cnt] —
// blocking on a send socket (fdConn), non-blocking on a receive socket
// (rxConn). It reports false (wait and retry) on EAGAIN: the receive
// socket is empty, or a send socket's timeout (pollInterval) expired.
//
// The non-blocking calls — every receive, and a first attempt of every
// send — are raw system calls (RawSyscall), without the runtime's
// entersyscall/exitsyscall around them: a call that cannot block needs no
// hand-off of its P, and in a VM, where a system call already costs
// 1–2 µs, that bookkeeping added about half as much again to each call
// (an 8-byte ping-pong makes about eight per round trip). A send that
// would block (a full send buffer: EAGAIN) is made again as a blocking
// call, with the runtime told, so the P is handed off while it waits.
func (s *mmsgState) call(fd uintptr) bool {
	one := s.cnt-s.off == 1
	n, e := s.sys(fd, one, s.flags|unix.MSG_DONTWAIT, true)
	if e == unix.EAGAIN && s.flags&unix.MSG_DONTWAIT == 0 {
		n, e = s.sys(fd, one, s.flags, false)
	}
	if e == unix.EAGAIN {
		return false
	}
	s.errno = e
	s.n = int(n)
	if e != 0 {
		s.n = 0
	} else if one {
		s.hdrs[s.off].Len = uint32(n) // bytes, as the mmsg calls report them
		s.n = 1
	}
	return true
}

// sys makes the system call of call with flags: raw (RawSyscall, for a
// call that cannot block) or blocking (Syscall), retried on EINTR.
func (s *mmsgState) sys(fd uintptr, one bool, flags uintptr, raw bool) (uintptr, unix.Errno) {
	trap, a1, a2, a3, a4, a5 := s.trap, uintptr(unsafe.Pointer(&s.hdrs[s.off])), uintptr(s.cnt-s.off), flags, uintptr(0), uintptr(0)
	if one {
		// One message: sendmsg/recvmsg, which skip the batch loop (and,
		// for recvmmsg, its timeout handling) of the mmsg calls; or
		// sendto for one buffer without control data, which also skips
		// copying in the msghdr and iovec.
		h := &s.hdrs[s.off].Hdr
		switch {
		case s.trap == unix.SYS_RECVMMSG:
			trap, a1, a2, a3 = unix.SYS_RECVMSG, uintptr(unsafe.Pointer(h)), flags, 0
		case h.Iovlen == 1 && h.Controllen == 0:
			trap, a1, a2, a3, a4, a5 = unix.SYS_SENDTO, uintptr(unsafe.Pointer(h.Iov.Base)), uintptr(h.Iov.Len),
				flags, uintptr(unsafe.Pointer(h.Name)), uintptr(h.Namelen)
		default:
			trap, a1, a2, a3 = unix.SYS_SENDMSG, uintptr(unsafe.Pointer(h)), flags, 0
		}
	}
	for {
		var n uintptr
		var e unix.Errno
		if raw {
			n, _, e = unix.RawSyscall6(trap, fd, a1, a2, a3, a4, a5)
		} else {
			n, _, e = unix.Syscall6(trap, fd, a1, a2, a3, a4, a5)
		}
		if e != unix.EINTR && e != errRestartSys {
			return n, e
		}
	}
}

// send transmits the prepared messages hdrs[:nmsg] on rc, sendmmsg after
// sendmmsg, and adds the packets (segs) of each call to sent. It returns
// how many packets went out. On failure err is the RawConn's error (then
// s.errno is 0), or s.errno when a sendmmsg failed (at message s.off).
func (s *mmsgState) send(rc syscall.RawConn, nmsg int, sent *atomic.Uint64) (done int, err error) {
	s.off, s.cnt = 0, nmsg
	s.errno = 0
	// count adds the messages the last call sent to done and sent.
	count := func() {
		k := 0
		for m := s.off; m < s.off+s.n; m++ {
			k += s.segs[m]
		}
		done += k
		sent.Add(uint64(k))
		s.off += s.n
	}
	icmpRetries := 0
	for s.off < s.cnt {
		s.n = 0
		s.calls++
		if err := rc.Write(s.fn); err != nil {
			// The RawConn's error (net.ErrClosed) wins: an fdConn's call
			// woken by Close's shutdown fails with EPIPE, which is no error
			// of the packet. A call that sent before the socket was
			// closed under it still counts what left.
			if s.errno == 0 && s.n > 0 {
				count()
			}
			s.errno = 0
			return done, err
		}
		if s.errno != 0 {
			if s.trap == unix.SYS_SENDMMSG && icmpRetries < icmpRetryBudget(s.errno) {
				// An ICMP error for an earlier datagram (IP_RECVERR)
				// failed this call, not this datagram: the socket's
				// error is cleared now; send it again.
				icmpRetries++
				s.errno = 0
				continue
			}
			return done, s.errno
		}
		if s.n > 0 {
			// Progress: each ICMP error fails one call only, so the
			// budget bounds consecutive failures, not a batch's total
			// (25 strays to a closed port bounce 25 errors).
			icmpRetries = 0
		}
		count()
	}
	return done, nil
}

// prepRecv readies message i for recvmmsg into buf, with a control buffer
// when ctrl.
func (s *mmsgState) prepRecv(i int, buf []byte, ctrl bool) {
	s.iovs[i].Base = &buf[0]
	s.iovs[i].SetLen(len(buf))
	h := &s.hdrs[i].Hdr
	h.Namelen = unix.SizeofSockaddrInet6
	if ctrl {
		c := s.ctrl[i*cmsgSpace : (i+1)*cmsgSpace]
		h.Control = &c[0]
		h.SetControllen(cmsgSpace)
	} else {
		h.Control = nil
		h.SetControllen(0)
	}
	h.Flags = 0
	s.hdrs[i].Len = 0
}

// fixRecv points message i's iovec at buf and its control buffer at its
// slot, for good: a receive state whose messages always receive into the
// same buffers (a GRO link's) is set up once, and readied for each call
// with resetRecv alone.
func (s *mmsgState) fixRecv(i int, buf []byte) {
	s.iovs[i].Base = &buf[0]
	s.iovs[i].SetLen(len(buf))
	h := &s.hdrs[i].Hdr
	h.Control = &s.ctrl[i*cmsgSpace]
	s.resetRecv(i)
}

// resetRecv readies message i, which fixRecv set up, for the next
// recvmmsg: the fields the kernel wrote back (name and control lengths,
// flags, length) get their sizes again; prepRecv's iovec and control
// pointers are left as fixRecv set them.
func (s *mmsgState) resetRecv(i int) {
	m := &s.hdrs[i]
	m.Hdr.Namelen = unix.SizeofSockaddrInet6
	m.Hdr.SetControllen(cmsgSpace)
	m.Hdr.Flags = 0
	m.Len = 0
}

// recv waits for datagrams on rc and receives up to k of them into the
// messages hdrs[:k] readied by prepRecv; s.n tells how many arrived. A
// closed socket gives net.ErrClosed; other errors start with prefix
// ("udp: " or "udp: raw ") and name the local address.
func (s *mmsgState) recv(rc syscall.RawConn, k int, prefix string, local netip.Addr) error {
	s.off, s.cnt = 0, k
	if s.spin == 0 || !s.poll(rc) {
		if err := rc.Read(s.fn); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return net.ErrClosed
			}
			if err == errWoken {
				s.n = 0
				return errWoken
			}
			return fmt.Errorf("%srecv: %w", prefix, err)
		}
	}
	if s.errno != 0 {
		return fmt.Errorf("%srecvmmsg on %v: %w", prefix, local, s.errno)
	}
	return nil
}

// poll tries the receive without blocking until it succeeds or s.spin has
// passed, yielding the processor between tries, and reports whether it
// received (or failed: s.errno). On a closed socket it gives up at once and
// leaves the error to the waiting path.
func (s *mmsgState) poll(rc syscall.RawConn) bool {
	var deadline time.Time
	for {
		s.ctlDone = false
		if rc.Control(s.ctl) != nil {
			return false
		}
		if s.ctlDone {
			s.spinHits++
			if n, ok := rc.(pollNoter); ok {
				n.polled()
			}
			return true
		}
		if w, ok := rc.(wakeNoter); ok && w.wakePending() {
			return false // the Read that follows reports the wake-up
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(s.spin)
		} else if now.After(deadline) {
			return false
		}
		runtime.Gosched()
	}
}

// try makes one non-blocking receive attempt into the messages hdrs[:k]
// readied by prepRecv and reports whether it received (s.n tells how many
// arrived). Errors are as recv's.
func (s *mmsgState) try(rc syscall.RawConn, k int, prefix string, local netip.Addr) (bool, error) {
	s.off, s.cnt = 0, k
	s.ctlDone = false
	if err := rc.Control(s.ctl); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return false, net.ErrClosed
		}
		return false, fmt.Errorf("%srecv: %w", prefix, err)
	}
	if !s.ctlDone {
		s.n = 0
		return false, nil
	}
	if s.errno != 0 {
		return false, fmt.Errorf("%srecvmmsg on %v: %w", prefix, local, s.errno)
	}
	if n, ok := rc.(pollNoter); ok {
		n.polled()
	}
	return true, nil
}

// wakeNoter is implemented by a receive RawConn that can be woken
// (rxConn.Wake): busy polling stops when a wake-up is pending.
type wakeNoter interface{ wakePending() bool }

// pollNoter is implemented by a receive RawConn that wants to know of
// receives made by polling (through Control) rather than through Read
// (rxConn: they count as receives that did not wait).
type pollNoter interface{ polled() }

// clearIovs drops the references iovs[:n] hold to the caller's buffers.
func (s *mmsgState) clearIovs(n int) {
	for i := range n {
		s.iovs[i].Base = nil
	}
}

// dropAll is a classic BPF program that drops every packet.
var dropAll = []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}

// attachFilter attaches the classic BPF program prog to the socket fd.
func attachFilter(fd int, prog []unix.SockFilter) error {
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		return fmt.Errorf("setsockopt SO_ATTACH_FILTER: %w", err)
	}
	return nil
}

// setBuffers sets SO_RCVBUF and SO_SNDBUF, with SO_RCVBUFFORCE /
// SO_SNDBUFFORCE when the process may (so the sysctl limits do not cap them).
func setBuffers(fd, rcv, snd int) error {
	for _, b := range []struct {
		force, opt, v int
		name          string
	}{
		{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, rcv, "SO_RCVBUF"},
		{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, snd, "SO_SNDBUF"},
	} {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, b.force, b.v) == nil {
			continue
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, b.opt, b.v); err != nil {
			return fmt.Errorf("setsockopt %s=%d: %w", b.name, b.v, err)
		}
	}
	return nil
}

// socketDefaults replaces zero or negative buffer sizes and batch size with
// the defaults (8 MiB, 64 messages).
func socketDefaults(rcvBuf, sndBuf, batch *int) {
	for _, v := range []*int{rcvBuf, sndBuf} {
		if *v <= 0 {
			*v = defaultSocketBuf
		}
	}
	if *batch <= 0 {
		*batch = defaultSocketBatch
	}
}

// closeErr is Close's result for err from closing the link's socket: nil
// when the socket was closed already.
func closeErr(err error, what string, local netip.Addr) error {
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("udp: %s %v: %w", what, local, err)
	}
	return nil
}
