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
// Recording is meant to cost the stack only the recording (docs/CAPTURE.md):
// a Tap keeps the wrapped link's capabilities (udp.Wrap), each packet is
// copied once into a buffer that a goroutine of its own writes to the file,
// and a snap length (NewWriterSnap, tcpdump's -s) keeps only the headers.
//
// Of this module it imports udp (the Link it wraps) and icrc; it serves
// cmd/rocev2d, the only package that may import it.
package pcaptap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
	etherIPv4 = 0x0800
	etherIPv6 = 0x86dd
)

// ErrClosed is returned by WritePacket after Close.
var ErrClosed = errors.New("pcaptap: writer closed")

// Buffering of the file: records are appended to an in-memory buffer of
// BufferSize bytes; a full buffer is handed to a goroutine that writes it to
// the file while the stack goes on recording into the next one (Buffers in
// all). So recording costs the stack one copy of each packet into memory;
// the file's write system calls run beside it, and the stack waits only
// when the writer falls Buffers behind. What is recorded reaches the file
// at the latest FlushInterval later, and on Flush and Close.
const (
	BufferSize    = 2 << 20
	Buffers       = 6
	FlushInterval = time.Second
)

// directWriters is how many goroutines write a direct-I/O file at once:
// each write waits for the device, and one at a time (2 MiB) left this
// VM's disk at ~300 MB/s, below what a captured write-bw records.
const directWriters = 3

// Writer writes Ethernet-framed RoCEv2 packets to a pcap stream, buffered
// (BufferSize, Buffers, FlushInterval). It is safe for concurrent use by
// any number of Taps.
type Writer struct {
	mu         sync.Mutex
	c          io.Closer
	cur        []byte      // records not yet handed to the file goroutine
	free       chan []byte // empty buffers
	full       chan chunk  // buffers for the file goroutine
	align      int         // direct I/O: the file is written in blocks of align bytes at off; 0: a stream
	off        int64       // direct I/O: the file offset of cur[0]
	synced     int         // direct I/O: cur[:synced] is in the file already (a flushed tail)
	pending    sync.WaitGroup
	padded     bool          // direct I/O: a padded chunk may be in flight (the next one rewrites its last block)
	mapped     [][]byte      // direct I/O: buffers from mapBuffer, for Close to unmap
	done       chan struct{} // closed when the file goroutine ends
	werr       atomic.Pointer[error]
	snap       int
	packets    uint64
	unverified uint64
	err        error
	closed     bool
	now        func() time.Time
	flushT     *time.Timer // armed while records wait in cur
	armed      bool
	flows      [4]flowEntry // the flows of the last packets (ident4, port6)
	nextFlow   int          // the entry flow replaces next
	hdrs       [4]hdrEntry  // the frame headers of the last packets (putHeader)
	nextHdr    int          // the entry putHeader replaces next
}

// NewWriter writes the pcap file header (link type Ethernet) to w and returns
// a Writer that records whole packets. If w is an io.Closer, Close closes it.
func NewWriter(w io.Writer) (*Writer, error) { return NewWriterSnap(w, 0) }

// NewWriterSnap is NewWriter with a snap length, as tcpdump's -s: each
// record keeps at most snapLen bytes of its frame (the file header says
// so, each record has the frame's real length), 0 whole frames. With a
// snap length below the Ethernet, IP and UDP headers plus the BTH and its
// extension headers, records lose header fields; 128 keeps every header.
// The IPv4 identification of a cut record is not solved from its ICRC (the
// ICRC is not in the file): it is written as 0, with DF.
func NewWriterSnap(w io.Writer, snapLen int) (*Writer, error) {
	snapLen, err := checkSnap(snapLen)
	if err != nil {
		return nil, err
	}
	if err := pcapgo.NewWriter(w).WriteFileHeader(uint32(snapLen), layers.LinkTypeEthernet); err != nil {
		return nil, err
	}
	c, _ := w.(io.Closer)
	return newWriter(streamOut{w}, c, snapLen, 0), nil
}

// checkSnap returns the snap length a Writer uses for snapLen.
func checkSnap(snapLen int) (int, error) {
	max := ethSize + ipv6Size + udpSize + udp.MaxPacketSize
	if snapLen < 0 {
		return 0, fmt.Errorf("pcaptap: snap length %d", snapLen)
	}
	if snapLen == 0 || snapLen > max {
		snapLen = max
	}
	return snapLen, nil
}

// newWriter returns a Writer whose file goroutine writes to out; align > 0
// is direct I/O in blocks of align bytes (buffers aligned to it).
func newWriter(out fileOut, c io.Closer, snapLen, align int) *Writer {
	wr := &Writer{c: c, snap: snapLen, now: time.Now, align: align,
		free: make(chan []byte, Buffers), full: make(chan chunk, Buffers), done: make(chan struct{})}
	wr.cur = wr.newBuffer()
	for range Buffers - 1 {
		wr.free <- wr.newBuffer()
	}
	writers := 1
	if align > 0 {
		writers = directWriters
	}
	var loops sync.WaitGroup
	for range writers {
		loops.Go(func() { wr.fileLoop(out) })
	}
	go func() {
		loops.Wait()
		close(wr.done)
	}()
	wr.flushT = time.AfterFunc(time.Hour, wr.timedFlush)
	wr.flushT.Stop()
	return wr
}

// newBuffer returns an empty buffer of capacity BufferSize whose first
// byte is aligned to w.align bytes (0 or a power of 2). A direct-I/O
// buffer is mapped memory where the system gives it (mapBuffer: huge
// pages), unmapped by Close.
//
// Every page of the buffer is touched here (prefault), when the capture
// is made: otherwise the stack faults them in while it records, in the
// middle of the traffic (the first touch of a huge page zeroes 2 MiB; in
// a captured write-bw client's profile, ~1 % of its CPU went to the
// first pass over the buffers).
func (w *Writer) newBuffer() []byte {
	if w.align == 0 {
		return prefault(make([]byte, 0, BufferSize))
	}
	if b := mapBuffer(BufferSize); b != nil {
		w.mapped = append(w.mapped, b)
		return prefault(b[:0:BufferSize])
	}
	return prefault(alignedBuffer(w.align))
}

// prefault writes a zero to every 4 KiB page of b's capacity and returns
// b.
func prefault(b []byte) []byte {
	all := b[:cap(b)]
	for i := 0; i < len(all); i += 4096 {
		all[i] = 0
	}
	return b
}

// alignedBuffer returns an empty buffer of capacity BufferSize from the Go
// heap whose first byte is aligned to align bytes (a power of 2).
func alignedBuffer(align int) []byte {
	b := make([]byte, BufferSize+align)
	skip := (align - int(uintptr(unsafe.Pointer(&b[0]))&uintptr(align-1))) & (align - 1)
	return b[skip : skip : skip+BufferSize]
}

// chunk is one write of the file goroutine.
type chunk struct {
	b   []byte // the bytes to write
	off int64  // direct I/O: the file offset of b
	end int64  // direct I/O: the file's length once b is written (b may be padded past it)
	buf []byte // the buffer b lies in, to give back
}

// fileOut is where the file goroutine writes chunks.
type fileOut interface {
	writeChunk(c chunk) error
}

// streamOut writes chunks one after the other to an io.Writer.
type streamOut struct{ w io.Writer }

func (s streamOut) writeChunk(c chunk) error {
	_, err := s.w.Write(c.b)
	return err
}

// fileLoop writes the handed-over chunks to out until full is closed;
// after a write error it drops them (the error is reported). A stream has
// one fileLoop (its chunks are written in order); a direct-I/O file has
// directWriters, each chunk written at its offset.
func (w *Writer) fileLoop(out fileOut) {
	for c := range w.full {
		if w.werr.Load() == nil {
			if err := out.writeChunk(c); err != nil {
				w.werr.Store(&err)
			}
		}
		w.free <- c.buf[:0]
		w.pending.Done()
	}
}

// handOff gives the records in cur to the file goroutine and takes an
// empty buffer (waiting if all are in flight). w.mu is held. With direct
// I/O only whole blocks are written, unless pad is set (Flush, Close, the
// flush timer): then the last block too, padded with zeros, and the file
// is cut to the records' end. The bytes after the last whole block move
// to the start of the next buffer, to be written again with what follows
// them.
func (w *Writer) handOff(pad bool) {
	if len(w.cur) == w.synced {
		return
	}
	if w.align == 0 {
		w.pending.Add(1)
		w.full <- chunk{b: w.cur, buf: w.cur}
		w.cur = <-w.free
		return
	}
	if w.padded {
		// The padded chunk's last block is written again by this one:
		// it must land first.
		w.pending.Wait()
		w.padded = false
	}
	n := len(w.cur)
	whole := n &^ (w.align - 1)
	c := chunk{b: w.cur[:whole], off: w.off, end: w.off + int64(n), buf: w.cur}
	if pad && whole < n {
		c.b = w.cur[:whole+w.align]
		clear(c.b[n:])
		w.padded = true
	}
	next := <-w.free
	w.cur = append(next, w.cur[whole:n]...)
	w.off += int64(whole)
	w.synced = 0
	if pad {
		w.synced = len(w.cur)
	}
	if len(c.b) == 0 {
		w.free <- c.buf[:0]
		return
	}
	w.pending.Add(1)
	w.full <- c
}

// fileErr moves an error of the file goroutine into w.err (w.mu held).
func (w *Writer) fileErr() error {
	if e := w.werr.Load(); e != nil && w.err == nil {
		w.err = *e
	}
	return w.err
}

// SnapLen returns the most bytes of a frame a record keeps.
func (w *Writer) SnapLen() int { return w.snap }

// timedFlush hands over what waited FlushInterval in the buffer.
func (w *Writer) timedFlush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	if !w.closed {
		w.handOff(true)
	}
}

// Flush writes out every record so far and waits until the file has them.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	w.handOff(true)
	w.pending.Wait()
	return w.fileErr()
}

// Packets returns how many packets were recorded: the records in the file
// once it is flushed (Flush, Close).
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
	return w.fileErr()
}

// Close writes out the buffered records, stops writing and closes the
// underlying writer if it is a Closer. It returns the first write error,
// if any.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	w.closed = true
	w.flushT.Stop()
	w.handOff(true)
	close(w.full)
	<-w.done
	for _, b := range w.mapped {
		unmapBuffer(b)
	}
	w.mapped = nil
	w.fileErr()
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
	t := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	p := udp.Packet{Buf: payload}
	return w.write(stampOf(t), src.Unmap(), dst.Unmap(), sport, tos, &p)
}

// stamp is a record's timestamp as the file keeps it (microseconds).
type stamp struct{ sec, usec uint32 }

func stampOf(t time.Time) stamp {
	return stamp{sec: uint32(t.Unix()), usec: uint32(t.Nanosecond() / 1000)}
}

// writeBatch records the packets of one Send or Recv call: sent from local
// (sent) or received by it. It returns how many it recorded. The packets
// share one timestamp (reading the clock was a third of a record's cost)
// and one hold of the lock: a lock and an unlock per packet cost 60-70 ns
// here (atomic instructions are slow on this VM), a fifth of a whole
// 1 KiB record's cost and half of a headers-only one's.
func (w *Writer) writeBatch(local netip.Addr, sent bool, pkts []udp.Packet) int {
	if len(pkts) == 0 {
		return 0
	}
	t, n := w.now(), 0
	w.mu.Lock()
	defer w.mu.Unlock()
	ts, local := stampOf(t), local.Unmap()
	for i := range pkts {
		p := &pkts[i]
		src, dst := local, p.Addr.Unmap()
		if !sent {
			src, dst = dst, src
		}
		if w.write(ts, src, dst, p.SrcPort, p.TOS, p) == nil {
			n++
		}
	}
	return n
}

// write records the packet p (its UDP payload as it went on the wire, see
// udp.Packet.AppendWire) sent from src to dst, addresses unmapped, at ts
// (w.mu held). The record is built in place in the buffer: the payload is
// copied there while its ICRC is computed (one pass over it), then the
// headers are written in front (from the header cache: segments of one
// GSO datagram differ only in the IPv4 identification). A cut record
// (snap length) copies only the bytes it keeps.
func (w *Writer) write(ts stamp, src, dst netip.Addr, sport uint16, tos uint8, p *udp.Packet) error {
	v4 := src.Is4()
	if v4 != dst.Is4() {
		return errors.New("pcaptap: mixed IPv4/IPv6 addresses")
	}
	if w.closed {
		return ErrClosed
	}
	if err := w.fileErr(); err != nil {
		return err
	}
	hdr := ethSize + ipv4Size + udpSize
	if !v4 {
		hdr = ethSize + ipv6Size + udpSize
	}
	plen := len(p.Buf)
	if p.Payload != nil {
		plen += len(p.Payload)
	}
	n := hdr + plen
	keep := min(n, w.snap)
	rec := w.reserve(ts, keep, n)
	if n > w.snap {
		// A cut record: only the headers are kept, so only they are
		// built (the ICRC that picks the identification is not kept).
		c := w.putHeader(rec, src, dst, sport, tos, 0, dfFlag, plen)
		copyWire(rec[c:], p)
		return nil
	}
	// The packet is copied into the record while its ICRC is computed;
	// a zero-copy packet (udp.CapZeroCopy, its payload sent from
	// registered memory) is put together there in the same pass.
	q, out := wireOf(p), rec[hdr:]
	ok := false
	if v4 {
		var port, id, flags uint16
		port, id, flags, ok = w.ident4(src, dst, sport, &q, out)
		w.putHeader(rec, src, dst, port, tos, id, flags, plen)
	} else {
		var port uint16
		port, ok = w.port6(src, dst, sport, &q, out)
		w.putHeader(rec, src, dst, port, tos, 0, 0, plen)
	}
	if !ok {
		// Written with the first candidate, so that pcap check shows the
		// problem.
		w.unverified++
	}
	return nil
}

// copyWire copies the first len(dst) bytes (at most) of p's UDP payload as
// it went on the wire to dst: Buf, or for a zero-copy packet Buf's headers,
// Payload, then Buf's pad and ICRC.
func copyWire(dst []byte, p *udp.Packet) {
	if p.Payload == nil {
		copy(dst, p.Buf)
		return
	}
	at := p.PayloadAt()
	c := copy(dst, p.Buf[:at])
	c += copy(dst[c:], p.Payload)
	copy(dst[c:], p.Buf[at:])
}

// hdrEntry is a cached frame header: Ethernet, IP and UDP of the packets
// of one flow with one TOS, IPv4 flags and payload length, built with
// identification 0. sum is the IPv4 header's 16-bit word sum without the
// identification and the checksum, to give the checksum of any
// identification without summing the header again.
type hdrEntry struct {
	src, dst netip.Addr
	sport    uint16
	tos      uint8
	flags    uint16
	plen     int
	n        int // the header's length (0: the entry is empty)
	sum      uint32
	b        [ethSize + ipv6Size + udpSize]byte
}

// putHeader writes the Ethernet, IP and UDP headers of a frame carrying a
// plen-byte RoCEv2 packet to the start of rec, at most len(rec) bytes, and
// returns how many it wrote (w.mu held). The bytes are header4's or
// header6's; the header is built once per flow, TOS, flags and length
// (hdrs), and only the identification and checksum are put in for each
// IPv4 packet.
func (w *Writer) putHeader(rec []byte, src, dst netip.Addr, sport uint16, tos uint8, id, flags uint16, plen int) int {
	var e *hdrEntry
	for i := range w.hdrs {
		c := &w.hdrs[i]
		if c.n != 0 && c.plen == plen && c.sport == sport && c.tos == tos && c.flags == flags && c.src == src && c.dst == dst {
			e = c
			break
		}
	}
	if e == nil {
		e = &w.hdrs[w.nextHdr%len(w.hdrs)]
		w.nextHdr++
		*e = hdrEntry{src: src, dst: dst, sport: sport, tos: tos, flags: flags, plen: plen}
		if src.Is4() {
			header4(e.b[:], src, dst, sport, tos, 0, flags, plen)
			e.n = ethSize + ipv4Size + udpSize
			ip := e.b[ethSize : ethSize+ipv4Size]
			e.sum = ipSum(ip) - uint32(binary.BigEndian.Uint16(ip[10:12]))
		} else {
			header6(e.b[:], src, dst, sport, tos, plen)
			e.n = ethSize + ipv6Size + udpSize
		}
	}
	c := copy(rec, e.b[:e.n])
	// Patched in the record itself (building the header on the stack
	// and copying it stalled on store forwarding). Only whole records
	// have identifications other than 0; a record cut inside the IP
	// header is a cut record, written with 0.
	if e.n == ethSize+ipv4Size+udpSize && id != 0 && c >= ethSize+ipv4Size {
		ip := rec[ethSize : ethSize+ipv4Size]
		binary.BigEndian.PutUint16(ip[4:6], id)
		binary.BigEndian.PutUint16(ip[10:12], fold(e.sum+uint32(id)))
	}
	return c
}

// flowEntry caches the ICRC prefixes of one flow (addresses and source
// port) and the identification its next packet likely has.
type flowEntry struct {
	src, dst netip.Addr
	sport    uint16
	pre      [2]icrc.Prefix // IPv4: flags DF, 0; IPv6: pre[0]
	next     uint16         // identification after the last one found
	zeros    bool           // the last two packets had identification 0
}

// flow returns the cache entry of a flow, making it if needed (w.mu held).
func (w *Writer) flow(src, dst netip.Addr, sport uint16) *flowEntry {
	for i := range w.flows {
		e := &w.flows[i]
		if e.sport == sport && e.src == src && e.dst == dst && e.src.IsValid() {
			return e
		}
	}
	e := &w.flows[w.nextFlow%len(w.flows)]
	w.nextFlow++
	*e = flowEntry{src: src, dst: dst, sport: sport, zeros: true}
	if src.Is4() {
		h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), SrcPort: sport, DstPort: udp.Port}
		for k, fl := range [2]uint16{dfFlag, 0} {
			h.FlagsFrag = fl
			e.pre[k] = icrc.NewIPv4Prefix(&h)
		}
	} else {
		e.pre[0] = icrc.NewIPv6Prefix(&icrc.IPv6Pseudo{Src: src.As16(), Dst: dst.As16(), SrcPort: sport, DstPort: udp.Port})
	}
	return e
}

// ports returns the candidate UDP source ports of a packet: the one given
// (after Send, the port really used), then 4791 (links that send from
// their bound port).
func ports(sport uint16) []uint16 {
	if sport == udp.Port {
		return []uint16{sport}
	}
	return []uint16{sport, udp.Port}
}

// wire is a packet's UDP payload as it went on the wire: buf, or for a
// zero-copy packet (mid not nil) buf[:at], mid, buf[at:].
type wire struct {
	buf, mid []byte
	at       int
}

func wireOf(p *udp.Packet) wire {
	if p.Payload == nil {
		return wire{buf: p.Buf}
	}
	return wire{buf: p.Buf, mid: p.Payload, at: p.PayloadAt()}
}

// compute returns the ICRC of q with the prefix pre and identification
// id; a non-nil out receives q's bytes in the same pass.
func (q *wire) compute(pre *icrc.Prefix, id uint16, out []byte) uint32 {
	switch {
	case q.mid == nil && out == nil:
		return pre.Compute(id, q.buf)
	case q.mid == nil:
		return pre.ComputeCopy(id, out, q.buf)
	case out == nil:
		return pre.ComputeSplit(id, q.buf, q.at, q.mid)
	}
	return pre.ComputeSplitCopy(id, out, q.buf, q.at, q.mid)
}

// ident4 finds the source port, identification and flags for which the
// stored ICRC of an IPv4 packet is valid (w.mu held), and copies the
// packet to out, as long as the packet (with its first ICRC computation,
// in the same pass). It tries the likely identifications first — 0 (a
// socket link's unconnected sends), the flow's last one plus 1 (the
// segments of a UDP GSO datagram) — with the flow's cached prefix, one
// pass over the packet each, and solves for the identification only when
// neither fits. Without a fit it returns the given port, identification
// 0, DF and false.
func (w *Writer) ident4(src, dst netip.Addr, sport uint16, q *wire, out []byte) (port, id, flags uint16, ok bool) {
	stored := icrc.Load(q.buf)
	copied := false
	for _, p := range ports(sport) {
		e := w.flow(src, dst, p)
		// The candidates in scalars, not in small arrays: storing an
		// array's halves and loading it whole defeated the CPU's store
		// forwarding (the largest of ident4's own costs in a profile).
		c0, c1 := e.next, uint16(0)
		if e.zeros {
			c0, c1 = 0, e.next
		}
		for k := range 2 {
			fl := uint16(dfFlag)
			if k == 1 {
				fl = 0
			}
			for j := range 2 {
				c := c0
				if j == 1 {
					c = c1
				}
				var got uint32
				if !copied {
					got, copied = q.compute(&e.pre[k], c, out), true
				} else {
					got = q.compute(&e.pre[k], c, nil)
				}
				if got == stored {
					e.zeros = c == 0 && e.next == 1
					e.next = c + 1
					return p, c, fl, true
				}
			}
		}
		// The packet is in out by now: solved from there if it is not
		// in one piece.
		payload := q.buf
		if q.mid != nil {
			payload = out
		}
		h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), SrcPort: p, DstPort: udp.Port}
		for _, fl := range [2]uint16{dfFlag, 0} {
			h.FlagsFrag = fl
			if sid, good := icrc.SolveIPv4ID(&h, payload); good {
				e.zeros, e.next = false, sid+1
				return p, sid, fl, true
			}
		}
	}
	return sport, 0, dfFlag, false
}

// port6 finds the source port for which the stored ICRC of an IPv6 packet
// is valid (w.mu held); without one, the given port and false. It copies
// the packet to out as ident4 does.
func (w *Writer) port6(src, dst netip.Addr, sport uint16, q *wire, out []byte) (uint16, bool) {
	stored := icrc.Load(q.buf)
	copied := false
	for _, p := range ports(sport) {
		pre := &w.flow(src, dst, p).pre[0]
		var got uint32
		if !copied {
			got, copied = q.compute(pre, 0, out), true
		} else {
			got = q.compute(pre, 0, nil)
		}
		if got == stored {
			return p, true
		}
	}
	return sport, false
}

// reserve appends a pcap record header of time ts for the first keep bytes
// of an n-byte frame to the buffer and returns the keep bytes after it,
// for the caller to fill (w.mu held).
func (w *Writer) reserve(ts stamp, keep, n int) []byte {
	need := 16 + keep
	if len(w.cur)+need > cap(w.cur) {
		w.handOff(false)
	}
	at := len(w.cur)
	w.cur = w.cur[:at+need]
	rh := w.cur[at : at+16]
	binary.LittleEndian.PutUint32(rh[0:], ts.sec)
	binary.LittleEndian.PutUint32(rh[4:], ts.usec)
	binary.LittleEndian.PutUint32(rh[8:], uint32(keep))
	binary.LittleEndian.PutUint32(rh[12:], uint32(n))
	w.packets++
	if !w.armed {
		w.armed = true
		w.flushT.Reset(FlushInterval)
	}
	return w.cur[at+16 : at+need]
}

// mac returns a locally administered MAC address derived from an IP.
func mac(b []byte, a netip.Addr) {
	_ = b[5]
	b[0], b[1] = 0x02, 0x00
	if a.Is4() {
		binary.BigEndian.PutUint32(b[2:], binary.BigEndian.Uint32(a.AsSlice()))
		return
	}
	s := a.As16()
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

// header4 writes the Ethernet, IPv4 and UDP headers of a frame carrying
// payLen bytes of RoCEv2 packet and returns the frame's length.
func header4(f []byte, src, dst netip.Addr, sport uint16, tos uint8, id, flags uint16, payLen int) int {
	putEth(f, src, dst, etherIPv4)
	ip := f[ethSize : ethSize+ipv4Size]
	putUDP(f[ethSize+ipv4Size:ethSize+ipv4Size+udpSize], sport, payLen)
	ip[0] = 0x45
	ip[1] = tos
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipv4Size+udpSize+payLen))
	binary.BigEndian.PutUint16(ip[4:6], id)
	binary.BigEndian.PutUint16(ip[6:8], flags)
	ip[8] = ttl
	ip[9] = 17
	binary.BigEndian.PutUint16(ip[10:12], 0)
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], IPChecksum(ip))
	return ethSize + ipv4Size + udpSize + payLen
}

// header6 writes the Ethernet, IPv6 and UDP headers of a frame carrying
// payLen bytes of RoCEv2 packet and returns the frame's length.
func header6(f []byte, src, dst netip.Addr, sport uint16, tos uint8, payLen int) int {
	putEth(f, src, dst, etherIPv6)
	ip := f[ethSize : ethSize+ipv6Size]
	putUDP(f[ethSize+ipv6Size:ethSize+ipv6Size+udpSize], sport, payLen)
	binary.BigEndian.PutUint32(ip[0:4], 6<<28|uint32(tos)<<20)
	binary.BigEndian.PutUint16(ip[4:6], uint16(udpSize+payLen))
	ip[6] = 17
	ip[7] = ttl
	s16, d16 := src.As16(), dst.As16()
	copy(ip[8:24], s16[:])
	copy(ip[24:40], d16[:])
	return ethSize + ipv6Size + udpSize + payLen
}

// IPChecksum is the IPv4 header checksum (RFC 1071) of h; over a header
// that holds its checksum, 0 when that is right.
func IPChecksum(h []byte) uint16 { return fold(ipSum(h)) }

// ipSum is the sum of the 16-bit words of h.
func ipSum(h []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	return s
}

// fold is the checksum of a word sum: its one's complement, carries folded.
func fold(s uint32) uint16 {
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

// Tap is a udp.Link that records the packets of the Link it wraps. It
// keeps the wrapped link's capabilities (udp.Wrap: GSO, receiving in place,
// polling, zero-copy send: a packet sent with its payload in registered
// memory is recorded whole), so transport takes the same paths with a capture as without,
// and it records what TryRecv returns as well as what Recv does.
type Tap struct {
	udp.Wrap
	w   *Writer
	dir Dir
	// sent and rcvd count the packets this tap recorded.
	sent, rcvd atomic.Uint64
}

var (
	_ udp.Link           = (*Tap)(nil)
	_ udp.CapabilityLink = (*Tap)(nil)
	_ udp.PollLink       = (*Tap)(nil)
)

// Unwrap returns the wrapped link (transport looks through it for a shared
// socket link's QPN leases: udp.SharedLink).
func (t *Tap) Unwrap() udp.Link { return t.Link }

// New wraps link so that packets in the directions dir are written to w.
// Two taps of a pair of links in one process should record only Sent, so
// that each packet on the wire appears once (as on a loopback capture).
func New(link udp.Link, w *Writer, dir Dir) *Tap {
	return &Tap{Wrap: udp.Wrap{Link: link, PassPayload: true}, w: w, dir: dir}
}

// Recorded returns how many sent and received packets this tap recorded.
func (t *Tap) Recorded() (sent, rcvd uint64) { return t.sent.Load(), t.rcvd.Load() }

// Send sends pkts through the wrapped link and then records them (with the
// ICRC the link filled in).
func (t *Tap) Send(pkts []udp.Packet) error {
	err := t.Link.Send(pkts)
	if t.dir&Sent != 0 && err == nil {
		// After an error, packets before the failing one may have gone
		// out; nothing we are not sure about is recorded.
		t.sent.Add(uint64(t.w.writeBatch(t.Link.LocalAddr(), true, pkts)))
	}
	return err
}

// Recv receives through the wrapped link and records what arrived.
func (t *Tap) Recv(pkts []udp.Packet) (int, error) {
	n, err := t.Link.Recv(pkts)
	t.received(pkts[:n])
	return n, err
}

// TryRecv polls the wrapped link (udp.PollLink) and records what arrived.
func (t *Tap) TryRecv(pkts []udp.Packet) (int, error) {
	n, err := t.Wrap.TryRecv(pkts)
	t.received(pkts[:n])
	return n, err
}

// received records received packets. An empty poll (TryRecv while busy
// polling, thousands a second) costs nothing: no lock, no clock, no atomic
// add.
func (t *Tap) received(pkts []udp.Packet) {
	if t.dir&Received != 0 && len(pkts) > 0 {
		t.rcvd.Add(uint64(t.w.writeBatch(t.Link.LocalAddr(), false, pkts)))
	}
}
