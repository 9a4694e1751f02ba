//go:build linux

package udp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/udp/share"
)

const (
	defaultSocketBuf   = 8 << 20
	defaultSocketBatch = 64
	// cmsgSpace is the control buffer per message: IP_TOS / IPV6_TCLASS,
	// UDP_SEGMENT / UDP_GRO and SO_RXQ_OVFL take unix.CmsgSpace(4) = 24
	// bytes each on 64-bit.
	cmsgSpace = 96

	groBufSize = 65536 // one coalesced UDP datagram at most
)

// SocketLink is a Link over kernel UDP sockets (Linux): one bound to
// addr:4791 receives, others send (see fdConn for why they are separate).
//
// Sending: the send sockets are never connected and have IP_MTU_DISCOVER =
// IP_PMTUDISC_DO, so Linux sends every IPv4 datagram with DF and
// identification 0; the ICRC is computed for exactly that header. By default
// all datagrams leave from one source port, chosen by the kernel when the
// link opens (SendPort) and stable for its life, and Packet.SrcPort is
// ignored — RoCEv2 peers (Linux rxe, RNICs) accept any source port and always
// answer to 4791; the cost is that all QPs form one flow for ECMP and RSS.
// With SocketOptions.SourcePorts each packet leaves from its SrcPort. Send
// sets each Packet.SrcPort to the port the packet really left from.
// Packet.TOS is sent as ancillary data (IP_TOS / IPV6_TCLASS). Optional UDP
// GSO (SocketOptions.GSO) batches same-size runs into one datagram.
//
// Receiving: a UDP socket does not see the IP header. IPv6 packets are
// verified fully (the pseudo header is all known); IPv6 datagrams with UDP
// checksum 0, which rxe sends, are accepted (UDP_NO_CHECK6_RX). For IPv4 the
// identification and flags are unknown, so the ICRC is solved for the
// identification that makes it valid (icrc.SolveIPv4ID), with DF, which
// rxe, RNICs and Linux sockets set; a solution without DF is taken only
// from a source learned to send without DF (ipv4IDs), since a corruption
// can pass that solve (soak24: one bit of payload byte 173, in every
// datagram). A random corruption passes the solve with DF with
// probability about 2^-16, and so does every corruption equivalent to a
// change of identification: single-bit flips at a few fixed offsets pass
// it (Stats.DropNoDF counts the without-DF ones dropped).
// TOS/ECN is read with IP_RECVTOS / IPV6_RECVTCLASS.
type SocketLink struct {
	sockLink
	rx     *rxConn // addr:4791, receives (see rxConn)
	txPort uint16  // source port of sockLink.tx (ephemeral)
	is6    bool
	gso    bool
	zc     bool      // zero-copy send (not SocketOptions.NoZeroCopy)
	gro    *groState // nil with SocketOptions.NoGRO

	srcPorts      bool
	bindAddr      netip.Addr // addr with its zone, for source-port sockets
	sndBuf        int
	portsMu       sync.Mutex
	ports         map[uint16]*portSocket // nil after Close; nil value = port unavailable
	portFallbacks atomic.Uint64          // source ports that could not be bound
	netns         *socketNetns           // namespace of rx, for source-port sockets (may be nil)

	groCoalesced atomic.Uint64 // received buffers that held more than one datagram
	inPlace      atomic.Bool   // SetRecvInPlace: GRO segments handed out in place
	deferVerify  atomic.Bool   // SetDeferVerify: Recv leaves the ICRC check to VerifyICRC

	member    *share.Member // the group membership of a shared link; nil if unshared
	misrouted atomic.Uint64 // datagrams of a shared link not for its QPNs (dropped)

	errs *errWatch // the send sockets' ICMP errors (nil if it could not start)

	txFlow flowPrefix // ICRC prefix of the flow sent last (under sendMu)
	rxFlow flowPrefix // ICRC prefix of the flow received last (under recvMu)
	dvFlow flowPrefix // VerifyICRC's (the receiving goroutine's, see DeferVerifyLink)
	dvNext uint16     // VerifyICRC's guess of the next IPv4 identification
	// dvMiss counts VerifyICRC calls whose IPv4 identification was not
	// the one guessed (each cost a solve; tests).
	dvMiss atomic.Uint64

	ids ipv4IDs // which sources send IPv4 datagrams without DF
}

var (
	_ Link            = (*SocketLink)(nil)
	_ SharedLink      = (*SocketLink)(nil)
	_ ZeroCopyLink    = (*SocketLink)(nil)
	_ DeferVerifyLink = (*SocketLink)(nil)
)

// SetDeferVerify(true) makes Recv and TryRecv return packets without
// checking their ICRCs; the caller checks each with VerifyICRC right
// before it uses the packet (DeferVerifyLink). transport.Device turns it
// on: it verifies each packet just before it places its payload in
// registered memory, so that the placement copy reads what the check
// has just brought into the nearest cache, and no byte of a packet whose
// ICRC fails is ever placed.
func (l *SocketLink) SetDeferVerify(on bool) { l.deferVerify.Store(on) }

// VerifyICRC checks the ICRC of a packet Recv or TryRecv returned
// unchecked (SetDeferVerify), as Recv would have (see SocketLink: IPv6
// fully, IPv4 with the identification solved), and reports whether it
// is valid. A failure counts in DropBadICRC and is taken out of
// RcvdPkts.
func (l *SocketLink) VerifyICRC(p *Packet) bool {
	// The usual packet in line: IPv4, of the flow the last one came from,
	// solved with DF, no source learned as sending without DF, no test
	// hook. That is verifyFlow's first case with the same counters; any
	// other packet, and one this does not solve, takes verifyICRC
	// (TestVerifyICRCFastMatches).
	if !l.is6 && len(p.Buf) >= minPacketSize && l.ids.n.Load() == 0 && testHookIPv4ID == nil {
		src, f := normAddr(p.Addr), &l.dvFlow
		if f.srcPort == p.SrcPort && f.src == src && f.dst == l.addr && src.IsValid() {
			guess := l.dvNext
			if l.groStart(p.Buf) {
				guess = 0
			}
			if id, ok := f.p.SolveIPv4IDFrom(guess, p.Buf); ok {
				if id != guess {
					l.dvMiss.Add(1)
				}
				l.dvNext = id + 1
				return true
			}
		}
	}
	return l.verifyICRC(p)
}

// verifyICRC is VerifyICRC for any packet.
func (l *SocketLink) verifyICRC(p *Packet) bool {
	if len(p.Buf) < minPacketSize {
		l.malformed.Add(1)
		l.rcvd.Add(^uint64(0))
		return false
	}
	// The segments of a GSO datagram arrive in order with
	// identifications 0, 1, 2, ...: the one after the last is the best
	// guess, except for a packet that starts a GRO buffer (handed out in
	// place): that is the first segment of its datagram, identification
	// 0. Any other is still found, at the cost of a solve (~600
	// instructions): with the one-after-the-last guess alone the first
	// segment of every coalesced datagram paid it — one solve per message
	// of an 8-byte ping-pong (docs/PERFORMANCE.md, session 30).
	guess := l.dvNext
	if l.groStart(p.Buf) {
		guess = 0
	}
	id, ok := l.verifyFlow(&l.dvFlow, nil, p.Buf, normAddr(p.Addr), p.SrcPort, guess)
	if !ok {
		l.rcvd.Add(^uint64(0))
		return false
	}
	if id != guess {
		l.dvMiss.Add(1)
	}
	l.dvNext = id + 1
	return true
}

// groStart reports whether b is a packet the last receive handed out in
// place from the start of a GRO buffer. Called by the goroutine that
// received b (DeferVerifyLink), before the next receive.
func (l *SocketLink) groStart(b []byte) bool {
	g := l.gro
	if g == nil || cap(b) == 0 {
		return false
	}
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(g.mem)))
	return off < uintptr(len(g.mem)) && off%groBufSize == 0
}

// zcIovs is the most iovecs one packet takes in a send: Buf's headers,
// the Payload, Buf's pad and ICRC.
const zcIovs = 3

// ZeroCopy reports whether Send takes packets whose payload is held
// outside Buf (Packet.Payload; on unless SocketOptions.NoZeroCopy): it
// sends them with the payload's iovec pointing at the caller's memory,
// computing the ICRC over it there. The kernel copies the payload into
// its socket buffer during the sendmmsg, so the memory may be reused when
// Send returns.
func (l *SocketLink) ZeroCopy() bool { return l.zc }

// ListenSocket opens a SocketLink on addr, UDP port 4791. addr must be a
// specific address of this host (IPv4, IPv4-mapped IPv6, or IPv6; a zone is
// kept for link-local addresses). opts may be nil, the zero SocketOptions.
//
// By default (SocketOptions.Share) the link shares addr:4791 with the
// links of other processes where this process may load the steering
// program (see Shared and package udp/share).
//
// Errors match syscall.EADDRINUSE when port 4791 on that address is taken
// (for example by a kernel rxe device, or by a link that does not share)
// and syscall.EADDRNOTAVAIL when the address is not configured on this
// host; the message names address:port. With ShareOn, an error matching
// share.ErrCapability says which capability is missing.
func ListenSocket(addr netip.Addr, opts *SocketOptions) (*SocketLink, error) {
	var o SocketOptions
	if opts != nil {
		o = *opts
	}
	socketDefaults(&o.RecvBufferSize, &o.SendBufferSize, &o.BatchSize)
	if o.GSOAuto {
		off, err := DeviceOffloadFor(addr)
		o.GSO = err == nil && off.GSODefault()
	}
	zone := addr.Zone()
	a := normAddr(addr)
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
		return nil, fmt.Errorf("udp: listen on %v: need a unicast address of this host: %w", addr, ErrAddress)
	}
	is6 := a.Is6()
	bindAddr := a
	if is6 {
		bindAddr = a.WithZone(zone)
	}
	ap := netip.AddrPortFrom(bindAddr, Port)

	var rx *rxConn
	var member *share.Member
	shared := false
	switch o.Share {
	case ShareOn:
		shared = true
	case ShareAuto:
		shared = autoShare && share.CheckCapabilities() == nil
	}
	if shared {
		var serr error
		member, serr = share.Join(ap, &share.Options{TimeWait: o.ShareTimeWait}, func(progFD int) (int, error) {
			c, err := openRecvSocket(ap, unix.SOCK_DGRAM, 0, func(fd int) error {
				if err := setSocketOptions(fd, is6, &o); err != nil {
					return err
				}
				return share.SetReusePort(fd)
			})
			if err != nil {
				return -1, err
			}
			sfd := -1
			c.Control(func(fd uintptr) {
				sfd = int(fd)
				err = share.AttachProgram(sfd, progFD)
			})
			if err != nil {
				c.Close()
				return -1, err
			}
			rx = c
			return sfd, nil
		})
		if serr != nil {
			if rx != nil {
				rx.Close()
			}
			return nil, fmt.Errorf("udp: listen %s shared: %w", ap, serr)
		}
	} else {
		var err error
		rx, err = openRecvSocket(ap, unix.SOCK_DGRAM, 0, func(fd int) error { return setSocketOptions(fd, is6, &o) })
		if err != nil {
			if errors.Is(err, unix.EADDRINUSE) && o.Share == ShareAuto {
				if cerr := share.CheckCapabilities(); cerr != nil {
					err = fmt.Errorf("%w (another process may hold it shared; %v)", err, cerr)
				}
			}
			return nil, fmt.Errorf("udp: listen %s: %w", ap, err)
		}
	}
	closeRx := func() {
		if member != nil {
			member.Close()
		}
		rx.Close()
	}
	tx, err := openSendSocket(netip.AddrPortFrom(bindAddr, 0), is6, o.SendBufferSize)
	if err != nil {
		closeRx()
		return nil, fmt.Errorf("udp: listen %s: send socket: %w", ap, err)
	}
	txPort, err := boundPort(tx)
	if err != nil {
		closeRx()
		tx.Close()
		return nil, fmt.Errorf("udp: listen %s: send socket: %w", ap, err)
	}
	l := &SocketLink{
		rx:     rx,
		txPort: txPort,
		is6:    is6,
		gso:    o.GSO,
		zc:     !o.NoZeroCopy,

		srcPorts: o.SourcePorts,
		bindAddr: bindAddr,
		sndBuf:   o.SendBufferSize,
		ports:    make(map[uint16]*portSocket),
		member:   member,
	}
	// Up to three iovecs per packet: a zero-copy packet's headers, its
	// payload in the caller's memory, its pad and ICRC; with GSO a
	// sendmmsg of BatchSize messages holds up to sendPktsMax packets.
	sendIovs := zcIovs
	if o.GSO {
		sendIovs = (zcIovs*sendPktsMax + o.BatchSize - 1) / o.BatchSize
	}
	l.sockLink.init(rx, tx, a, o.BatchSize, sendIovs)
	l.recv.spin = o.BusyPoll
	if o.SourcePorts {
		rx.Control(func(fd uintptr) { l.netns = socketNetnsOf(int(fd)) })
	}
	if !o.NoGRO {
		l.gro = &groState{mem: make([]byte, o.BatchSize*groBufSize), msgs: make([]groMsg, o.BatchSize)}
		// recvGRO receives into these buffers only (recvMsgs' path,
		// which prepares the caller's, is not taken with GRO).
		for i := range o.BatchSize {
			l.recv.fixRecv(i, l.gro.mem[i*groBufSize:(i+1)*groBufSize])
		}
	}
	if w, err := newErrWatch(); err == nil {
		l.errs = w
		w.add(tx)
		// A link dropped without Close: its sockets are closed by their
		// finalizers (fdConn), which the watcher must not keep alive.
		runtime.AddCleanup(l, (*errWatch).close, w)
	}
	return l, nil
}

// Stats returns the link's counters (Link.Stats).
func (l *SocketLink) Stats() Stats {
	st := l.sockLink.Stats()
	if l.errs != nil {
		st.ICMPErrors = l.errs.count.Load()
	}
	st.DropNoDF = l.ids.dropped.Load()
	return st
}

var (
	_ ErrorReporter = (*SocketLink)(nil)
	_ BacklogLink   = (*SocketLink)(nil)
)

// SetErrorHandler sets the function called with each ICMP error the
// network returns for a packet the link sent (ErrorReporter): port
// unreachable when nothing listens on UDP 4791 at the destination, host
// or network unreachable. It is called from the link's error goroutine
// and must not block. Errors are counted (Stats.ICMPErrors) with or
// without a handler.
func (l *SocketLink) SetErrorHandler(h func(*ICMPError)) {
	if l.errs == nil {
		return
	}
	if h == nil {
		l.errs.handler.Store(nil)
		return
	}
	l.errs.handler.Store(&h)
}

// openSendSocket opens a blocking socket bound to ap that only sends (see
// fdConn): the DF / identification 0 setting of the receive socket, send
// buffer sndBuf, and a socket filter that drops everything it would receive.
func openSendSocket(ap netip.AddrPort, is6 bool, sndBuf int) (*fdConn, error) {
	return openSocket(ap, unix.SOCK_DGRAM, 0, func(fd int) error {
		// The receive buffer bounds only the ICMP error queue (the
		// filter drops every datagram).
		o := SocketOptions{RecvBufferSize: 64 << 10, SendBufferSize: sndBuf, NoGRO: true}
		if err := setSocketOptions(fd, is6, &o); err != nil {
			return err
		}
		// ICMP errors for what it sends (errWatch reads them); the
		// error queue is bounded by the receive buffer.
		level, opt, name := unix.IPPROTO_IP, unix.IP_RECVERR, "IP_RECVERR"
		if is6 {
			level, opt, name = unix.IPPROTO_IPV6, unix.IPV6_RECVERR, "IPV6_RECVERR"
		}
		if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
			return fmt.Errorf("setsockopt %s: %w", name, err)
		}
		return attachFilter(fd, dropAll)
	})
}

// boundPort returns the local port c is bound to.
func boundPort(c *fdConn) (port uint16, err error) {
	cerr := c.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, err = unix.Getsockname(int(fd)); err != nil {
			err = fmt.Errorf("getsockname: %w", err)
			return
		}
		switch sa := sa.(type) {
		case *unix.SockaddrInet4:
			port = uint16(sa.Port)
		case *unix.SockaddrInet6:
			port = uint16(sa.Port)
		default:
			err = fmt.Errorf("getsockname: unexpected %T", sa)
		}
	})
	if cerr != nil {
		return 0, cerr
	}
	return port, err
}

func setSocketOptions(fd int, is6 bool, o *SocketOptions) error {
	set := func(level, opt, v int, name string) error {
		if err := unix.SetsockoptInt(fd, level, opt, v); err != nil {
			return fmt.Errorf("setsockopt %s=%d: %w", name, v, err)
		}
		return nil
	}
	if is6 {
		if err := set(unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO, "IPV6_MTU_DISCOVER"); err != nil {
			return err
		}
		if err := set(unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1, "IPV6_RECVTCLASS"); err != nil {
			return err
		}
		// Accept IPv6 datagrams with UDP checksum 0: rxe sends RoCEv2
		// over IPv6 that way (the ICRC protects the packet; RFC 6936),
		// and Linux drops them unless the receiving socket allows it.
		// Our own datagrams keep their checksum (rxe accepts them).
		if err := set(unix.SOL_UDP, unix.UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX"); err != nil {
			return err
		}
	} else {
		// DF and, on an unconnected socket, IPv4 identification 0.
		if err := set(unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, "IP_MTU_DISCOVER"); err != nil {
			return err
		}
		if err := set(unix.IPPROTO_IP, unix.IP_RECVTOS, 1, "IP_RECVTOS"); err != nil {
			return err
		}
	}
	// Every received datagram queued after a drop carries the socket's
	// cumulative drop count (a control message; none while it is 0), so
	// the receive path sees kernel drops without a system call of its
	// own (SocketLink.KernelDrops).
	if err := set(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1, "SO_RXQ_OVFL"); err != nil {
		return err
	}
	if !o.NoGRO {
		if err := set(unix.SOL_UDP, unix.UDP_GRO, 1, "UDP_GRO"); err != nil {
			return err
		}
	}
	return setBuffers(fd, o.RecvBufferSize, o.SendBufferSize)
}

// Close closes the socket(s); a blocked Recv returns net.ErrClosed.
// Closing twice is harmless.
func (l *SocketLink) Close() error {
	if l.member != nil {
		l.member.Close()
	}
	if l.errs != nil {
		l.errs.close()
	}
	err := l.rx.Close()
	l.tx.Close()
	l.portsMu.Lock()
	for _, ps := range l.ports {
		if ps != nil {
			ps.conn.Close()
		}
	}
	l.ports = nil
	l.netns.close()
	l.netns = nil
	l.portsMu.Unlock()
	return closeErr(err, "close", l.addr)
}

// autoShare is what ShareAuto does when the process may share; the
// package's own tests, which send datagrams to arbitrary QPNs over bare
// links, turn it off.
var autoShare = true

// destQP returns the BTH destination QP of a datagram of at least
// minPacketSize bytes.
func destQP(b []byte) uint32 { return uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7]) }

// Shared reports whether the link is a member of the shared group of its
// address (SocketOptions.Share): then other processes receive on the same
// address, each datagram goes to the process owning its destination QP,
// and the link's device must use LeaseQPNs, CommIDTag and ClaimService.
func (l *SocketLink) Shared() bool { return l.member != nil }

// errNotShared is what the sharing calls of an unshared link return.
var errNotShared = errors.New("udp: link does not share its address")

// LeaseQPNs leases a range of QPNs for this link (a shared link only):
// the datagrams to them come to this link until it closes (and TimeWait
// after, to nobody).
func (l *SocketLink) LeaseQPNs() (first, n uint32, err error) {
	if l.member == nil {
		return 0, 0, errNotShared
	}
	return l.member.LeaseQPNs()
}

// CommIDTag returns the bits (tag under mask) that make a CM communication
// ID this link's; 0, 0 for an unshared link.
func (l *SocketLink) CommIDTag() (tag, mask uint32) {
	if l.member == nil {
		return 0, 0
	}
	return l.member.CommIDTag()
}

// ClaimService makes REQs and SIDR_REQs for service ID sid come to this
// link (a shared link; nil for an unshared one, which gets everything).
func (l *SocketLink) ClaimService(sid uint64) error {
	if l.member == nil {
		return nil
	}
	return l.member.ClaimService(sid)
}

// ReleaseService undoes ClaimService.
func (l *SocketLink) ReleaseService(sid uint64) {
	if l.member != nil {
		l.member.ReleaseService(sid)
	}
}

// VolunteerRejector offers the link to receive REQs for services nobody
// in the group listens on (nil for an unshared link).
func (l *SocketLink) VolunteerRejector() error {
	if l.member == nil {
		return nil
	}
	return l.member.VolunteerRejector()
}

// ShareStats are the counters of a shared link.
type ShareStats struct {
	Slot      int    // the link's slot in its group
	Steered   uint64 // datagrams the steering program handed to this link
	Misrouted uint64 // datagrams received that were not for this link's QPNs (dropped; 0 unless the kernel misbehaves, or a GSO datagram mixed QPs)
	Group     share.Counters
}

// ShareStats returns the link's sharing counters (zero for an unshared
// link).
func (l *SocketLink) ShareStats() ShareStats {
	if l.member == nil {
		return ShareStats{}
	}
	return ShareStats{Slot: l.member.Slot(), Steered: l.member.Steered(), Misrouted: l.misrouted.Load(), Group: l.member.Counters()}
}

// SendPort returns the UDP source port of the link's own send socket: the
// port every packet leaves from without SocketOptions.SourcePorts.
func (l *SocketLink) SendPort() uint16 { return l.txPort }

// SourcePortFallbacks returns how many per-QP source ports
// (SocketOptions.SourcePorts) could not be bound, so that their packets
// leave from SendPort instead.
func (l *SocketLink) SourcePortFallbacks() uint64 { return l.portFallbacks.Load() }

// GROCoalesced returns how many received buffers held more than one
// datagram (coalesced by UDP GRO).
func (l *SocketLink) GROCoalesced() uint64 { return l.groCoalesced.Load() }

// SetRecvInPlace(true) lets Recv and TryRecv hand out each packet of a
// GRO buffer in place — Packet.Buf a slice of the link's own receive
// memory, its ICRC checked there — instead of copying it into the
// caller's Buf: one pass less over every received byte. The caller's Buf
// slices are then replaced (without GRO, with SocketOptions.NoGRO, they
// are filled as before), and a packet handed out in place stays valid
// only until the next Recv or TryRecv is called (its recvmmsg overwrites
// the buffer): a caller that turns it on must be done with a batch (or
// have copied what it keeps) before it receives the next one, as
// transport.Device is, and must give Recv buffers of full capacity again
// before every call. Safe to call at any time; it applies from the next
// Recv on.
func (l *SocketLink) SetRecvInPlace(on bool) { l.inPlace.Store(on) }

// SocketBuffers returns the kernel's effective SO_RCVBUF and SO_SNDBUF.
func (l *SocketLink) SocketBuffers() (rcv, snd int, err error) {
	cerr := l.rc.Control(func(fd uintptr) {
		rcv, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		if err == nil {
			snd, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		}
	})
	if cerr != nil {
		return 0, 0, cerr
	}
	return rcv, snd, err
}

// putSockaddr writes dst:4791 into sa and returns its length.
func putSockaddr(sa *unix.RawSockaddrInet6, dst netip.Addr, is6 bool) uint32 {
	if is6 {
		sa.Family = unix.AF_INET6
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], Port)
		sa.Flowinfo = 0
		sa.Addr = dst.As16()
		sa.Scope_id = 0
		return unix.SizeofSockaddrInet6
	}
	s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
	s4.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&s4.Port))[:], Port)
	s4.Addr = dst.As4()
	s4.Zero = [8]uint8{}
	return unix.SizeofSockaddrInet4
}

// putTOSCmsg writes one IP_TOS / IPV6_TCLASS control message carrying tos
// into b and returns its length.
func putTOSCmsg(b []byte, tos uint8, is6 bool) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	if is6 {
		h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_TCLASS
	} else {
		h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TOS
	}
	h.SetLen(unix.CmsgLen(4))
	*(*int32)(unsafe.Pointer(&b[unix.CmsgLen(0)])) = int32(tos)
	return unix.CmsgSpace(4)
}

// Send fills each packet's ICRC for the header the kernel will send (this
// address, the source port actually used, destination port 4791, DF, IPv4
// identification 0 — or, with GSO, the segment's index in its group) and
// sends the packets with sendmmsg. A message is one packet or, with GSO,
// one group of packets (gsoGroup) that does not cross a multiple of
// BatchSize packets from the start of pkts — the datagrams are those of
// BatchSize packets sent at a time — and a sendmmsg carries up to
// BatchSize messages (with GSO, only the whole groups its iovecs hold:
// room for sendPktsMax packets at three iovecs each), so that a Send of
// several BatchSize of GSO packets takes one call, not one per BatchSize
// packets, when its groups fit (a BatchSize below 16 caps a call at
// BatchSize² packets). The source port is
// SendPort, or Packet.SrcPort with SocketOptions.SourcePorts (see
// SocketLink); each Packet.SrcPort is set to the port used.
// It returns after every packet was accepted by the kernel, or with the
// first error (packets before it were sent).
func (l *SocketLink) Send(pkts []Packet) error {
	if err := checkSend(pkts, l.addr, l.zc); err != nil {
		return err
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	// Runs of packets leaving from the same socket (source port).
	for off := 0; off < len(pkts); {
		end := len(pkts)
		if l.srcPorts {
			end = off + 1
			for end < len(pkts) && pkts[end].SrcPort == pkts[off].SrcPort {
				end++
			}
		}
		rc, port, err := l.sourceSocket(pkts[off].SrcPort)
		if err != nil {
			return err
		}
		if err := l.sendRun(rc, port, pkts[off:end], off); err != nil {
			return err
		}
		off = end
	}
	return nil
}

// sendPktsMax is how many packets the iovecs of one sendmmsg on a GSO
// link hold at least (its BatchSize messages may hold fewer): the send
// iovecs are sized for it at zcIovs per packet, the most one takes
// (packets whose iovecs merge fit more). It is at least
// gsoMaxSegs, so that any group fits.
const sendPktsMax = 4 * gsoMaxSegs

// sendRun sends run (index base in the caller's slice) from the socket c
// whose source port is port, one sendmmsg per buildSend.
func (l *SocketLink) sendRun(c *fdConn, port uint16, run []Packet, base int) error {
	s := &l.send
	l.sendTOS(c, run)
	for off := 0; off < len(run); {
		nmsg, npkt := l.buildSend(run[off:], base+off, port, c.tos)
		if npkt == 0 { // cannot happen: the iovecs hold any one group
			return fmt.Errorf("udp: send: packet %d does not fit in a sendmmsg", base+off)
		}
		first, err := s.send(c, nmsg, &l.sent) // first: the first packet not sent
		s.clearIovs(s.usedIovs)
		if err != nil && s.errno != 0 {
			return fmt.Errorf("udp: sendmmsg packet %d (%d bytes, %d in GSO group) %v:%d -> %v: %w",
				base+off+first, len(run[off+first].Buf), s.segs[s.off], l.addr, port, run[off+first].Addr, s.errno)
		}
		if err != nil {
			return fmt.Errorf("udp: send: %w", err)
		}
		off += npkt
	}
	return nil
}

// sourceSocket returns the socket to send a packet with source port want
// from, and the port it really has. Without SourcePorts, or for port 0,
// 4791 or SendPort, that is the link's send socket (port SendPort).
// Otherwise a send-only socket bound to addr:want is opened on first use;
// when that fails (the port is taken) the link's send socket is used from
// then on for that port.
func (l *SocketLink) sourceSocket(want uint16) (*fdConn, uint16, error) {
	if !l.srcPorts || want == 0 || want == Port || want == l.txPort {
		return l.tx, l.txPort, nil
	}
	l.portsMu.Lock()
	defer l.portsMu.Unlock()
	if l.ports == nil {
		return nil, 0, fmt.Errorf("udp: send from %v: %w", l.addr, net.ErrClosed)
	}
	if ps, ok := l.ports[want]; ok {
		if ps == nil {
			return l.tx, l.txPort, nil
		}
		return ps.conn, want, nil
	}
	ps, err := l.openSourceSocket(want)
	if err != nil {
		l.ports[want] = nil
		l.portFallbacks.Add(1)
		return l.tx, l.txPort, nil
	}
	l.ports[want] = ps
	return ps.conn, want, nil
}

// portSocket is a send-only socket for one UDP source port.
type portSocket struct {
	conn *fdConn
}

// openSourceSocket opens a send socket bound to addr:port (openSendSocket).
func (l *SocketLink) openSourceSocket(port uint16) (*portSocket, error) {
	ap := netip.AddrPortFrom(l.bindAddr, port)
	var conn *fdConn
	// In the namespace of the link's socket, wherever Send runs.
	err := l.netns.run(func() (err error) {
		conn, err = openSendSocket(ap, l.is6, l.sndBuf)
		return err
	})
	if err != nil {
		return nil, err
	}
	if l.errs != nil {
		l.errs.add(conn)
	}
	return &portSocket{conn: conn}, nil
}

// gsoMaxSegs and gsoMaxBytes bound one GSO send: Linux before 6.11 accepts
// at most 64 segments (UDP_MAX_SEGMENTS), and a datagram carries at most
// 65535 - 8 - 40 bytes of payload (IPv6 header size, the stricter bound).
const (
	gsoMaxSegs  = 64
	gsoMaxBytes = 65535 - 8 - 40
)

// gsoGroup returns how many packets starting at pkts[0] can go as one GSO
// datagram: same destination and TOS, all the size of the first except a
// possibly shorter last one, within the segment and byte limits.
func gsoGroup(pkts []Packet) int {
	size := pkts[0].Len()
	dst, tos := pkts[0].Addr, pkts[0].TOS
	qp := destQP(pkts[0].Buf)
	total := size
	n := 1
	for n < len(pkts) && n < gsoMaxSegs {
		p := &pkts[n]
		// One destination QP per datagram: on lo (and a veth) a GSO
		// datagram reaches the receiver whole, and a shared address
		// steers it by its first segment's DestQP.
		pl := p.Len()
		if p.Addr != dst || p.TOS != tos || pl > size || total+pl > gsoMaxBytes || destQP(p.Buf) != qp {
			break
		}
		total += pl
		n++
		if pl < size {
			break // a shorter packet can only be the last segment
		}
	}
	return n
}

// tosSwitchAfter is how many datagrams in a row must ask for the same TOS,
// other than the socket's, before the socket's TOS option is set to it.
const tosSwitchAfter = 64

// sendTOS keeps the TOS option of the socket c at the TOS most datagrams
// sent on it carry (ECT(0) or the QPs' traffic class), so that they need
// no IP_TOS control message: one on every datagram made each sendmmsg
// copy, parse and (with a GSO segment-size message beside it, over the
// 36 bytes the kernel keeps on its stack) allocate the control data —
// about a tenth of a microsecond of kernel time per small datagram. A
// datagram with another TOS (a CNP, a QP with its own traffic class)
// carries its own control message. Called under sendMu.
func (l *SocketLink) sendTOS(c *fdConn, run []Packet) {
	for i := range run {
		t := run[i].TOS
		switch {
		case t == c.tos:
			c.tosRun = 0
			continue
		case t == c.tosCand:
			c.tosRun++
		default:
			c.tosCand, c.tosRun = t, 1
		}
		if c.tosRun < tosSwitchAfter && c.tosSet {
			continue
		}
		// The first TOS other than 0 a socket sends with becomes its
		// option at once; later ones after a run of tosSwitchAfter.
		level, opt := unix.IPPROTO_IP, unix.IP_TOS
		if l.is6 {
			level, opt = unix.IPPROTO_IPV6, unix.IPV6_TCLASS
		}
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), level, opt, int(t)) }); cerr != nil {
			err = cerr // closed: the send fails anyway
		}
		if err == nil {
			c.tos, c.tosRun, c.tosSet = t, 0, true
		} else {
			// Keep sending control messages; try again after a run.
			c.tosRun, c.tosSet = 0, true
		}
	}
}

// buildSend fills the ICRCs and the send mmsghdrs of the packets at the
// start of chunk, whose first is packet at of the caller's Send: one
// message per packet or, with GSO, one per group, which ends at the latest
// at a multiple of BatchSize packets from the start of the Send (see
// Send), as many messages as one sendmmsg takes (BatchSize, and only
// whole groups whose iovecs fit); a packet whose TOS is not sockTOS, the
// socket's, gets an IP_TOS (IPV6_TCLASS) control message. It returns the
// number of messages and of packets they hold.
func (l *SocketLink) buildSend(chunk []Packet, at int, port uint16, sockTOS uint8) (nmsg, npkt int) {
	s := &l.send
	iov := 0 // next free iovec
	i := 0
	for i < len(chunk) && nmsg < len(s.hdrs) {
		g := 1
		if l.gso {
			g = gsoGroup(chunk[i:])
			g = min(g, l.batch-(at+i)%l.batch)
		}
		// Room for the group's iovecs at the most each packet takes
		// (the iovecs hold at least one group of gsoMaxSegs).
		if iov+g*zcIovs > len(s.iovs) {
			break
		}
		p := &chunk[i]
		dst := normAddr(p.Addr)
		pf := l.txFlow.get(l.addr, dst, port)
		first := iov
		for k := range g {
			q := &chunk[i+k]
			q.SrcPort = port // the port it really leaves from
			// Linux gives a DF datagram from an unconnected socket ID 0;
			// GSO numbers the segments' IDs upward from there.
			if q.Payload == nil {
				icrc.Store(q.Buf, pf.Compute(uint16(k), q.Buf))
				iov = s.addIov(first, iov, q.Buf)
				continue
			}
			// Zero-copy: the ICRC from the payload where it lies, and
			// the datagram gathered from Buf's headers, the payload and
			// Buf's pad and ICRC by the kernel's copy.
			at := q.PayloadAt()
			icrc.Store(q.Buf, pf.ComputeSplit(uint16(k), q.Buf, at, q.Payload))
			iov = s.addIov(first, iov, q.Buf[:at])
			if len(q.Payload) > 0 {
				iov = s.addIov(first, iov, q.Payload)
			}
			iov = s.addIov(first, iov, q.Buf[at:])
		}
		if testHookZeroCopySent != nil {
			testHookZeroCopySent(chunk[i : i+g])
		}
		h := &s.hdrs[nmsg].Hdr
		h.Iov = &s.iovs[first]
		h.SetIovlen(iov - first)
		h.Namelen = putSockaddr(&s.names[nmsg], dst, l.is6)
		c := s.ctrl[nmsg*cmsgSpace : (nmsg+1)*cmsgSpace]
		clen := 0
		if p.TOS != sockTOS {
			clen += putTOSCmsg(c, p.TOS, l.is6)
		}
		if g > 1 {
			clen += putGSOCmsg(c[clen:], uint16(p.Len()))
		}
		if clen > 0 {
			h.Control = &c[0]
		} else {
			h.Control = nil
		}
		h.SetControllen(clen)
		h.Flags = 0
		s.segs[nmsg] = g
		nmsg++
		i += g
	}
	s.usedIovs = iov
	return nmsg, i
}

// addIov adds b as the message's next iovec at s.iovs[iov] and returns
// the next free index — or, when b starts where the message's last iovec
// (from index first on) ends, extends that one and returns iov unchanged.
// A transport builds a window's small packets back to back in one buffer
// (and a zero-copy packet's pad and ICRC right before the next packet's
// headers), so that a GSO datagram of 64 small packets is one iovec, not
// 64: the kernel imports, checks and copies each iovec on its own.
func (s *mmsgState) addIov(first, iov int, b []byte) int {
	if len(b) == 0 {
		return iov
	}
	if iov > first {
		last := &s.iovs[iov-1]
		// Addresses compared as integers: a pointer one past the end of
		// last's memory would be an invalid pointer to make.
		if uintptr(unsafe.Pointer(last.Base))+uintptr(last.Len) == uintptr(unsafe.Pointer(&b[0])) {
			last.SetLen(int(last.Len) + len(b))
			return iov
		}
	}
	s.iovs[iov].Base = &b[0]
	s.iovs[iov].SetLen(len(b))
	return iov + 1
}

// testHookZeroCopySent, when a test sets it, sees each message's packets
// after their ICRCs were computed and before the kernel reads them: a
// test changes a payload there to check that the receiver's ICRC check
// catches it.
var testHookZeroCopySent func(pkts []Packet)

// putGSOCmsg writes a UDP_SEGMENT control message (segment size) into b
// and returns its length.
func putGSOCmsg(b []byte, size uint16) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&b[unix.CmsgLen(0)])) = size
	return unix.CmsgSpace(2)
}

// Recv receives up to min(len(pkts), BatchSize) datagrams with one
// recvmmsg, blocking until at least one valid RoCEv2 packet arrived. Bad
// datagrams are dropped and counted: shorter than BTH+ICRC or truncated
// (DropMalformed), ICRC not verifiable (DropBadICRC). The packets after a
// dropped datagram are copied down into the slots before them; no slot
// past the n returned gets another buffer (RecvPrefix).
//
// WakeRecv makes a Recv that waits return 0 packets and no error.
func (l *SocketLink) Recv(pkts []Packet) (int, error) {
	return l.recvMsgs(pkts, true)
}

// TryRecv is Recv without waiting: it returns the datagrams that are
// already there (at most one recvmmsg), or 0 and no error when there are
// none — or when another goroutine is in Recv or TryRecv at the moment.
// A busy-polling caller drives the link with it in its own goroutine.
func (l *SocketLink) TryRecv(pkts []Packet) (int, error) {
	return l.recvMsgs(pkts, false)
}

// RecvPrefix reports true: Recv and TryRecv change no slot's buffer past
// the packets they return, and return those in the buffers given unless
// in place (udp.PrefixRecvLink).
func (l *SocketLink) RecvPrefix() bool { return true }

// WakeRecv makes a Recv that is waiting for datagrams (or busy polling
// for them) return 0 packets and no error at once; if none is waiting, the
// next Recv that would wait returns so. Safe to call from any goroutine:
// a goroutine that wants to drive the link with TryRecv takes it from the
// one blocked in Recv this way.
func (l *SocketLink) WakeRecv() { l.rx.Wake() }

// BusyPoll returns the link's SocketOptions.BusyPoll.
func (l *SocketLink) BusyPoll() time.Duration { return l.recv.spin }

// recvMsgs is Recv (wait) and TryRecv (!wait).
func (l *SocketLink) recvMsgs(pkts []Packet, wait bool) (int, error) {
	limit := l.batch
	if l.gro != nil {
		limit = len(pkts) // a coalesced buffer fills any number
	}
	if err := checkRecv(pkts, limit); err != nil || len(pkts) == 0 {
		return 0, err
	}
	if wait {
		l.recvMu.Lock()
	} else if !l.recvMu.TryLock() {
		return 0, nil
	}
	defer l.recvMu.Unlock()
	if l.gro != nil {
		return l.recvGRO(pkts, wait)
	}
	s := &l.recv
	k := min(len(pkts), l.batch)
	for {
		for i := range k {
			s.prepRecv(i, pkts[i].Buf[:cap(pkts[i].Buf)], true)
		}
		err := l.recvOnce(k, wait)
		s.clearIovs(k)
		if err == errWoken || err == errNothing {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		out := 0
		for i := 0; i < s.n; i++ {
			if !l.accept(i, &pkts[i]) {
				continue
			}
			if out != i {
				// Copied down, not swapped (only after a dropped
				// datagram): every slot past the n returned keeps
				// the buffer it was given (CapRecvPrefix).
				q, d := &pkts[i], &pkts[out]
				d.Buf = append(d.Buf[:0], q.Buf...)
				d.Addr, d.SrcPort, d.TOS = q.Addr, q.SrcPort, q.TOS
			}
			out++
		}
		if out > 0 {
			l.rcvd.Add(uint64(out))
			return out, nil
		}
	}
}

// errNothing is recvOnce's report that a non-blocking attempt found no
// datagram.
var errNothing = errors.New("udp: nothing received")

// recvOnce receives into the k messages readied by prepRecv: waiting for
// them (errWoken when WakeRecv ended the wait), or with one non-blocking
// attempt (errNothing when there was none).
func (l *SocketLink) recvOnce(k int, wait bool) error {
	if wait {
		return l.recv.recv(l.rc, k, "udp: ", l.addr)
	}
	got, err := l.recv.try(l.rc, k, "udp: ", l.addr)
	if err == nil && !got {
		return errNothing
	}
	return err
}

// groState holds the datagrams of the last GRO recvmmsg not yet returned.
type groState struct {
	mem    []byte // BatchSize buffers of groBufSize
	msgs   []groMsg
	cur, n int // msgs[cur:n] still hold segments
	// k is how many buffers the next receive asks for: twice as many as
	// the last one filled all it asked for (up to BatchSize) when that
	// one found them queued, else as many as it got. A receive that had
	// to wait gets what one wake-up brought, typically one datagram: a
	// ping-pong, which waits for every datagram, thus always receives
	// with a plain recvmsg (mmsgState.call's one-message path: no batch
	// loop, no second try that finds the socket empty), while a stream,
	// whose datagrams are queued, grows to full recvmmsg batches within
	// a few calls.
	k int
}

// groMsg is one received buffer: one datagram, or several of seg bytes
// (the last may be shorter) coalesced by GRO.
type groMsg struct {
	buf  []byte
	seg  int
	off  int // next segment starts here
	src  netip.Addr
	port uint16
	tos  uint8
}

// recvGRO is Recv for a socket with UDP_GRO. Called with recvMu held.
func (l *SocketLink) recvGRO(pkts []Packet, wait bool) (int, error) {
	g := l.gro
	s := &l.recv
	inPlace := l.inPlace.Load()
	if !inPlace {
		// A slice an in-place receive handed out is the GRO buffer's
		// memory, and one of exactly MaxPacketSize passes checkRecv's
		// capacity test: copying into it would overwrite datagrams not
		// yet read (the caller switched SetRecvInPlace off without
		// giving its own buffers back).
		for i := range pkts {
			if inside(pkts[i].Buf, g.mem) {
				return 0, fmt.Errorf("udp: recv packet %d: buffer is a packet an in-place receive handed out, not the caller's: %w", i, ErrShortBuffer)
			}
		}
	}
	for {
		n := 0
		for g.cur < g.n && n < len(pkts) {
			m := &g.msgs[g.cur]
			if m.off >= len(m.buf) {
				g.cur++
				continue
			}
			end := min(m.off+m.seg, len(m.buf))
			seg := m.buf[m.off:end]
			k := uint16(m.off / m.seg) // segment k of a GSO datagram has IPv4 ID k
			m.off = end
			if len(seg) < minPacketSize || len(seg) > MaxPacketSize {
				l.malformed.Add(1)
				continue
			}
			if l.member != nil && !l.member.Owns(destQP(seg)) {
				l.misrouted.Add(1)
				continue
			}
			p := &pkts[n]
			if inPlace {
				// Capacity cut at the segment: an append cannot
				// run into the next one.
				if !l.deferVerify.Load() && !l.verifyCopy(nil, seg, m.src, m.port, k) {
					continue
				}
				p.Buf = seg[:len(seg):len(seg)]
			} else {
				p.Buf = p.Buf[:len(seg)]
				if l.deferVerify.Load() {
					copy(p.Buf, seg) // the caller verifies (VerifyICRC)
				} else if !l.verifyCopy(p.Buf, seg, m.src, m.port, 0) {
					continue
				}
			}
			p.Addr, p.SrcPort, p.TOS = m.src, m.port, m.tos
			n++
		}
		if n > 0 {
			l.rcvd.Add(uint64(n))
			return n, nil
		}
		// Everything returned: receive the next buffers, as many as the
		// last call suggests (see groState.k).
		k := min(max(g.k, 1), l.batch)
		for i := range k {
			s.resetRecv(i) // buffers and control slots: fixRecv, at ListenSocket
		}
		if err := l.recvOnce(k, wait); err != nil {
			if err == errWoken || err == errNothing {
				return 0, nil
			}
			return 0, err
		}
		g.cur, g.n = 0, 0
		if s.n == k && !l.rx.waited {
			g.k = min(2*k, l.batch)
		} else {
			g.k = max(s.n, 1)
		}
		for i := 0; i < s.n; i++ {
			m := &s.hdrs[i]
			if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
				l.malformed.Add(1)
				continue
			}
			src, port, ok := parseSockaddr(&s.names[i], m.Hdr.Namelen)
			if !ok {
				l.other.Add(1)
				continue
			}
			cm := l.rxCmsgs(i)
			tos, seg := cm.tos, cm.groSize
			size := int(m.Len)
			if size < minPacketSize {
				l.malformed.Add(1)
				continue
			}
			if seg <= 0 || seg >= size {
				seg = size
			} else {
				l.groCoalesced.Add(1)
			}
			// Field by field: the composite literal was built and
			// copied whole (~60 instructions per received buffer).
			gm := &g.msgs[g.n]
			gm.buf = g.mem[i*groBufSize : i*groBufSize+size]
			gm.seg, gm.off = max(seg, 1), 0
			gm.src, gm.port, gm.tos = src, port, tos
			g.n++
		}
	}
}

// rxCmsgs parses the control messages of received message i and takes
// the socket's drop count (SO_RXQ_OVFL) from them. Called with recvMu
// held.
func (l *SocketLink) rxCmsgs(i int) rxCmsgs {
	s := &l.recv
	n := int(s.hdrs[i].Hdr.Controllen)
	if n == 0 {
		return rxCmsgs{}
	}
	c := parseCmsgsTOS(s.ctrl[i*cmsgSpace : i*cmsgSpace+n])
	if c.hasOvfl {
		l.kdrops.see(c.drops)
	}
	return c
}

// inside reports whether b starts within mem's memory.
func inside(b, mem []byte) bool {
	if cap(b) == 0 || len(mem) == 0 {
		return false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return p >= lo && p < lo+uintptr(len(mem))
}

// testHookIPv4ID, when set by a test, sees the IPv4 identification each
// accepted IPv4 packet's ICRC was solved for.
var testHookIPv4ID func(id uint16)

// accept checks received message i, now in p.Buf, and fills p.
func (l *SocketLink) accept(i int, p *Packet) bool {
	s := &l.recv
	m := &s.hdrs[i]
	n := int(m.Len)
	if m.Hdr.Flags&unix.MSG_TRUNC != 0 || n < minPacketSize || n > MaxPacketSize {
		l.malformed.Add(1)
		return false
	}
	buf := p.Buf[:n]
	src, srcPort, ok := parseSockaddr(&s.names[i], m.Hdr.Namelen)
	if !ok {
		l.other.Add(1)
		return false
	}
	tos := l.rxCmsgs(i).tos
	if l.member != nil && !l.member.Owns(destQP(buf)) {
		l.misrouted.Add(1)
		return false
	}
	if !l.deferVerify.Load() && !l.verify(buf, src, srcPort) {
		return false
	}
	p.Buf = buf
	p.Addr = src
	p.SrcPort = srcPort
	p.TOS = tos
	return true
}

// verify checks a received datagram's ICRC (see SocketLink) and counts a
// failure in DropBadICRC.
func (l *SocketLink) verify(buf []byte, src netip.Addr, srcPort uint16) bool {
	return l.verifyCopy(nil, buf, src, srcPort, 0)
}

// verifyCopy is verify that also copies buf to dst (len(dst) == len(buf))
// unless dst is nil: the GRO path moves each segment out of the coalesced
// buffer in the same pass over its bytes as the ICRC check
// (icrc.SolveIPv4IDCopy, icrc.ComputeIPv6Copy). Without dst, an IPv4
// packet's identification is looked for from guess on
// (icrc.Prefix.SolveIPv4IDFrom: the GRO path passes the segment's index).
func (l *SocketLink) verifyCopy(dst, buf []byte, src netip.Addr, srcPort, guess uint16) bool {
	_, ok := l.verifyFlow(&l.rxFlow, dst, buf, src, srcPort, guess)
	return ok
}

// verifyFlow is verifyCopy with the prefix cache f.
// It returns the IPv4 identification the ICRC was valid for.
func (l *SocketLink) verifyFlow(f *flowPrefix, dst, buf []byte, src netip.Addr, srcPort, guess uint16) (uint16, bool) {
	pf := f.get(src, l.addr, srcPort)
	if l.is6 {
		var c uint32
		if dst != nil {
			c = pf.ComputeCopy(0, dst, buf)
		} else {
			c = pf.Compute(0, buf)
		}
		if c != icrc.Load(buf) {
			l.badICRC.Add(1)
			return 0, false
		}
		return 0, true
	}
	var id uint16
	var ok bool
	if dst != nil {
		id, ok = pf.SolveIPv4IDCopy(dst, buf)
	} else {
		id, ok = pf.SolveIPv4IDFrom(guess, buf)
	}
	df := ok
	if !ok {
		h := icrc.IPv4Pseudo{Src: src.As4(), Dst: l.addr.As4(), SrcPort: srcPort, DstPort: Port} // without DF
		if id, ok = icrc.SolveIPv4ID(&h, buf); !ok {
			l.badICRC.Add(1)
			return 0, false
		}
	}
	if df && l.ids.n.Load() != 0 {
		l.ids.resetNoDF(src)
	}
	if !df && !l.ids.acceptNoDF(src) {
		l.ids.dropped.Add(1)
		l.badICRC.Add(1)
		return 0, false
	}
	if testHookIPv4ID != nil {
		testHookIPv4ID(id)
	}
	return id, true
}

// idLearn is how many datagrams in a row from one source must solve only
// without DF before the link takes that source for one that sends without
// DF.
const idLearn = 4

// ipv4IDs decides which IPv4 datagrams whose ICRC solved only without DF
// are taken. The receiver does not see the IP header, so the ICRC is
// checked by solving for the identification and DF that make it valid;
// the CRC being linear, a corruption whose effect on the CRC equals a
// change of those 17 bits passes such a solve — a single-bit flip of
// payload byte 173 passed the without-DF solve in every datagram of 174
// bytes or more (soak24: placed in registered memory with a success
// completion). rxe, RNICs and Linux sockets send with DF, so a datagram
// that solves only without DF is a corruption unless its source is one
// that sends without DF, learned after idLearn of them in a row.
// (Checking the identification itself was tried and dropped: rxe's
// counter passes through every value, jumps after idle spells and is
// shared across a shared address's members.)
type ipv4IDs struct {
	dropped atomic.Uint64 // datagrams dropped (also in DropBadICRC)
	n       atomic.Int32  // len(src), read without mu
	mu      sync.Mutex
	src     map[netip.Addr]*noDFSource
}

type noDFSource struct {
	streak int  // datagrams in a row that solved only without DF
	noDF   bool // learned: sends without DF
}

// acceptNoDF reports whether a datagram from src that solved only
// without DF is taken.
func (w *ipv4IDs) acceptNoDF(src netip.Addr) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.src[src]
	if s == nil {
		if w.src == nil || len(w.src) >= maxIDSources {
			w.src = map[netip.Addr]*noDFSource{}
		}
		s = &noDFSource{}
		w.src[src] = s
		w.n.Store(int32(len(w.src)))
	}
	if s.noDF {
		return true
	}
	s.streak++
	if s.streak >= idLearn {
		s.noDF = true
		return true
	}
	return false
}

// resetNoDF ends src's streak: a datagram of it solved with DF. The
// source is forgotten, so that DF datagrams skip the lock again once no
// streak is running.
func (w *ipv4IDs) resetNoDF(src netip.Addr) {
	w.mu.Lock()
	if s := w.src[src]; s != nil && !s.noDF {
		delete(w.src, src)
		w.n.Store(int32(len(w.src)))
	}
	w.mu.Unlock()
}

// maxIDSources bounds the sources ipv4IDs keeps.
const maxIDSources = 4096

// parseSockaddr decodes a received source address.
func parseSockaddr(sa *unix.RawSockaddrInet6, n uint32) (netip.Addr, uint16, bool) {
	switch sa.Family {
	case unix.AF_INET:
		if n < unix.SizeofSockaddrInet4 {
			return netip.Addr{}, 0, false
		}
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrFrom4(s4.Addr), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&s4.Port))[:]), true
	case unix.AF_INET6:
		if n < unix.SizeofSockaddrInet6 {
			return netip.Addr{}, 0, false
		}
		a := netip.AddrFrom16(sa.Addr).Unmap()
		return a, binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:]), true
	}
	return netip.Addr{}, 0, false
}

// rxCmsgs are the values parseCmsgs finds in a datagram's control
// messages.
type rxCmsgs struct {
	tos     uint8  // IP_TOS / IPV6_TCLASS
	groSize int    // UDP_GRO: segment size of a coalesced datagram
	drops   uint32 // SO_RXQ_OVFL: the socket's drop count when the datagram was queued
	hasOvfl bool   // drops is present (the kernel sends it once the count is not 0)
}

// The usual control data of a datagram an IPv4 socket received: one
// IP_TOS message and nothing else (no GRO segment size, no drop count).
var (
	tosCmsgLen   = uint64(unix.CmsgLen(1))
	tosCmsgSpace = unix.CmsgSpace(1)
	cmsgHdrLen   = unix.CmsgLen(0)
)

// parseCmsgsTOS is parseCmsgs with that usual case recognised in one test
// of its length and header (~60 instructions less per received buffer);
// any other control data is parsed by parseCmsgs
// (TestParseCmsgsTOSMatches).
func parseCmsgsTOS(b []byte) rxCmsgs {
	if len(b) == tosCmsgSpace {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		if uint64(h.Len) == tosCmsgLen && h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS {
			return rxCmsgs{tos: b[cmsgHdrLen]}
		}
	}
	return parseCmsgs(b)
}

// parseCmsgs finds IP_TOS (1 byte) or IPV6_TCLASS (int), UDP_GRO (int:
// the segment size of a coalesced datagram) and SO_RXQ_OVFL (u32: the
// socket's cumulative drop count) in received control messages; zeros
// when absent. It does not allocate.
func parseCmsgs(b []byte) (c rxCmsgs) {
	hdr := unix.CmsgLen(0)
	for len(b) >= hdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		clen := int(h.Len)
		if clen < hdr || clen > len(b) {
			return
		}
		data := b[hdr:clen]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS && len(data) >= 1:
			c.tos = data[0]
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS && len(data) >= 4:
			c.tos = uint8(*(*int32)(unsafe.Pointer(&data[0])))
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			c.groSize = int(*(*int32)(unsafe.Pointer(&data[0])))
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
			c.drops, c.hasOvfl = *(*uint32)(unsafe.Pointer(&data[0])), true
		}
		next := unix.CmsgSpace(clen - hdr)
		if next > len(b) {
			return
		}
		b = b[next:]
	}
	return
}

// String describes the link, e.g. "udp 192.0.2.1:4791".
func (l *SocketLink) String() string {
	return "udp " + net.JoinHostPort(l.addr.String(), strconv.Itoa(Port))
}
