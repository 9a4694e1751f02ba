package icrc

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestPrefix checks a Prefix made once per flow against the per-call
// functions (ComputeIPv4, ComputeIPv6, SolveIPv4ID and their Copy
// variants, which make a new Prefix every call) for random flows, IDs and
// lengths from 0 through the 16-bit length fields' range. The independent
// checks of the Prefix arithmetic are TestPathsAgree (a reference over
// whole packets) and the golden tests.
func TestPrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	src := make([]byte, 9100)
	fill(r, src)
	dst := make([]byte, len(src))
	lengths := []int{0, 1, 15, 16, 17, 20, 64, 255, 256, 1024, 1028, 4096, 4140, 9000}
	for range 300 {
		lengths = append(lengths, r.IntN(9000))
	}
	for _, n := range lengths {
		p := src[:n]
		h4 := &IPv4Pseudo{ID: uint16(r.Uint32()), FlagsFrag: uint16(r.Uint32()), SrcPort: uint16(r.Uint32()), DstPort: uint16(r.Uint32())}
		fill(r, h4.Src[:])
		fill(r, h4.Dst[:])
		h6 := &IPv6Pseudo{SrcPort: uint16(r.Uint32()), DstPort: uint16(r.Uint32())}
		fill(r, h6.Src[:])
		fill(r, h6.Dst[:])
		if n >= Size {
			Store(p, ComputeIPv4(h4, p)) // so that the solve has an answer
		}
		p4, p6 := NewIPv4Prefix(h4), NewIPv6Prefix(h6)
		if got, want := p4.Compute(h4.ID, p), ComputeIPv4(h4, p); got != want {
			t.Fatalf("IPv4 len %d: Prefix.Compute %#x, ComputeIPv4 %#x", n, got, want)
		}
		if got, want := p6.Compute(0, p), ComputeIPv6(h6, p); got != want {
			t.Fatalf("IPv6 len %d: Prefix.Compute %#x, ComputeIPv6 %#x", n, got, want)
		}
		if got := p4.ComputeCopy(h4.ID, dst, p); got != ComputeIPv4(h4, p) || !bytes.Equal(dst[:n], p) {
			t.Fatalf("IPv4 len %d: ComputeCopy wrong", n)
		}
		if got := p6.ComputeCopy(0, dst, p); got != ComputeIPv6(h6, p) || !bytes.Equal(dst[:n], p) {
			t.Fatalf("IPv6 len %d: ComputeCopy wrong", n)
		}
		id, ok := p4.SolveIPv4ID(p)
		wid, wok := SolveIPv4ID(h4, p)
		if id != wid || ok != wok {
			t.Fatalf("len %d: Prefix.SolveIPv4ID %d/%v, SolveIPv4ID %d/%v", n, id, ok, wid, wok)
		}
		if n >= bthSize+Size && (!ok || id != h4.ID) {
			t.Fatalf("len %d: solved %d/%v, want %d", n, id, ok, h4.ID)
		}
		clear(dst[:n])
		if id, ok := p4.SolveIPv4IDCopy(dst, p); id != wid || ok != wok || !bytes.Equal(dst[:n], p) {
			t.Fatalf("len %d: SolveIPv4IDCopy %d/%v or its copy wrong", n, id, ok)
		}
		if _, ok := p6.SolveIPv4ID(p); ok {
			t.Fatalf("len %d: an IPv6 prefix solved an IPv4 identification", n)
		}
	}
}

// TestPrefixZeroPanics: the zero Prefix is not a prefix of any flow.
func TestPrefixZeroPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("zero Prefix computed an ICRC")
		}
	}()
	var p Prefix
	p.Compute(0, make([]byte, 64))
}

// BenchmarkPrefixCompute1K compares Prefix.Compute with ComputeIPv4 (same
// run) on a 1 KiB payload: the pseudo-header work a link saves per packet.
func BenchmarkPrefixCompute1K(b *testing.B) {
	h, p := pseudo4(benchPacket(1024, false))
	pre := NewIPv4Prefix(h)
	b.Run("prefix", func(b *testing.B) {
		for b.Loop() {
			sink = pre.Compute(h.ID, p)
		}
	})
	b.Run("ComputeIPv4", func(b *testing.B) {
		for b.Loop() {
			sink = ComputeIPv4(h, p)
		}
	})
}

// TestComputeSplit: ComputeSplit of (head, mid, tail) equals Compute of
// the concatenation, for random flows, split points and payload lengths
// (the fold kernel's lengths included), over IPv4 and IPv6.
func TestComputeSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	for i := range 2000 {
		hl := bthSize + r.IntN(40)
		ml := r.IntN(5000)
		if i%7 == 0 {
			ml = []int{0, 255, 256, 257, 1024, 4096}[i%6]
		}
		tl := r.IntN(4) + Size
		whole := make([]byte, hl+ml+tl)
		fill(r, whole)
		h4 := &IPv4Pseudo{SrcPort: uint16(r.Uint32()), DstPort: 4791, FlagsFrag: 0x4000}
		fill(r, h4.Src[:])
		fill(r, h4.Dst[:])
		h6 := &IPv6Pseudo{SrcPort: uint16(r.Uint32()), DstPort: 4791}
		fill(r, h6.Src[:])
		p4, p6 := NewIPv4Prefix(h4), NewIPv6Prefix(h6)
		buf := append(append([]byte{}, whole[:hl]...), whole[hl+ml:]...)
		mid := whole[hl : hl+ml]
		id := uint16(r.Uint32())
		if got, want := p4.ComputeSplit(id, buf, hl, mid), p4.Compute(id, whole); got != want {
			t.Fatalf("IPv4 head %d mid %d tail %d: ComputeSplit %#x, Compute %#x", hl, ml, tl, got, want)
		}
		if got, want := p6.ComputeSplit(0, buf, hl, mid), p6.Compute(0, whole); got != want {
			t.Fatalf("IPv6 head %d mid %d tail %d: ComputeSplit %#x, Compute %#x", hl, ml, tl, got, want)
		}
		// ComputeSplitCopy: the same ICRC, and the packet put together.
		dst := make([]byte, len(whole)+1)
		dst[len(whole)] = 0xa5
		if got, want := p4.ComputeSplitCopy(id, dst, buf, hl, mid), p4.Compute(id, whole); got != want {
			t.Fatalf("IPv4 head %d mid %d tail %d: ComputeSplitCopy %#x, Compute %#x", hl, ml, tl, got, want)
		}
		if !bytes.Equal(dst[:len(whole)], whole) || dst[len(whole)] != 0xa5 {
			t.Fatalf("head %d mid %d tail %d: ComputeSplitCopy copied %x, want %x and 0xa5 after it", hl, ml, tl, dst, whole)
		}
		clear(dst)
		if got, want := p6.ComputeSplitCopy(0, dst, buf, hl, mid), p6.Compute(0, whole); got != want || !bytes.Equal(dst[:len(whole)], whole) {
			t.Fatalf("IPv6 head %d mid %d tail %d: ComputeSplitCopy %#x, Compute %#x; copy equal: %v", hl, ml, tl, got, want, bytes.Equal(dst[:len(whole)], whole))
		}
	}
	for _, c := range []struct {
		name  string
		at    int
		dstSz int
	}{{"split inside the BTH", bthSize - 1, 16}, {"split inside the ICRC", 13, 16}, {"short destination", bthSize, 15}} {
		func() {
			dst := make([]byte, c.dstSz)
			defer func() {
				if recover() == nil {
					t.Errorf("ComputeSplitCopy, %s: no panic", c.name)
				}
				if !bytes.Equal(dst, make([]byte, c.dstSz)) {
					t.Errorf("ComputeSplitCopy, %s: wrote %x before it panicked", c.name, dst)
				}
			}()
			p := NewIPv6Prefix(&IPv6Pseudo{})
			p.ComputeSplitCopy(0, dst, make([]byte, 16), c.at, nil)
		}()
	}
	for _, at := range []int{bthSize - 1, 13} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("split at %d of a 16-byte packet did not panic", at)
				}
			}()
			p := NewIPv6Prefix(&IPv6Pseudo{})
			p.ComputeSplit(0, make([]byte, 16), at, nil)
		}()
	}
}

// FuzzComputeSplitChange: ComputeSplit (and ComputeSplitCopy, which also
// puts the packet together) equals Compute of the whole packet,
// and a payload changed after its ICRC was computed (a burst of up to 4
// bytes: CRC-32 detects every burst of 32 bits or less) never verifies —
// the property zero-copy send relies on: a region changed while a work
// request reads it yields a packet the receiver drops, not wrong data
// with a valid ICRC.
func FuzzComputeSplitChange(f *testing.F) {
	f.Add([]byte("0123456789abcdef"), []byte("payload bytes of a packet"), uint16(3), uint32(0x01), uint8(1), true)
	f.Add(make([]byte, 28), make([]byte, 4096), uint16(4000), uint32(0xffffffff), uint8(4), false)
	f.Fuzz(func(t *testing.T, head, mid []byte, off uint16, x uint32, burst uint8, v6 bool) {
		if len(head) < bthSize+Size || len(mid) == 0 {
			return
		}
		at := len(head) - Size
		var pf Prefix
		if v6 {
			pf = NewIPv6Prefix(&IPv6Pseudo{SrcPort: 0xc000, DstPort: 4791})
		} else {
			pf = NewIPv4Prefix(&IPv4Pseudo{Src: [4]byte{192, 0, 2, 1}, Dst: [4]byte{192, 0, 2, 2}, FlagsFrag: 0x4000, SrcPort: 0xc000, DstPort: 4791})
		}
		whole := append(append(append([]byte{}, head[:at]...), mid...), head[at:]...)
		c := pf.ComputeSplit(0, head, at, mid)
		if w := pf.Compute(0, whole); c != w {
			t.Fatalf("ComputeSplit %#x, Compute %#x", c, w)
		}
		// ComputeSplitCopy: the same ICRC, the packet put together.
		dst := make([]byte, len(whole))
		if cc := pf.ComputeSplitCopy(0, dst, head, at, mid); cc != c || !bytes.Equal(dst, whole) {
			t.Fatalf("ComputeSplitCopy %#x (ComputeSplit %#x), copy equal: %v", cc, c, bytes.Equal(dst, whole))
		}
		n := 1 + int(burst)%4
		o := int(off) % len(mid)
		if x&0xff == 0 {
			x |= 1 // the burst changes its first byte
		}
		changed := bytes.Clone(mid)
		for k := 0; k < n && o+k < len(changed); k++ {
			changed[o+k] ^= byte(x >> (8 * k))
		}
		if pf.ComputeSplit(0, head, at, changed) == c {
			t.Fatalf("a %d-byte change at %d of a %d-byte payload kept the ICRC", n, o, len(mid))
		}
	})
}
