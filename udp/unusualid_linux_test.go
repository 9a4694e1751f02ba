package udp

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/gorocev2/rocev2/icrc"
)

// noDFPkt returns a RoCEv2 UDP payload of n bytes from src whose ICRC is
// valid for an IPv4 header with identification id and flags ff.
func noDFPkt(r *rand.Rand, n int, src, dst netip.Addr, id, ff uint16) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), ID: id, FlagsFrag: ff, SrcPort: 50000, DstPort: Port}
	icrc.Store(p, icrc.ComputeIPv4(&h, p))
	return p
}

// TestNoDFSolveLearned: the single-bit flips that pass the ICRC solve only
// without DF (soak24: payload byte 173 bit 3, in every datagram of 174
// bytes or more, placed in memory with a success completion) are dropped
// from a sender that sets DF, as rxe, RNICs and Linux sockets do; a source
// that really sends without DF is learned after idLearn datagrams.
func TestNoDFSolveLearned(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 24))
	src, dst := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	l := &SocketLink{}
	l.addr = dst
	verify := func(p []byte, from netip.Addr) bool {
		_, ok := l.verifyFlow(&l.rxFlow, nil, p, from, 50000, 0)
		return ok
	}
	noDF, withDF := 0, 0
	for range 20 {
		p := noDFPkt(r, 200+r.IntN(1000), src, dst, uint16(r.Uint32()), 0x4000)
		if !verify(p, src) {
			t.Fatal("a datagram sent with DF was dropped")
		}
		for bit := 0; bit < 8*(len(p)-4); bit++ {
			if bit/8 == 4 {
				continue // BTH byte 4 (FECN, BECN, resv6a) is masked out of the ICRC
			}
			p[bit/8] ^= 1 << (bit % 8)
			hDF := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), FlagsFrag: 0x4000, SrcPort: 50000, DstPort: Port}
			h := hDF
			h.FlagsFrag = 0
			_, okDF := icrc.SolveIPv4ID(&hDF, p)
			_, ok := icrc.SolveIPv4ID(&h, p)
			switch {
			case okDF:
				withDF++ // the residual the doc states: still taken
			case ok:
				noDF++
				if verify(p, src) {
					t.Errorf("a %d-byte datagram with bit %d flipped, valid only without DF, was accepted", len(p), bit)
				}
			}
			p[bit/8] ^= 1 << (bit % 8)
		}
	}
	t.Logf("single-bit flips that solve: %d only without DF (dropped), %d with DF (taken, as documented)", noDF, withDF)
	if noDF == 0 {
		t.Fatal("no flip solving only without DF found: the test checks nothing")
	}
	if got := l.Stats().DropNoDF; got != uint64(noDF) {
		t.Errorf("DropNoDF %d, want %d", got, noDF)
	}
	// A source that sends without DF: dropped until learned, and a
	// datagram with DF in between starts the count again.
	other := netip.MustParseAddr("198.51.100.3")
	send := func(ff uint16) bool { return verify(noDFPkt(r, 300, other, dst, uint16(r.Uint32()), ff), other) }
	for i := range idLearn - 1 {
		if send(0) {
			t.Fatalf("datagram %d without DF accepted before the source was learned", i)
		}
	}
	if !send(0x4000) {
		t.Fatal("a datagram with DF dropped")
	}
	for i := range idLearn - 1 {
		if send(0) {
			t.Fatalf("datagram %d without DF after one with DF accepted before the source was learned", i)
		}
	}
	for i := range 5 {
		if !send(0) {
			t.Fatalf("datagram %d without DF of a learned source dropped", i)
		}
	}
}
