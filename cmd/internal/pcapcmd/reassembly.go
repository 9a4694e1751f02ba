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

// fragKey identifies an IPv4 datagram: source, destination,
// identification and protocol (RFC 791).
type fragKey [11]byte

// fragPart is one fragment's payload.
type fragPart struct {
	off  int
	data []byte
}

// fragEntry is a datagram being reassembled.
type fragEntry struct {
	header []byte // the first fragment's IP header (nil until seen)
	parts  []fragPart
	total  int // the payload's length, once the last fragment is seen (else -1)
	held   int // bytes held
	frames []int
	roce   bool   // the first fragment carries a UDP header to port 4791
	broken string // why it cannot be reassembled
}

// reassembly holds the IPv4 fragments of one file, in order of arrival.
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
	copy(k[:4], b[12:16])
	copy(k[4:8], b[16:20])
	copy(k[8:10], b[4:6])
	k[10] = b[9]
	return k
}

// fragment adds the IPv4 fragment pkt (header length hl) to its datagram
// and, when that is whole, walks the reassembled packet.
func (w *walker) fragment(pkt []byte, hl int, f found) found {
	if f.csumBad != "" || f.csumZero {
		return w.otherIP(f) // a fragment with a bad header is not used
	}
	r := w.frags
	k := keyOf(pkt)
	e := r.entries[k]
	if e == nil {
		e = &fragEntry{total: -1}
		r.entries[k] = e
		r.order = append(r.order, k)
	}
	e.frames = append(e.frames, w.num)
	off := int(binary.BigEndian.Uint16(pkt[6:])&0x1fff) * 8
	mf := pkt[6]&0x20 != 0
	tl := int(binary.BigEndian.Uint16(pkt[2:]))
	if off == 0 {
		e.header = append([]byte(nil), pkt[:hl]...)
		if dst, ok := udpDst(pkt, hl); ok && pkt[9] == protoUDP && dst == rocelayer.Port {
			e.roce = true
		}
	}
	switch {
	case len(pkt) < tl:
		e.broken = "a fragment cut by the capture"
	case off+tl-hl > 65535-hl:
		e.broken = "fragments beyond 64 KiB"
	case !mf:
		e.total = off + tl - hl
	}
	if e.broken == "" {
		d := append([]byte(nil), pkt[hl:tl]...)
		e.parts = append(e.parts, fragPart{off, d})
		e.held += len(d)
		r.held += len(d)
	}
	r.bound(k)
	out := found{kind: kindFragment, roceFrag: e.roce}
	if whole := e.reassembled(); whole != nil {
		r.remove(k)
		out = w.ipv4(whole)
		out.frag = fmt.Sprintf("reassembled from %d IPv4 fragments, frames %s", len(e.parts), frameList(e.frames))
	}
	return out
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

// reassembled returns the whole IPv4 packet once every byte of the
// datagram is held: the first fragment's header with the total length,
// no MF bit, offset 0 and its checksum recomputed (as Linux rebuilds
// it). nil while incomplete.
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
