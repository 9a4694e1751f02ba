//go:build linux

package udp

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/gorocev2/rocev2/icrc"
)

// TestVerifyICRCFastMatches: VerifyICRC's in-line case gives what
// verifyICRC (the full path) gives — result, guess, every counter and
// the no-DF sources learned — for a random sequence of packets: valid
// ones of a few flows with right and wrong identification guesses,
// corrupted ones, short ones, and ones sent without DF (which, four in a
// row from a source, make the link learn it and leave the in-line case).
func TestVerifyICRCFastMatches(t *testing.T) {
	local := netip.MustParseAddr("192.0.2.2")
	srcs := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.3"),
		netip.MustParseAddr("::ffff:192.0.2.1")}
	mk := func() *SocketLink {
		l := &SocketLink{}
		l.addr = local
		return l
	}
	fast, slow := mk(), mk()
	r := rand.New(rand.NewPCG(31, 8))
	var id uint16
	for i := range 20000 {
		src := srcs[r.IntN(len(srcs))]
		if r.IntN(8) != 0 { // mostly one flow, as a connection's packets are
			src = srcs[0]
		}
		port := uint16(49152)
		if r.IntN(16) == 0 {
			port++
		}
		n := 12 + 4 + r.IntN(200)
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		b[0] = 0x04
		switch r.IntN(8) {
		case 0:
			id = uint16(r.Uint32()) // a guess that misses
		default:
			id++ // the next segment
		}
		s4 := normAddr(src)
		if r.IntN(12) == 0 { // without DF
			h := icrc.IPv4Pseudo{Src: s4.As4(), Dst: local.As4(), SrcPort: port, DstPort: Port}
			pf := icrc.NewIPv4Prefix(&h)
			icrc.Store(b, pf.Compute(id, b))
		} else {
			icrc.Store(b, computeICRC(s4, local, port, id, b))
		}
		switch r.IntN(40) {
		case 0:
			b[r.IntN(n)] ^= 1 << r.IntN(8) // corrupted
		case 1:
			b = b[:r.IntN(minPacketSize)] // short
		}
		pf, ps := &Packet{Buf: b, Addr: src, SrcPort: port}, &Packet{Buf: b, Addr: src, SrcPort: port}
		got, want := fast.VerifyICRC(pf), slow.verifyICRC(ps)
		if got != want || fast.dvNext != slow.dvNext || fast.dvMiss.Load() != slow.dvMiss.Load() ||
			fast.badICRC.Load() != slow.badICRC.Load() || fast.malformed.Load() != slow.malformed.Load() ||
			fast.rcvd.Load() != slow.rcvd.Load() || fast.ids.n.Load() != slow.ids.n.Load() ||
			fast.ids.dropped.Load() != slow.ids.dropped.Load() {
			t.Fatalf("packet %d (from %v:%d, %d bytes): VerifyICRC %v next %d miss %d bad %d, verifyICRC %v next %d miss %d bad %d",
				i, src, port, len(b), got, fast.dvNext, fast.dvMiss.Load(), fast.badICRC.Load(),
				want, slow.dvNext, slow.dvMiss.Load(), slow.badICRC.Load())
		}
	}
	if fast.ids.n.Load() == 0 || fast.dvMiss.Load() == 0 || fast.badICRC.Load() == 0 {
		t.Fatalf("the sequence did not reach every case: learned %d, misses %d, bad %d",
			fast.ids.n.Load(), fast.dvMiss.Load(), fast.badICRC.Load())
	}
}
