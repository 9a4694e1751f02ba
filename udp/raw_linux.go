//go:build linux

package udp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
)

// RawOptions configures ListenRaw. The zero value is sensible.
type RawOptions struct {
	// RecvBufferSize and SendBufferSize as in SocketOptions; 0 means 8 MiB.
	RecvBufferSize, SendBufferSize int
	// BatchSize is the number of datagrams per sendmmsg/recvmmsg call; 0 means 64.
	BatchSize int
	// TTL of sent packets; 0 means 64 (what rxe sends).
	TTL uint8
}

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
//     UDP to port 4791 up from the kernel.
//
// A UDP socket bound to addr:4791 with a drop-all filter holds the port, so
// the kernel neither answers with ICMP port unreachable nor lets another
// program take it. IPv6 peers are served fully by SocketLink.
type RawLink struct {
	conn   *net.IPConn
	rc     syscall.RawConn
	holder *net.UDPConn // addr:4791, drops everything
	addr   netip.Addr
	batch  int
	ttl    uint8

	sendMu sync.Mutex
	send   rawSendState
	sendFn func(fd uintptr) bool

	recvMu sync.Mutex
	recv   mmsgState
	recvFn func(fd uintptr) bool
	rbuf   []byte // batch × rawBufSize

	sent, rcvd, badICRC, malformed, other atomic.Uint64
}

var _ Link = (*RawLink)(nil)

// rawSendState: per message two iovecs, the 28-byte IPv4+UDP header from
// hdr and the caller's payload.
type rawSendState struct {
	hdrs     []unix.Mmsghdr
	iovs     []unix.Iovec // 2 per message
	names    []unix.RawSockaddrInet4
	hdr      []byte // batch × 28
	off, cnt int
	n        int
	errno    unix.Errno
}

// rawFilter passes unfragmented UDP datagrams to port 4791; the raw socket
// sees the packet from the IPv4 header on.
var rawFilter = []unix.SockFilter{
	{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 6},                      // flags + fragment offset
	{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: 4, Jf: 0, K: 0x3fff}, // MF or offset: drop
	{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0},                     // X = IHL*4
	{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},                      // UDP destination port
	{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: Port},
	{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff},
	{Code: unix.BPF_RET | unix.BPF_K, K: 0},
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
	if o.RecvBufferSize <= 0 {
		o.RecvBufferSize = defaultSocketBuf
	}
	if o.SendBufferSize <= 0 {
		o.SendBufferSize = defaultSocketBuf
	}
	if o.BatchSize <= 0 {
		o.BatchSize = defaultSocketBatch
	}
	if o.TTL == 0 {
		o.TTL = 64
	}
	a := normAddr(addr)
	if !a.Is4() || a.IsUnspecified() || a.IsMulticast() {
		return nil, fmt.Errorf("udp: raw listen on %v: need a unicast IPv4 address of this host: %w", addr, ErrAddress)
	}
	ap := netip.AddrPortFrom(a, Port)

	// Hold addr:4791 first: it gives the clear EADDRINUSE / EADDRNOTAVAIL.
	var holdErr error
	hl := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		err := c.Control(func(fd uintptr) {
			dropAll := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
			holdErr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
				&unix.SockFprog{Len: 1, Filter: &dropAll[0]})
		})
		if err != nil {
			return err
		}
		return holdErr
	}}
	hpc, err := hl.ListenPacket(context.Background(), "udp4", ap.String())
	if err != nil {
		return nil, fmt.Errorf("udp: raw listen %s: %w", ap, err)
	}
	holder := hpc.(*net.UDPConn)

	var sockErr error
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		err := c.Control(func(fd uintptr) {
			sockErr = setRawOptions(int(fd), &o)
		})
		if err != nil {
			return err
		}
		return sockErr
	}}
	pc, err := lc.ListenPacket(context.Background(), "ip4:udp", a.String())
	if err != nil {
		holder.Close()
		return nil, fmt.Errorf("udp: raw listen %s: %w", ap, err)
	}
	conn := pc.(*net.IPConn)
	rc, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		holder.Close()
		return nil, fmt.Errorf("udp: raw listen %s: %w", ap, err)
	}
	l := &RawLink{
		conn:   conn,
		rc:     rc,
		holder: holder,
		addr:   a,
		batch:  o.BatchSize,
		ttl:    o.TTL,
		recv:   newMmsgState(o.BatchSize),
		rbuf:   make([]byte, o.BatchSize*rawBufSize),
	}
	b := o.BatchSize
	l.send = rawSendState{
		hdrs:  make([]unix.Mmsghdr, b),
		iovs:  make([]unix.Iovec, 2*b),
		names: make([]unix.RawSockaddrInet4, b),
		hdr:   make([]byte, b*(ipv4HdrLen+udpHdrLen)),
	}
	for i := range l.send.hdrs {
		h := &l.send.hdrs[i].Hdr
		h.Iov = &l.send.iovs[2*i]
		h.SetIovlen(2)
		h.Name = (*byte)(unsafe.Pointer(&l.send.names[i]))
		h.Namelen = unix.SizeofSockaddrInet4
		l.send.iovs[2*i].Base = &l.send.hdr[i*(ipv4HdrLen+udpHdrLen)]
		l.send.iovs[2*i].SetLen(ipv4HdrLen + udpHdrLen)
	}
	for i := range b {
		buf := l.rbuf[i*rawBufSize : (i+1)*rawBufSize]
		l.recv.iovs[i].Base = &buf[0]
		l.recv.iovs[i].SetLen(len(buf))
	}
	l.sendFn = l.doSend
	l.recvFn = l.doRecv
	return l, nil
}

func setRawOptions(fd int, o *RawOptions) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_HDRINCL, 1); err != nil {
		return fmt.Errorf("setsockopt IP_HDRINCL: %w", err)
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(rawFilter)), Filter: &rawFilter[0]}); err != nil {
		return fmt.Errorf("setsockopt SO_ATTACH_FILTER: %w", err)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, o.RecvBufferSize) != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, o.RecvBufferSize); err != nil {
			return fmt.Errorf("setsockopt SO_RCVBUF: %w", err)
		}
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, o.SendBufferSize) != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, o.SendBufferSize); err != nil {
			return fmt.Errorf("setsockopt SO_SNDBUF: %w", err)
		}
	}
	return nil
}

// LocalAddr returns the bound IPv4 address.
func (l *RawLink) LocalAddr() netip.Addr { return l.addr }

// BatchSize returns the number of datagrams per sendmmsg/recvmmsg call.
func (l *RawLink) BatchSize() int { return l.batch }

// Stats returns a snapshot of the link's counters.
func (l *RawLink) Stats() Stats {
	return Stats{
		SentPkts:      l.sent.Load(),
		RcvdPkts:      l.rcvd.Load(),
		DropBadICRC:   l.badICRC.Load(),
		DropMalformed: l.malformed.Load(),
		DropOther:     l.other.Load(),
	}
}

// Close closes both sockets; a blocked Recv returns net.ErrClosed. Closing
// twice is harmless.
func (l *RawLink) Close() error {
	err := l.conn.Close()
	l.holder.Close()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("udp: close raw %v: %w", l.addr, err)
	}
	return nil
}

// Send builds each packet's IPv4 and UDP header (see RawLink), fills the
// ICRC for it and sends the packets with sendmmsg, BatchSize per call. It
// returns after every packet was accepted by the kernel, or with the first
// error (packets before it were sent).
func (l *RawLink) Send(pkts []Packet) error {
	for i := range pkts {
		p := &pkts[i]
		if len(p.Buf) < minPacketSize || len(p.Buf) > MaxPacketSize {
			return fmt.Errorf("udp: send packet %d: length %d not in [%d, %d]: %w",
				i, len(p.Buf), minPacketSize, MaxPacketSize, ErrPacketSize)
		}
		if dst := normAddr(p.Addr); !dst.Is4() {
			return fmt.Errorf("udp: send packet %d: destination %v from %v: %w", i, p.Addr, l.addr, ErrAddress)
		}
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	s := &l.send
	for base := 0; base < len(pkts); {
		k := min(l.batch, len(pkts)-base)
		for i := range k {
			l.buildPacket(i, &pkts[base+i])
		}
		s.off, s.cnt = 0, k
		for s.off < s.cnt {
			if err := l.rc.Write(l.sendFn); err != nil {
				l.clearSend(k)
				return fmt.Errorf("udp: raw send: %w", err)
			}
			if s.errno != 0 {
				l.clearSend(k)
				return fmt.Errorf("udp: raw sendmmsg packet %d (%d bytes) to %v: %w",
					base+s.off, len(pkts[base+s.off].Buf), pkts[base+s.off].Addr, s.errno)
			}
			s.off += s.n
			l.sent.Add(uint64(s.n))
		}
		l.clearSend(k)
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
	}
	ip := s.hdr[i*(ipv4HdrLen+udpHdrLen) : (i+1)*(ipv4HdrLen+udpHdrLen)]
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
	h := icrc.IPv4Pseudo{Src: a4, Dst: d4, ID: 0, FlagsFrag: 0x4000, SrcPort: sport, DstPort: Port}
	icrc.Store(p.Buf, icrc.ComputeIPv4(&h, p.Buf))
	s.iovs[2*i+1].Base = &p.Buf[0]
	s.iovs[2*i+1].SetLen(len(p.Buf))
	s.names[i].Family = unix.AF_INET
	s.names[i].Addr = d4
}

func (l *RawLink) clearSend(k int) {
	for i := range k {
		l.send.iovs[2*i+1].Base = nil
	}
}

func (l *RawLink) doSend(fd uintptr) bool {
	s := &l.send
	var n uintptr
	var e unix.Errno
	for {
		n, _, e = unix.Syscall6(unix.SYS_SENDMMSG, fd,
			uintptr(unsafe.Pointer(&s.hdrs[s.off])), uintptr(s.cnt-s.off), unix.MSG_DONTWAIT, 0, 0)
		if e != unix.EINTR {
			break
		}
	}
	if e == unix.EAGAIN {
		return false
	}
	s.errno = e
	s.n = int(n)
	if e != 0 {
		s.n = 0
	}
	return true
}

func (l *RawLink) doRecv(fd uintptr) bool {
	s := &l.recv
	var n uintptr
	var e unix.Errno
	for {
		n, _, e = unix.Syscall6(unix.SYS_RECVMMSG, fd,
			uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(s.cnt), unix.MSG_DONTWAIT, 0, 0)
		if e != unix.EINTR {
			break
		}
	}
	if e == unix.EAGAIN {
		return false
	}
	s.errno = e
	s.n = int(n)
	if e != 0 {
		s.n = 0
	}
	return true
}

// Recv receives up to min(len(pkts), BatchSize) packets, blocking until at
// least one valid RoCEv2 packet arrived. Each IP packet is checked (IPv4,
// UDP, lengths consistent: else DropMalformed) and its ICRC verified over
// the real headers (else DropBadICRC); the UDP payload is copied into the
// caller's Buf.
func (l *RawLink) Recv(pkts []Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	for i := range pkts {
		if cap(pkts[i].Buf) < MaxPacketSize {
			return 0, fmt.Errorf("udp: recv packet %d: buffer cap %d: %w", i, cap(pkts[i].Buf), ErrShortBuffer)
		}
	}
	l.recvMu.Lock()
	defer l.recvMu.Unlock()
	s := &l.recv
	k := min(len(pkts), l.batch)
	for {
		for i := range k {
			h := &s.hdrs[i].Hdr
			h.Namelen = unix.SizeofSockaddrInet6
			h.Control = nil
			h.SetControllen(0)
			h.Flags = 0
			s.hdrs[i].Len = 0
		}
		s.cnt = k
		err := l.rc.Read(l.recvFn)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0, net.ErrClosed
			}
			return 0, fmt.Errorf("udp: raw recv: %w", err)
		}
		if s.errno != 0 {
			return 0, fmt.Errorf("udp: raw recvmmsg on %v: %w", l.addr, s.errno)
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
