// Package pcaptap records the RoCEv2 packets that go over a udp.Link into a
// pcap file, the way tcpdump would have seen them: each UDP payload (BTH ..
// ICRC) is framed with a reconstructed Ethernet, IPv4 or IPv6 and UDP header.
//
// The ICRC in a recorded packet is the one the link really computed (on
// send) or verified (on receive); it is not recomputed. The tap only has to
// find the IP/UDP header the packet travelled with: the backends send IPv4
// with DF and identification 0 from the source port Send leaves in
// Packet.SrcPort (the per-QP port, or SocketLink's own send port), and a
// received packet may carry any identification,
// which is solved for (icrc.SolveIPv4ID). So `rocev2d pcap check` on a tapped
// capture verifies the ICRCs the stack produced. A packet for which no
// header candidate makes the ICRC valid is written anyway (with identification
// 0 and DF) and counted in Writer.Unverified; pcap check then reports it.
//
// Of this module it imports udp (the Link it wraps) and icrc; it serves
// cmd/rocev2d, the only package that may import it.
package pcaptap

import (
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/udp"
)

// Header sizes and field values of the reconstructed frames.
const (
	ethSize   = 14
	ipv4Size  = 20
	ipv6Size  = 40
	udpSize   = 8
	ttl       = 64
	dfFlag    = 0x4000
	snapLen   = 65535
	etherIPv4 = 0x0800
	etherIPv6 = 0x86dd
)

// ErrClosed is returned by WritePacket after Close.
var ErrClosed = errors.New("pcaptap: writer closed")

// Writer writes Ethernet-framed RoCEv2 packets to a pcap stream. It is safe
// for concurrent use by any number of Taps.
type Writer struct {
	mu         sync.Mutex
	pw         *pcapgo.Writer
	c          io.Closer
	frame      []byte
	packets    uint64
	unverified uint64
	err        error
	closed     bool
	now        func() time.Time
}

// NewWriter writes the pcap file header (link type Ethernet) to w and returns
// a Writer. If w is an io.Closer, Close closes it.
func NewWriter(w io.Writer) (*Writer, error) {
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(snapLen, layers.LinkTypeEthernet); err != nil {
		return nil, err
	}
	c, _ := w.(io.Closer)
	return &Writer{pw: pw, c: c, frame: make([]byte, ethSize+ipv6Size+udpSize+udp.MaxPacketSize), now: time.Now}, nil
}

// Packets returns how many packets were written.
func (w *Writer) Packets() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.packets
}

// Unverified returns how many packets were written with a header for which
// their ICRC does not verify (none, unless a link computed a wrong ICRC).
func (w *Writer) Unverified() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unverified
}

// Err returns the first write error, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close stops writing and closes the underlying writer if it is a Closer.
// It returns the first write error, if any.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	w.closed = true
	if w.c != nil {
		if err := w.c.Close(); err != nil && w.err == nil {
			w.err = err
		}
	}
	return w.err
}

// WritePacket records one RoCEv2 UDP payload (BTH .. ICRC) sent from src to
// dst:4791. sport is the UDP source port the sender asked for and tos the IP
// TOS byte. See the package comment for how the header is reconstructed.
func (w *Writer) WritePacket(src, dst netip.Addr, sport uint16, tos uint8, payload []byte) error {
	src, dst = src.Unmap(), dst.Unmap()
	if src.Is4() != dst.Is4() {
		return errors.New("pcaptap: mixed IPv4/IPv6 addresses")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if w.err != nil {
		return w.err
	}
	f := w.frame
	var n int
	ok := false
	// Candidate source ports: the one given (after Send, the port really
	// used), then 4791 (links that send from their bound port).
	ports := [2]uint16{sport, udp.Port}
	for i, p := range ports {
		if i > 0 && p == ports[0] {
			continue
		}
		if src.Is4() {
			n, ok = frame4(f, src, dst, p, tos, payload)
		} else {
			n, ok = frame6(f, src, dst, p, tos, payload)
		}
		if ok {
			break
		}
	}
	if !ok {
		// Write the first candidate so that pcap check shows the problem.
		if src.Is4() {
			n, _ = frame4(f, src, dst, sport, tos, payload)
		} else {
			n, _ = frame6(f, src, dst, sport, tos, payload)
		}
		w.unverified++
	}
	ci := gopacket.CaptureInfo{Timestamp: w.now(), CaptureLength: n, Length: n}
	if err := w.pw.WritePacket(ci, f[:n]); err != nil {
		w.err = err
		return err
	}
	w.packets++
	return nil
}

// mac returns a locally administered MAC address derived from an IP.
func mac(b []byte, a netip.Addr) {
	s := a.As16()
	b[0], b[1] = 0x02, 0x00
	copy(b[2:6], s[12:16])
}

func putEth(f []byte, src, dst netip.Addr, etherType uint16) {
	mac(f[0:6], dst)
	mac(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], etherType)
}

func putUDP(u []byte, sport uint16, payloadLen int) {
	binary.BigEndian.PutUint16(u[0:2], sport)
	binary.BigEndian.PutUint16(u[2:4], udp.Port)
	binary.BigEndian.PutUint16(u[4:6], uint16(udpSize+payloadLen))
	binary.BigEndian.PutUint16(u[6:8], 0) // RoCEv2 senders use checksum 0
}

// frame4 writes an Ethernet/IPv4/UDP frame and reports whether an
// identification/flags choice makes the stored ICRC valid.
func frame4(f []byte, src, dst netip.Addr, sport uint16, tos uint8, payload []byte) (int, bool) {
	putEth(f, src, dst, etherIPv4)
	ip := f[ethSize : ethSize+ipv4Size]
	u := f[ethSize+ipv4Size : ethSize+ipv4Size+udpSize]
	n := copy(f[ethSize+ipv4Size+udpSize:], payload)
	putUDP(u, sport, n)
	h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), SrcPort: sport, DstPort: udp.Port}
	id, flags, ok := uint16(0), uint16(dfFlag), false
	for _, fl := range []uint16{dfFlag, 0} {
		h.FlagsFrag, h.ID = fl, 0
		if icrc.ComputeIPv4(&h, payload) == icrc.Load(payload) {
			id, flags, ok = 0, fl, true
			break
		}
		if sid, good := icrc.SolveIPv4ID(&h, payload); good {
			id, flags, ok = sid, fl, true
			break
		}
	}
	ip[0] = 0x45
	ip[1] = tos
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipv4Size+udpSize+n))
	binary.BigEndian.PutUint16(ip[4:6], id)
	binary.BigEndian.PutUint16(ip[6:8], flags)
	ip[8] = ttl
	ip[9] = 17
	binary.BigEndian.PutUint16(ip[10:12], 0)
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	return ethSize + ipv4Size + udpSize + n, ok
}

// frame6 writes an Ethernet/IPv6/UDP frame and reports whether the stored
// ICRC is valid for it.
func frame6(f []byte, src, dst netip.Addr, sport uint16, tos uint8, payload []byte) (int, bool) {
	putEth(f, src, dst, etherIPv6)
	ip := f[ethSize : ethSize+ipv6Size]
	u := f[ethSize+ipv6Size : ethSize+ipv6Size+udpSize]
	n := copy(f[ethSize+ipv6Size+udpSize:], payload)
	putUDP(u, sport, n)
	binary.BigEndian.PutUint32(ip[0:4], 6<<28|uint32(tos)<<20)
	binary.BigEndian.PutUint16(ip[4:6], uint16(udpSize+n))
	ip[6] = 17
	ip[7] = ttl
	s16, d16 := src.As16(), dst.As16()
	copy(ip[8:24], s16[:])
	copy(ip[24:40], d16[:])
	end := ethSize + ipv6Size + udpSize + n
	return end, icrc.Verify(f[ethSize:end]) == nil
}

// ipChecksum is the IPv4 header checksum (RFC 1071).
func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// Dir selects which packets a Tap records.
type Dir uint8

// Directions.
const (
	Sent     Dir = 1 << iota // packets the link sends
	Received                 // packets the link receives
	Both     = Sent | Received
)

// Tap is a udp.Link that records the packets of the Link it wraps.
type Tap struct {
	udp.Link
	w   *Writer
	dir Dir
}

var _ udp.Link = (*Tap)(nil)

// Unwrap returns the wrapped link (transport looks through it for a shared
// socket link's QPN leases: udp.SharedLink).
func (t *Tap) Unwrap() udp.Link { return t.Link }

// New wraps link so that packets in the directions dir are written to w.
// Two taps of a pair of links in one process should record only Sent, so
// that each packet on the wire appears once (as on a loopback capture).
func New(link udp.Link, w *Writer, dir Dir) *Tap {
	return &Tap{Link: link, w: w, dir: dir}
}

// Send sends pkts through the wrapped link and then records them (with the
// ICRC the link filled in).
func (t *Tap) Send(pkts []udp.Packet) error {
	err := t.Link.Send(pkts)
	if t.dir&Sent != 0 {
		n := len(pkts)
		if err != nil {
			// Packets before the failing one may have gone out; record
			// nothing we are not sure about.
			n = 0
		}
		src := t.Link.LocalAddr()
		for i := range pkts[:n] {
			p := &pkts[i]
			t.w.WritePacket(src, p.Addr, p.SrcPort, p.TOS, p.Buf)
		}
	}
	return err
}

// Recv receives through the wrapped link and records what arrived.
func (t *Tap) Recv(pkts []udp.Packet) (int, error) {
	n, err := t.Link.Recv(pkts)
	if t.dir&Received != 0 {
		dst := t.Link.LocalAddr()
		for i := range pkts[:n] {
			p := &pkts[i]
			t.w.WritePacket(p.Addr, dst, p.SrcPort, p.TOS, p.Buf)
		}
	}
	return n, err
}
