package icrc

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// randPseudo4 returns random IPv4 pseudo-header fields and a UDP payload of n
// bytes (BTH .. ICRC) whose ICRC is valid for them.
func randPseudo4(r *rand.Rand, n int) (*IPv4Pseudo, []byte) {
	h := &IPv4Pseudo{ID: uint16(r.Uint32()), FlagsFrag: 0x4000, SrcPort: uint16(r.Uint32()), DstPort: 4791}
	fill(r, h.Src[:])
	fill(r, h.Dst[:])
	p := make([]byte, n)
	fill(r, p)
	Store(p, ComputeIPv4(h, p))
	return h, p
}

// TestSolveIPv4IDRecovers: for many random packets (sizes spanning the cached
// and uncached lengths) and identifications, SolveIPv4ID recovers the ID.
func TestSolveIPv4IDRecovers(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	sizes := []int{16, 17, 20, 64, 1024 + 16, 4096 + 16, invCacheLen - 28 + 4 - 1, invCacheLen - 28 + 4, 20000}
	for trial := range 3000 {
		n := 16 + r.IntN(2000)
		if trial < len(sizes) {
			n = sizes[trial]
		}
		h, p := randPseudo4(r, n)
		want := h.ID
		h.ID = ^want // must be ignored
		id, ok := SolveIPv4ID(h, p)
		if !ok || id != want {
			t.Fatalf("trial %d (%d bytes): SolveIPv4ID = %#04x, %v; want %#04x", trial, n, id, ok, want)
		}
	}
}

// TestSolveIPv4IDBruteForce: on a few packets, exactly one of the 65536
// identifications makes the ICRC valid, and it is the one SolveIPv4ID returns.
func TestSolveIPv4IDBruteForce(t *testing.T) {
	if testing.Short() {
		t.Skip("brute force over 65536 IDs")
	}
	r := rand.New(rand.NewPCG(23, 24))
	for _, n := range []int{16, 40} {
		h, p := randPseudo4(r, n)
		want := h.ID
		stored := Load(p)
		matches := 0
		for id := range 1 << 16 {
			h.ID = uint16(id)
			if ComputeIPv4(h, p) == stored {
				matches++
				if uint16(id) != want {
					t.Errorf("%d bytes: ID %#04x also matches (want %#04x)", n, id, want)
				}
			}
		}
		if matches != 1 {
			t.Errorf("%d bytes: %d IDs match, want 1", n, matches)
		}
		if id, ok := SolveIPv4ID(h, p); !ok || id != want {
			t.Errorf("%d bytes: SolveIPv4ID = %#04x, %v; want %#04x", n, id, ok, want)
		}
	}
}

// gaussSolve is an independent reference: it builds the 16 columns as the
// ICRC change caused by each ID bit (16 full CRCs), and solves the 32x16
// system over GF(2) by elimination.
func gaussSolve(h *IPv4Pseudo, p []byte) (uint16, bool) {
	h0 := *h
	h0.ID = 0
	c0 := ComputeIPv4(&h0, p)
	var basis [32]uint32
	var combo [32]uint16
	for j := range 16 {
		h0.ID = 1 << j
		v, m := ComputeIPv4(&h0, p)^c0, uint16(1)<<j
		for v != 0 {
			b := 31 - bits.LeadingZeros32(v)
			if basis[b] == 0 {
				basis[b], combo[b] = v, m
				break
			}
			v ^= basis[b]
			m ^= combo[b]
		}
	}
	d := c0 ^ Load(p)
	var id uint16
	for d != 0 {
		b := 31 - bits.LeadingZeros32(d)
		if basis[b] == 0 {
			return 0, false
		}
		d ^= basis[b]
		id ^= combo[b]
	}
	return id, true
}

// TestSolveIPv4IDCorruption: a corrupted byte is accepted (some ID makes the
// ICRC valid) with probability about 2^-16 per packet; over 2000 trials we
// expect 0.03 acceptances, and P(>= 3) is below 1e-5, so the bound is 2. Each
// result is also checked against the Gaussian-elimination reference.
func TestSolveIPv4IDCorruption(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	accepted := 0
	const trials = 2000
	for trial := range trials {
		h, p := randPseudo4(r, 16+r.IntN(1500))
		// Any byte, including BTH and ICRC, except BTH byte 4, which is masked.
		i := r.IntN(len(p) - 1)
		if i >= bthMaskOff {
			i++
		}
		p[i] ^= byte(1 + r.IntN(255))
		id, ok := SolveIPv4ID(h, p)
		gid, gok := gaussSolve(h, p)
		if ok != gok || (ok && id != gid) {
			t.Fatalf("trial %d: SolveIPv4ID = %#04x, %v; Gaussian reference %#04x, %v", trial, id, ok, gid, gok)
		}
		if ok {
			accepted++
		}
	}
	t.Logf("%d of %d corrupted packets accepted", accepted, trials)
	if accepted > 2 {
		t.Fatalf("%d of %d corrupted packets accepted; expected ~%.2f", accepted, trials, trials/65536.0)
	}
}

// TestSolveIPv4IDMatchesGauss compares SolveIPv4ID with the reference on valid
// packets and on random stored values (mostly unsolvable).
func TestSolveIPv4IDMatchesGauss(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	solvable := 0
	for trial := range 3000 {
		h, p := randPseudo4(r, 16+r.IntN(300))
		if trial%2 == 1 {
			Store(p, r.Uint32())
		}
		id, ok := SolveIPv4ID(h, p)
		gid, gok := gaussSolve(h, p)
		if ok != gok || (ok && id != gid) {
			t.Fatalf("trial %d: SolveIPv4ID = %#04x, %v; reference %#04x, %v", trial, id, ok, gid, gok)
		}
		if ok {
			solvable++
		}
	}
	if solvable < 1500 || solvable > 1502 {
		t.Fatalf("%d of 3000 solvable; want the 1500 valid ones (+ ~0.02 random)", solvable)
	}
}

// TestIDInverse checks the GF(2) helpers: x * x^-1 = 1, cached and uncached
// inverses agree, and x^(8n-16) * its inverse = 1.
func TestIDInverse(t *testing.T) {
	if multModP(x2n[0], xInv2n[0]) != xPow0 {
		t.Fatal("x * x^-1 != 1")
	}
	for _, n := range []int{40, 41, 100, 4136, invCacheLen - 1, invCacheLen, 70000} {
		inv := idInverse(n)
		if inv2 := idInverse(n); inv2 != inv {
			t.Fatalf("n=%d: cached %#08x, first %#08x", n, inv2, inv)
		}
		if inv != xPow(&xInv2n, 8*uint64(n)-16) {
			t.Fatalf("n=%d: cache disagrees", n)
		}
		if multModP(inv, xPow(&x2n, 8*uint64(n)-16)) != xPow0 {
			t.Fatalf("n=%d: not an inverse", n)
		}
	}
	// x^8 applied to a register equals one zero-byte step A.
	r := uint32(0x12345678)
	a := crc32IEEEStep(r)
	if m := multModP(xPow(&x2n, 8), r); m != a {
		t.Fatalf("x^8 * r = %#08x, A(r) = %#08x", m, a)
	}
	if invA(a) != r {
		t.Fatalf("invA(A(r)) = %#08x, want %#08x", invA(a), r)
	}
}

func crc32IEEEStep(r uint32) uint32 { return sliceTable[0][r&0xff] ^ r>>8 }

// TestCRCHelpers checks softUpdate and update against hash/crc32, the residue constant and
// undoTrailer.
func TestCRCHelpers(t *testing.T) {
	if residue != 0x2144df1c {
		t.Fatalf("residue %#08x, want 0x2144df1c", residue)
	}
	r := rand.New(rand.NewPCG(29, 30))
	for n := range 300 {
		b := make([]byte, n+4)
		fill(r, b)
		start := r.Uint32()
		want := crc32.Update(start, crc32.IEEETable, b[:n])
		if got := softUpdate(start, b[:n]); got != want {
			t.Fatalf("n=%d: softUpdate %#08x, crc32 %#08x", n, got, want)
		}
		if got := update(start, b[:n]); got != want {
			t.Fatalf("n=%d: update %#08x, crc32 %#08x", n, got, want)
		}
		if got := undoTrailer(crc32.Update(start, crc32.IEEETable, b), b[n:]); got != want {
			t.Fatalf("n=%d: undoTrailer %#08x, want %#08x", n, got, want)
		}
		binary.LittleEndian.PutUint32(b[n:], want)
		if got := crc32.Update(start, crc32.IEEETable, b); got != residue {
			t.Fatalf("n=%d: CRC with trailer %#08x, want residue", n, got)
		}
	}
}

// TestMulModP checks the windowed multiplication against the bit-serial
// one on edge values and random operands.
func TestMulModP(t *testing.T) {
	edge := []uint32{0, 1, xPow0, 0xffffffff, 0x80000001, poly, 0x7fffffff}
	for _, a := range edge {
		for _, b := range edge {
			if got, want := mulModP(a, b), multModP(a, b); got != want {
				t.Fatalf("mulModP(%#x, %#x) = %#x, want %#x", a, b, got, want)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		a, b := r.Uint32(), r.Uint32()
		if got, want := mulModP(a, b), multModP(a, b); got != want {
			t.Fatalf("mulModP(%#x, %#x) = %#x, want %#x", a, b, got, want)
		}
	}
}

// TestSolveIPv4IDFrom: whatever the guess — the packet's identification,
// 0 or any other — SolveIPv4IDFrom finds the identification SolveIPv4ID
// finds, and a corrupted packet is refused as SolveIPv4ID refuses it.
func TestSolveIPv4IDFrom(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for trial := range 2000 {
		h, p := randPseudo4(r, 16+r.IntN(5000))
		want := h.ID
		pf := NewIPv4Prefix(h)
		for _, guess := range []uint16{want, 0, uint16(r.Uint32()), want ^ 1} {
			if id, ok := pf.SolveIPv4IDFrom(guess, p); !ok || id != want {
				t.Fatalf("trial %d (%d bytes), guess %#04x: SolveIPv4IDFrom = %#04x, %v; want %#04x", trial, len(p), guess, id, ok, want)
			}
		}
		q := slices.Clone(p)
		q[12+r.IntN(len(q)-16)] ^= 1 << r.IntN(8) // a payload bit
		id0, ok0 := pf.SolveIPv4ID(q)
		if id, ok := pf.SolveIPv4IDFrom(want, q); ok != ok0 || (ok && id != id0) {
			t.Fatalf("trial %d: corrupted packet: SolveIPv4IDFrom = %#04x, %v; SolveIPv4ID = %#04x, %v", trial, id, ok, id0, ok0)
		}
	}
	pf6 := NewIPv6Prefix(&IPv6Pseudo{})
	if _, ok := pf6.SolveIPv4IDFrom(0, make([]byte, 64)); ok {
		t.Error("IPv6 prefix: SolveIPv4IDFrom reported ok")
	}
}
