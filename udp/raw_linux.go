//go:build linux

package udp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
)

const (
	ipv4HdrLen = 20
	udpHdrLen  = 8
	// rawBufSize holds the largest accepted packet with a maximal IPv4
	// header; anything longer is truncated and dropped as malformed.
	rawBufSize = 60 + udpHdrLen + MaxPacketSize
)

// RawLink is an IPv4 Link over a raw IP socket (Linux, needs CAP_NET_RAW).
// Unlike SocketLink it sees and writes whole IP packets:
//
//   - Send writes the IPv4 header itself (IP_HDRINCL): DF, identification 0,
//     TTL 64, the packet's TOS, UDP source port Packet.SrcPort (4791 when
//     0), destination port 4791, UDP checksum 0 — the header rxe sends — and
//     the ICRC for exactly that header. The kernel routes it and fills the
//     IP checksum.
//   - Recv verifies the ICRC over the real IP and UDP header, identification
//     included (icrc.Verify), so IPv4 gets the full 32-bit check that a UDP
//     socket can only give IPv6. A classic BPF filter passes only unfragmented
//     UDP to addr:4791 up from the kernel.
//
// A GSO datagram (SocketLink with GSO, rxe never sends one) from this host
// or across a veth reaches a raw socket whole, since nothing on such a path
// segments it, and RawLink, which cannot know the segment size, drops it
// (DropBadICRC); on a physical wire the segments arrive one by one.
//
// A UDP socket bound to addr:4791 with a drop-all filter holds the port, so
// the kernel neither answers with ICMP port unreachable nor lets another
// program take it. IPv6 peers are served fully by SocketLink.
type RawLink struct {
	sockLink         // send: per message two iovecs, the header from shdr and the payload
	rx       *rxConn // receives: raw IPv4 socket, protocol UDP (see rxConn)
	holder   *fdConn // addr:4791, drops everything
	ttl      uint8
	shdr     []byte     // batch × 28: the IPv4+UDP header of each message
	rbuf     []byte     // batch × rawBufSize
	txFlow   flowPrefix // ICRC prefix of the flow sent last (under sendMu)
}

var _ BacklogLink = (*RawLink)(nil)

// rawFilter returns the classic BPF program of a RawLink on dst: it passes
// unfragmented UDP datagrams to dst:4791. The raw socket sees the packet
// from the IPv4 header on.
func rawFilter(dst [4]byte) []unix.SockFilter {
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 16}, // destination address
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 6, K: binary.BigEndian.Uint32(dst[:])},
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 6},                      // flags + fragment offset
		{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: 4, Jf: 0, K: 0x3fff}, // MF or offset: drop
		{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0},                     // X = IHL*4
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},                      // UDP destination port
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: Port},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
}

// ListenRaw opens a RawLink on the IPv4 address addr (IPv4-mapped IPv6 is
// accepted). It needs CAP_NET_RAW (errors.Is(err, syscall.EPERM) without);
// like ListenSocket it fails with EADDRINUSE when addr:4791 is taken and
// EADDRNOTAVAIL when addr is not on this host. opts may be nil.
func ListenRaw(addr netip.Addr, opts *RawOptions) (*RawLink, error) {
	var o RawOptions
	if opts != nil {
		o = *opts
	}
	socketDefaults(&o.RecvBufferSize, &o.SendBufferSize, &o.BatchSize)
	if o.TTL == 0 {
		o.TTL = 64
	}
	a := normAddr(addr)
	if !a.Is4() || a.IsUnspecified() || a.IsMulticast() {
		return nil, fmt.Errorf("udp: raw listen on %v: need a unicast IPv4 address of this host: %w", addr, ErrAddress)
	}
	ap := netip.AddrPortFrom(a, Port)

	// Hold addr:4791 first: it gives the clear EADDRINUSE / EADDRNOTAVAIL.
	holder, err := openSocket(ap, unix.SOCK_DGRAM, 0, func(fd int) error { return attachFilter(fd, dropAll) })
	if err != nil {
		return nil, fmt.Errorf("udp: raw listen %s: %w", ap, err)
	}
	rx, err := openRecvSocket(netip.AddrPortFrom(a, 0), unix.SOCK_RAW, unix.IPPROTO_UDP, func(fd int) error { return setRawOptions(fd, a.As4(), &o) })
	if err != nil {
		holder.Close()
		return nil, fmt.Errorf("udp: raw listen %s: %w", ap, err)
	}
	// Sends go out on a socket of their own, outside the poller (see
	// fdConn). IPPROTO_RAW implies IP_HDRINCL and never receives, so the
	// kernel does not clone every UDP packet of the host to it.
	tx, err := openSocket(netip.AddrPortFrom(a, 0), unix.SOCK_RAW, unix.IPPROTO_RAW, func(fd int) error {
		return setBuffers(fd, 4096, o.SendBufferSize)
	})
	if err != nil {
		rx.Close()
		holder.Close()
		return nil, fmt.Errorf("udp: raw listen %s: send socket: %w", ap, err)
	}
	l := &RawLink{
		rx:     rx,
		holder: holder,
		ttl:    o.TTL,
		shdr:   make([]byte, o.BatchSize*(ipv4HdrLen+udpHdrLen)),
		rbuf:   make([]byte, o.BatchSize*rawBufSize),
	}
	l.sockLink.init(rx, tx, a, o.BatchSize, 2)
	l.recv.spin = o.BusyPoll
	for i := range l.send.hdrs {
		l.send.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
	}
	return l, nil
}

// setRawOptions configures the new raw socket fd, before it is bound to
// addr. A raw socket receives every UDP packet of the host from the moment
// it exists until bind(2), and bind does not flush what was queued: under
// load other programs' RoCEv2 traffic on the host (valid ICRCs, other
// addresses) got into that queue and was returned by Recv. So the socket
// first gets a drop-all filter, its queue is drained, and only then the
// filter that passes addr:4791 alone.
func setRawOptions(fd int, addr [4]byte, o *RawOptions) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_HDRINCL, 1); err != nil {
		return fmt.Errorf("setsockopt IP_HDRINCL: %w", err)
	}
	if err := attachFilter(fd, dropAll); err != nil {
		return err
	}
	if err := drainSocket(fd); err != nil {
		return err
	}
	if err := attachFilter(fd, rawFilter(addr)); err != nil {
		return err
	}
	return setBuffers(fd, o.RecvBufferSize, o.SendBufferSize)
}

// drainSocket discards the datagrams queued on the socket fd, without
// blocking (MSG_DONTWAIT).
// With a drop-all filter attached nothing new is queued, so it ends at
// EAGAIN; the bound is only a safety net.
func drainSocket(fd int) error {
	var b [1]byte
	for range 1 << 20 {
		_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		switch err {
		case nil, unix.EINTR:
		case unix.EAGAIN:
			return nil
		default:
			return fmt.Errorf("drain raw socket: %w", err)
		}
	}
	return fmt.Errorf("drain raw socket: queue does not empty: %w", unix.EBUSY)
}

// Close closes the sockets; a blocked Recv returns net.ErrClosed. Closing
// twice is harmless.
func (l *RawLink) Close() error {
	err := l.rx.Close()
	l.tx.Close()
	l.holder.Close()
	return closeErr(err, "close raw", l.addr)
}

// Send builds each packet's IPv4 and UDP header (see RawLink), fills the
// ICRC for it and sends the packets with sendmmsg, BatchSize per call. It
// returns after every packet was accepted by the kernel, or with the first
// error (packets before it were sent).
func (l *RawLink) Send(pkts []Packet) error {
	if err := checkSend(pkts, l.addr, false); err != nil {
		return err
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	s := &l.send
	for base := 0; base < len(pkts); {
		k := min(l.batch, len(pkts)-base)
		for i := range k {
			l.buildPacket(i, &pkts[base+i])
		}
		done, err := s.send(l.tx, k, &l.sent)
		s.clearIovs(2 * k)
		if err != nil && s.errno != 0 {
			p := &pkts[base+done]
			return fmt.Errorf("udp: raw sendmmsg packet %d (%d bytes) to %v: %w", base+done, len(p.Buf), p.Addr, s.errno)
		}
		if err != nil {
			return fmt.Errorf("udp: raw send: %w", err)
		}
		base += k
	}
	return nil
}

// buildPacket writes message i: the IPv4+UDP header for p, p's ICRC, and
// the destination.
func (l *RawLink) buildPacket(i int, p *Packet) {
	s := &l.send
	dst := normAddr(p.Addr)
	sport := p.SrcPort
	if sport == 0 {
		sport = Port
		p.SrcPort = sport // Send reports the port used (see Packet)
	}
	ip := l.shdr[i*(ipv4HdrLen+udpHdrLen) : (i+1)*(ipv4HdrLen+udpHdrLen)]
	ip[0] = 0x45
	ip[1] = p.TOS
	binary.BigEndian.PutUint16(ip[2:], uint16(ipv4HdrLen+udpHdrLen+len(p.Buf)))
	binary.BigEndian.PutUint16(ip[4:], 0)      // identification
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = l.ttl
	ip[9] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[10:], 0) // checksum: the kernel fills it
	a4, d4 := l.addr.As4(), dst.As4()
	copy(ip[12:16], a4[:])
	copy(ip[16:20], d4[:])
	u := ip[ipv4HdrLen:]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], Port)
	binary.BigEndian.PutUint16(u[4:], uint16(udpHdrLen+len(p.Buf)))
	binary.BigEndian.PutUint16(u[6:], 0) // UDP checksum 0, like rxe
	icrc.Store(p.Buf, l.txFlow.get(l.addr, dst, sport).Compute(0, p.Buf))
	s.iovs[2*i].Base = &ip[0]
	s.iovs[2*i].SetLen(len(ip))
	s.iovs[2*i+1].Base = &p.Buf[0]
	s.iovs[2*i+1].SetLen(len(p.Buf))
	sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&s.names[i]))
	sa.Family = unix.AF_INET
	sa.Addr = d4
}

// Recv receives up to min(len(pkts), BatchSize) packets, blocking until at
// least one valid RoCEv2 packet arrived. Each IP packet is checked (IPv4,
// UDP, lengths consistent: else DropMalformed; addressed to this link: else
// DropOther, which the socket filter makes unreachable) and its ICRC
// verified over the real headers (else DropBadICRC); the UDP payload is
// copied into the caller's Buf.
func (l *RawLink) Recv(pkts []Packet) (int, error) {
	if err := checkRecv(pkts, l.batch); err != nil || len(pkts) == 0 {
		return 0, err
	}
	l.recvMu.Lock()
	defer l.recvMu.Unlock()
	s := &l.recv
	k := min(len(pkts), l.batch)
	for {
		for i := range k {
			s.prepRecv(i, l.rbuf[i*rawBufSize:(i+1)*rawBufSize], false)
		}
		if err := s.recv(l.rc, k, "udp: raw ", l.addr); err != nil {
			return 0, err
		}
		out := 0
		for i := 0; i < s.n; i++ {
			m := &s.hdrs[i]
			ip := l.rbuf[i*rawBufSize : i*rawBufSize+int(m.Len)]
			if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
				l.malformed.Add(1)
				continue
			}
			if l.acceptRaw(ip, &pkts[out]) {
				out++
			}
		}
		if out > 0 {
			l.rcvd.Add(uint64(out))
			return out, nil
		}
	}
}

// acceptRaw checks one received IPv4 packet and copies its UDP payload to p.
func (l *RawLink) acceptRaw(ip []byte, p *Packet) bool {
	if len(ip) < ipv4HdrLen || ip[0]>>4 != 4 {
		l.malformed.Add(1)
		return false
	}
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ihl < ipv4HdrLen || total != len(ip) || total < ihl+udpHdrLen || ip[9] != unix.IPPROTO_UDP {
		l.malformed.Add(1)
		return false
	}
	if [4]byte(ip[16:20]) != l.addr.As4() {
		l.other.Add(1)
		return false
	}
	u := ip[ihl:]
	if int(binary.BigEndian.Uint16(u[4:])) != len(u) || binary.BigEndian.Uint16(u[2:]) != Port {
		l.malformed.Add(1)
		return false
	}
	payload := u[udpHdrLen:]
	if len(payload) < minPacketSize || len(payload) > MaxPacketSize {
		l.malformed.Add(1)
		return false
	}
	if err := icrc.Verify(ip); err != nil {
		if errors.Is(err, icrc.ErrMismatch) {
			l.badICRC.Add(1)
		} else {
			l.malformed.Add(1)
		}
		return false
	}
	p.Buf = p.Buf[:len(payload)]
	copy(p.Buf, payload)
	p.Addr = netip.AddrFrom4([4]byte(ip[12:16]))
	p.SrcPort = binary.BigEndian.Uint16(u[0:])
	p.TOS = ip[1]
	return true
}
