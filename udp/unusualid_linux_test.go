package udp

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/icrc"
)

// unusualPkt returns a RoCEv2 UDP payload of n bytes from src whose ICRC
// is valid for an IPv4 header with identification id and flags ff.
func unusualPkt(r *rand.Rand, n int, src, dst netip.Addr, id, ff uint16) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), ID: id, FlagsFrag: ff, SrcPort: 50000, DstPort: Port}
	icrc.Store(p, icrc.ComputeIPv4(&h, p))
	return p
}

// TestUnusualIPv4ID: the single-bit flips an identification solve cannot
// tell from a change of identification or DF (soak24: placed in memory
// with a success completion) are dropped for a sender that uses Linux's
// identifications (0 with DF, 0..n-1 through a GSO datagram); a sender
// that numbers its datagrams otherwise is learned after idLearn of them
// and accepted from then on.
func TestUnusualIPv4ID(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 24))
	src, dst := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	l := &SocketLink{}
	l.addr = dst
	verify := func(p []byte) bool {
		_, ok := l.verifyFlow(&l.rxFlow, nil, p, src, 50000, 0)
		return ok
	}
	blind, dropped, inWindow := 0, 0, 0
	for range 20 {
		p := unusualPkt(r, 200+r.IntN(1000), src, dst, 0, 0x4000)
		if !verify(p) {
			t.Fatal("a Linux sender's datagram (identification 0, DF) was dropped")
		}
		for bit := 0; bit < 8*(len(p)-4); bit++ {
			if bit/8 == 4 {
				continue // BTH byte 4 (FECN, BECN, resv6a) is masked out of the ICRC
			}
			p[bit/8] ^= 1 << (bit % 8)
			hDF := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), FlagsFrag: 0x4000, SrcPort: 50000, DstPort: Port}
			h := hDF
			h.FlagsFrag = 0
			id, okDF := icrc.SolveIPv4ID(&hDF, p)
			_, ok := icrc.SolveIPv4ID(&h, p)
			if okDF || ok {
				blind++
				if okDF && id < idWindow {
					inWindow++
				} else if verify(p) {
					t.Errorf("a %d-byte datagram with bit %d flipped was accepted", len(p), bit)
				} else {
					dropped++
				}
			}
			p[bit/8] ^= 1 << (bit % 8)
		}
	}
	t.Logf("%d single-bit flips solve for some identification; %d dropped now, %d solve inside the window", blind, dropped, inWindow)
	if dropped == 0 {
		t.Fatal("no blind single-bit flip found: the test checks nothing")
	}
	if inWindow != 0 {
		t.Errorf("%d blind flips still pass (their identification falls in the window)", inWindow)
	}
	if got := l.Stats().DropUnusualID; got != uint64(dropped) {
		t.Errorf("DropUnusualID %d, want %d", got, dropped)
	}
	// A sender that numbers its datagrams (rxe counts up): the first
	// anchors it, the next counting up (with gaps) are taken, a blind flip
	// of one is not; a jump of its counter is followed after idLearn
	// datagrams that count up from one another.
	rxe := netip.MustParseAddr("198.51.100.3")
	vr := func(id uint16, flip int) bool {
		p := unusualPkt(r, 300, rxe, dst, id, 0x4000)
		if flip >= 0 {
			p[flip/8] ^= 1 << (flip % 8)
		}
		_, ok := l.verifyFlow(&l.rxFlow, nil, p, rxe, 50000, 0)
		return ok
	}
	for i, id := range []uint16{0xfbd2, 0xfbd3, 0xfbd4, 0xfbd9, 0xfbd8, 0xfc40} {
		if !vr(id, -1) {
			t.Fatalf("datagram %d (identification %#x) of a counting sender dropped", i, id)
		}
	}
	blindRxe := 0
	for bit := 40; bit < 8*296; bit++ {
		p := unusualPkt(r, 300, rxe, dst, 0xfc41, 0x4000)
		p[bit/8] ^= 1 << (bit % 8)
		h := icrc.IPv4Pseudo{Src: rxe.As4(), Dst: dst.As4(), FlagsFrag: 0x4000, SrcPort: 50000, DstPort: Port}
		h0 := h
		h0.FlagsFrag = 0
		_, okDF := icrc.SolveIPv4ID(&h, p)
		if _, ok := icrc.SolveIPv4ID(&h0, p); !ok && !okDF {
			continue
		}
		blindRxe++
		if vr(0xfc41, bit) {
			t.Errorf("a counting sender's datagram with bit %d flipped was accepted", bit)
		}
	}
	if blindRxe == 0 {
		t.Fatal("no blind flip of the counting sender's datagram found: the test checks nothing")
	}
	if !vr(0xfc42, -1) { // the next good one: taken, and the streak of drops ends
		t.Fatal("the counting sender's next datagram dropped")
	}
	for i := range idLearn - 1 {
		if vr(0x1000+uint16(i), -1) {
			t.Fatalf("datagram %d after the counter jumped accepted before it was followed", i)
		}
	}
	if !vr(0x1000+idLearn-1, -1) || !vr(0x1000+idLearn, -1) {
		t.Fatal("the counter's new start was not followed")
	}
	// The counter advances while this link does not see it (idle jumps,
	// datagrams steered to other members of a shared address): 5 ms
	// later a jump of 3000 is taken; with no time passed one of 9000 is
	// not.
	clock := time.Now()
	l.ids.now = func() time.Time { return clock }
	if !vr(0x1000+idLearn+1, -1) {
		t.Fatal("next datagram dropped")
	}
	clock = clock.Add(5 * time.Millisecond)
	if !vr(0x1000+idLearn+1+3000, -1) {
		t.Fatal("a jump of 3000 after 5 ms was dropped")
	}
	if vr(0x1000+idLearn+1+3000+9000, -1) {
		t.Fatal("a jump of 9000 with no idle spell was taken")
	}
	l.ids.now = nil
	// A sender of random identifications is taken as before after idLearn.
	rnd := netip.MustParseAddr("198.51.100.4")
	vn := func(id uint16) bool {
		p := unusualPkt(r, 300, rnd, dst, id, 0x4000)
		_, ok := l.verifyFlow(&l.rxFlow, nil, p, rnd, 50000, 0)
		return ok
	}
	if !vn(0x4000) {
		t.Fatal("the first datagram of a new source was dropped")
	}
	for i, id := range []uint16{0x9000, 0x2000, 0xe000} {
		if vn(id) {
			t.Fatalf("random identification %d accepted before the source was learned", i)
		}
	}
	for i, id := range []uint16{0x7000, 0x1234, 0xabcd} {
		if !vn(id) {
			t.Fatalf("random identification %d of a learned source dropped", i)
		}
	}
}
