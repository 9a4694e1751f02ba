package udp

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/gorocev2/rocev2/icrc"
)

// This file holds what every Link implementation shares.

// SharedLink is implemented by links whose address other processes may
// share (SocketLink). When Shared reports true, a device must take its QPNs
// only from LeaseQPNs, tag its CM communication IDs with CommIDTag, and
// claim the service IDs it listens on: the kernel steers each datagram to
// the process that owns its destination QP, listener or communication ID.
// A Link that wraps another (a fault injector, a tap) must implement
// SharedLink by forwarding, or have an Unwrap() Link method (which
// transport looks through); else a device on it takes QPNs nobody steers
// to it.
type SharedLink interface {
	// Shared reports whether the link is a member of a shared group.
	Shared() bool
	// LeaseQPNs leases a range of QPNs [first, first+n) for this link.
	LeaseQPNs() (first, n uint32, err error)
	// CommIDTag returns the bits (tag, under mask) that mark a CM
	// communication ID or SIDR request ID as this link's.
	CommIDTag() (tag, mask uint32)
	// ClaimService makes CM REQs and SIDR_REQs for service ID sid come
	// to this link; it fails when another member listens on it.
	ClaimService(sid uint64) error
	// ReleaseService undoes ClaimService.
	ReleaseService(sid uint64)
	// VolunteerRejector offers this link to receive the REQs for
	// services nobody listens on (its CM answers each with a REJ).
	VolunteerRejector() error
}

// counters are a Link's Stats, updated atomically; links embed them.
type counters struct {
	sent, rcvd, badICRC, malformed, other atomic.Uint64
}

// stats returns a snapshot of c.
func (c *counters) stats() Stats {
	return Stats{
		SentPkts:      c.sent.Load(),
		RcvdPkts:      c.rcvd.Load(),
		DropBadICRC:   c.badICRC.Load(),
		DropMalformed: c.malformed.Load(),
		DropOther:     c.other.Load(),
	}
}

// checkSend validates the packets given to Send on a link whose normalised
// address is local: every length in [minPacketSize, MaxPacketSize] and
// every destination valid and of local's IP family.
//
// A packet with Payload set is refused (ErrPayload) unless zc, the link's
// zero-copy send (CapZeroCopy): then its length is Buf's and Payload's,
// and Buf must hold a BTH, the pad and the ICRC around the payload.
func checkSend(pkts []Packet, local netip.Addr, zc bool) error {
	for i := range pkts {
		p := &pkts[i]
		if n := p.Len(); n < minPacketSize || n > MaxPacketSize {
			return fmt.Errorf("udp: send packet %d: length %d not in [%d, %d]: %w",
				i, n, minPacketSize, MaxPacketSize, ErrPacketSize)
		}
		if p.Payload != nil {
			if !zc {
				return fmt.Errorf("udp: send packet %d: %d payload bytes outside Buf: %w", i, len(p.Payload), ErrPayload)
			}
			if len(p.Buf) < minPacketSize || p.PayloadAt() < 12 {
				return fmt.Errorf("udp: send packet %d: Buf of %d bytes holds no BTH, pad and ICRC around a payload: %w", i, len(p.Buf), ErrPayload)
			}
		}
		dst := normAddr(p.Addr)
		if !dst.IsValid() || dst.Is4() != local.Is4() {
			return fmt.Errorf("udp: send packet %d: destination %v from %v: %w", i, p.Addr, local, ErrAddress)
		}
	}
	return nil
}

// checkRecv validates the packets given to Recv that it may fill, the
// first limit: every Buf has room for MaxPacketSize bytes. (The others are
// left alone, so a caller may pass many buffers to a link that fills few
// per call without paying for a check of all of them on every call.)
func checkRecv(pkts []Packet, limit int) error {
	for i := range pkts[:min(len(pkts), limit)] {
		if cap(pkts[i].Buf) < MaxPacketSize {
			return fmt.Errorf("udp: recv packet %d: buffer cap %d: %w", i, cap(pkts[i].Buf), ErrShortBuffer)
		}
	}
	return nil
}

// computeICRC returns the ICRC of a UDP payload travelling src:srcPort ->
// dst:4791 in an IPv4 datagram with DF and identification id, or in an IPv6
// datagram (id unused). src and dst are normalised and of the same family.
func computeICRC(src, dst netip.Addr, srcPort, id uint16, payload []byte) uint32 {
	var f flowPrefix
	return f.get(src, dst, srcPort).Compute(id, payload)
}

// flowPrefix caches the icrc.Prefix of the flow a link direction served
// last: the packets of a batch nearly always belong to one flow, and the
// prefix turns the per-packet pseudo-header work into six table lookups.
// The zero value is empty. It is not safe for concurrent use (each link
// direction has its own, under that direction's mutex).
type flowPrefix struct {
	src, dst netip.Addr
	srcPort  uint16
	p        icrc.Prefix
}

// get returns the prefix of RoCEv2 packets src:srcPort -> dst:4791 (IPv4
// with DF, or IPv6); src and dst are normalised and of the same family.
func (f *flowPrefix) get(src, dst netip.Addr, srcPort uint16) *icrc.Prefix {
	if f.srcPort != srcPort || f.src != src || f.dst != dst || !src.IsValid() {
		f.src, f.dst, f.srcPort = src, dst, srcPort
		if src.Is4() {
			f.p = icrc.NewIPv4Prefix(&icrc.IPv4Pseudo{
				Src: src.As4(), Dst: dst.As4(), FlagsFrag: 0x4000, SrcPort: srcPort, DstPort: Port,
			})
		} else {
			f.p = icrc.NewIPv6Prefix(&icrc.IPv6Pseudo{Src: src.As16(), Dst: dst.As16(), SrcPort: srcPort, DstPort: Port})
		}
	}
	return &f.p
}
