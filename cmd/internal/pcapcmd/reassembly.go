package pcapcmd

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/rocelayer"
)

// Bounds of IPv4 reassembly: the bytes held and the datagrams in
// progress (the oldest is given up beyond them).
const (
	maxFragBytes     = 4 << 20
	maxFragDatagrams = 256
)

// fragKey identifies a datagram: the IP version, source, destination,
// identification and (IPv4) protocol (RFC 791, RFC 8200 4.5); its last
// byte marks an IPv6 atomic fragment.
type fragKey [38]byte

// fragPart is one fragment's payload.
type fragPart struct {
	off  int
	data []byte
}

// fragEntry is a datagram being reassembled.
type fragEntry struct {
	v6 bool
	// header is the first fragment's IP header (IPv4) or unfragmentable
	// part (IPv6: the header and extension headers before the Fragment
	// header, the last next-header field already the Fragment header's);
	// nil until seen.
	header []byte
	parts  []fragPart
	total  int // the payload's length, once the last fragment is seen (else -1)
	held   int // bytes held
	frames []int
	roce   bool   // the first fragment carries a UDP header to port 4791
	broken string // why it cannot be reassembled
}

// version is "IPv4" or "IPv6".
func (e *fragEntry) version() string {
	if e.v6 {
		return "IPv6"
	}
	return "IPv4"
}

// reassembly holds the IP fragments of one file, in order of arrival.
type reassembly struct {
	entries map[fragKey]*fragEntry
	order   []fragKey
	held    int
	// lost are the RoCEv2 datagrams given up (memory bound) or left
	// incomplete, reported by the caller.
	lost []*fragEntry
}

func newReassembly() *reassembly {
	return &reassembly{entries: map[fragKey]*fragEntry{}}
}

// keyOf returns the datagram key of IPv4 packet b.
func keyOf(b []byte) fragKey {
	var k fragKey
	k[0] = 4
	copy(k[1:5], b[12:16])
	copy(k[5:9], b[16:20])
	copy(k[9:11], b[4:6])
	k[11] = b[9]
	return k
}

// keyOf6 returns the datagram key of IPv6 packet b whose Fragment header
// is at b[fh:].
func keyOf6(b []byte, fh int) fragKey {
	var k fragKey
	k[0] = 6
	copy(k[1:33], b[8:40])
	copy(k[33:37], b[fh+4:fh+8])
	return k
}

// fragIn is one fragment as the walk read it.
type fragIn struct {
	key    fragKey
	v6     bool
	off    int    // the fragment's offset in the payload
	mf     bool   // more fragments follow
	data   []byte // its payload (nil if the capture cut it)
	header []byte // the header to rebuild the datagram with (first fragment only)
	roce   bool   // a first fragment holding a UDP header to port 4791
	room   int    // the largest payload the datagram's length field can give
}

// fragment adds the IPv4 fragment pkt (header length hl) to its datagram
// and, when that is whole, walks the reassembled packet.
func (w *walker) fragment(pkt []byte, hl int, f found) found {
	if f.csumBad != "" || f.csumZero {
		return w.otherIP(f) // a fragment with a bad header is not used
	}
	off := int(binary.BigEndian.Uint16(pkt[6:])&0x1fff) * 8
	in := fragIn{key: keyOf(pkt), off: off, mf: pkt[6]&0x20 != 0, room: 65535 - hl}
	if tl := int(binary.BigEndian.Uint16(pkt[2:])); len(pkt) >= tl {
		in.data = pkt[hl:tl]
	}
	if off == 0 {
		in.header = pkt[:hl]
		if dst, ok := udpDst(pkt, hl); ok && pkt[9] == protoUDP && dst == rocelayer.Port {
			in.roce = true
		}
	}
	return w.addFragment(in)
}

// fragment6 adds the IPv6 fragment pkt, whose Fragment header is at
// pkt[fh:] and whose last next-header field before it is at pkt[prevNH],
// to its datagram and, when that is whole, walks the reassembled packet
// (as Linux rebuilds it: the Fragment header removed, the payload length
// that of the whole datagram).
func (w *walker) fragment6(pkt []byte, fh, prevNH int) found {
	fo := binary.BigEndian.Uint16(pkt[fh+2:])
	in := fragIn{key: keyOf6(pkt, fh), v6: true, off: int(fo & 0xfff8), mf: fo&1 != 0, room: 65535 - (fh - 40)}
	if in.off == 0 && !in.mf {
		// An atomic fragment is a whole packet, handled on its own
		// (RFC 6946; Linux's ipv6_frag_rcv): not joined with fragments
		// that share its identification.
		in.key[len(in.key)-1] = 1
	}
	if len(pkt) >= 40+int(binary.BigEndian.Uint16(pkt[4:])) {
		in.data = pkt[fh+8:]
	}
	if in.off == 0 {
		h := append([]byte(nil), pkt[:fh]...)
		h[prevNH] = pkt[fh]
		in.header = h
		if dst, ok := udpDst(pkt, fh+8); ok && pkt[fh] == protoUDP && dst == rocelayer.Port {
			in.roce = true
		}
	}
	return w.addFragment(in)
}

// addFragment adds a fragment to its datagram and, when that is whole,
// walks the reassembled packet.
func (w *walker) addFragment(in fragIn) found {
	r := w.frags
	k := in.key
	e := r.entries[k]
	if e == nil {
		e = &fragEntry{total: -1, v6: in.v6}
		r.entries[k] = e
		r.order = append(r.order, k)
	}
	e.frames = append(e.frames, w.num)
	if in.header != nil {
		e.header = append([]byte(nil), in.header...)
		e.roce = e.roce || in.roce
	}
	switch {
	case in.data == nil:
		e.broken = "a fragment cut by the capture"
	case in.off+len(in.data) > in.room:
		e.broken = "fragments beyond 64 KiB"
	case !in.mf:
		e.total = in.off + len(in.data)
	}
	if e.broken == "" && in.data != nil {
		switch e.overlap(in.off, in.off+len(in.data)) {
		case overlapDup:
			in.data = nil // wholly inside what is held: dropped alone
		case overlapPartial:
			e.broken = "overlapping fragments"
		}
	}
	if e.broken == "" && in.data != nil {
		d := append([]byte(nil), in.data...)
		e.parts = append(e.parts, fragPart{in.off, d})
		e.held += len(d)
		r.held += len(d)
	}
	r.bound(k)
	out := found{kind: kindFragment, roceFrag: e.roce, why: e.version()}
	if whole := e.reassembled(); whole != nil {
		r.remove(k)
		if e.v6 {
			out = w.ipv6(whole)
		} else {
			out = w.ipv4(whole)
		}
		out.frag = fmt.Sprintf("reassembled from %d %s fragments, frames %s", len(e.parts), e.version(), frameList(e.frames))
	}
	return out
}

// Whether a fragment overlaps the fragments held (overlap).
const (
	overlapNone    = iota
	overlapDup     // wholly inside bytes held: Linux drops the fragment (IPFRAG_DUP)
	overlapPartial // overlaps otherwise: Linux drops the datagram (IPFRAG_OVERLAP; RFC 5722)
)

// overlap tells how the fragment of bytes [off, end) of the payload
// overlaps the fragments held, as Linux's inet_frag_queue_insert judges
// it: a fragment wholly inside a run of contiguous bytes held is a
// duplicate; any other overlap discards the datagram.
func (e *fragEntry) overlap(off, end int) int {
	hit := false
	type span struct{ a, b int }
	var in []span
	for _, p := range e.parts {
		a, b := max(off, p.off), min(end, p.off+len(p.data))
		if a < b {
			hit = true
			in = append(in, span{a, b})
		}
	}
	if !hit {
		return overlapNone
	}
	slices.SortFunc(in, func(x, y span) int { return x.a - y.a })
	at := off
	for _, s := range in {
		if s.a > at {
			break
		}
		at = max(at, s.b)
	}
	if at >= end { // covered by contiguous bytes held
		return overlapDup
	}
	return overlapPartial
}

// bound gives up the oldest datagrams (but the one of key keep) while
// more bytes or datagrams are held than the bounds allow.
func (r *reassembly) bound(keep fragKey) {
	for (r.held > maxFragBytes || len(r.order) > maxFragDatagrams) && len(r.order) > 1 {
		k := r.order[0]
		if k == keep {
			k = r.order[1]
		}
		if e := r.entries[k]; e.roce {
			e.broken = fmt.Sprintf("reassembly bound (%d datagrams, %d bytes) reached", maxFragDatagrams, maxFragBytes)
			r.lost = append(r.lost, e)
		}
		r.remove(k)
	}
}

// remove forgets datagram k.
func (r *reassembly) remove(k fragKey) {
	r.held -= r.entries[k].held
	delete(r.entries, k)
	if i := slices.Index(r.order, k); i >= 0 {
		r.order = slices.Delete(r.order, i, i+1)
	}
}

// finish returns the RoCEv2 datagrams given up or left incomplete.
func (r *reassembly) finish() []*fragEntry {
	for _, k := range r.order {
		if e := r.entries[k]; e.roce {
			if e.broken == "" {
				e.broken = "fragments missing"
			}
			r.lost = append(r.lost, e)
		}
	}
	return r.lost
}

// reassembled returns the whole IP packet once every byte of the
// datagram is held: for IPv4 the first fragment's header with the total
// length, no MF bit, offset 0 and its checksum recomputed, for IPv6 the
// unfragmentable part with the payload length (as Linux rebuilds them).
// nil while incomplete.
func (e *fragEntry) reassembled() []byte {
	if e.header == nil || e.total < 0 || e.broken != "" {
		return nil
	}
	slices.SortFunc(e.parts, func(a, b fragPart) int { return a.off - b.off })
	hl := len(e.header)
	b := make([]byte, hl+e.total)
	copy(b, e.header)
	end := 0
	for _, p := range e.parts {
		if p.off > end || p.off+len(p.data) > e.total {
			return nil // a hole, or data beyond the last fragment
		}
		copy(b[hl+p.off:], p.data)
		end = max(end, p.off+len(p.data))
	}
	if end != e.total {
		return nil
	}
	if e.v6 {
		if len(b)-40 > 65535 {
			return nil // headers longer than the fragments said
		}
		binary.BigEndian.PutUint16(b[4:], uint16(len(b)-40))
		return b
	}
	if len(b) > 65535 {
		return nil
	}
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[6] &= 0xc0 // keep the reserved and DF bits; clear MF and the offset
	b[7] = 0
	b[10], b[11] = 0, 0
	binary.BigEndian.PutUint16(b[10:], pcaptap.IPChecksum(b[:hl]))
	return b
}

// frameList formats frame numbers as "3, 4" (at most 8).
func frameList(fs []int) string {
	s := ""
	for i, f := range fs {
		if i == 8 {
			return s + ", ..."
		}
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprint(f)
	}
	return s
}
