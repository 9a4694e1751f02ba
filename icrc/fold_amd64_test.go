//go:build amd64 && !purego

package icrc

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestFoldKernelDirect calls foldAVX512 itself (not through update) for
// every length 256..4096 in steps of 16, at every start offset within 64
// bytes, with random CRC registers: the 16 bytes it returns must have, from
// a zero register, the CRC crc32 computes over p from that register.
func TestFoldKernelDirect(t *testing.T) {
	if !hasFold {
		t.Skip("no AVX-512 VPCLMULQDQ on this CPU: foldAVX512 cannot run")
	}
	r := rand.New(rand.NewPCG(3, 5))
	buf := make([]byte, 4096+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 256; n <= 4096; n += 16 {
		for off := 0; off < 64; off += 7 {
			p := buf[off : off+n]
			start := r.Uint32()
			var x [16]byte
			foldAVX512(^start, p, &x)
			if got, want := softUpdate(^uint32(0), x[:]), crc32.Update(start, crc32.IEEETable, p); got != want {
				t.Fatalf("len %d off %d start %#08x: kernel gives CRC %#08x, crc32 %#08x", n, off, start, got, want)
			}
		}
	}
}

// TestUpdateFallback forces the paths of CPUs without AVX-512 VPCLMULQDQ
// (clmulSmall, hash/crc32 and the software CRC) and without PCLMULQDQ as
// well on this machine, and checks each against crc32 around every
// threshold (smallMin, hwMin, foldMin) and beyond.
func TestUpdateFallback(t *testing.T) {
	savedFold, savedSmall := hasFold, hasSmall
	defer func() { hasFold, hasSmall = savedFold, savedSmall }()
	for _, cfg := range []struct {
		name        string
		fold, small bool
	}{
		{"no-avx512", false, savedSmall},
		{"no-clmul", false, false},
		{"fold-without-small", savedFold, false},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			hasFold, hasSmall = cfg.fold, cfg.small
			defer func() { hasFold, hasSmall = savedFold, savedSmall }()
			testUpdateFallback(t, savedFold, savedSmall)
		})
	}
}

// testUpdateFallback checks the paths hasFold and hasSmall select, and
// Compute on them against the fast path's (fastFold, fastSmall).
func testUpdateFallback(t *testing.T, fastFold, fastSmall bool) {
	r := rand.New(rand.NewPCG(11, 13))
	buf := make([]byte, 9000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 0; n <= 600; n++ {
		off := r.IntN(64)
		p := buf[off : off+n]
		start := r.Uint32()
		if got, want := update(start, p), crc32.Update(start, crc32.IEEETable, p); got != want {
			t.Fatalf("fallback len %d off %d start %#08x: %#08x, crc32 %#08x", n, off, start, got, want)
		}
		if got, want := softOrUpdate(start, p), crc32.Update(start, crc32.IEEETable, p); got != want {
			t.Fatalf("softOrUpdate len %d off %d start %#08x: %#08x, crc32 %#08x", n, off, start, got, want)
		}
	}
	for _, n := range []int{4096, 4140, 4156, 8900} {
		p := buf[:n]
		if got, want := update(0, p), crc32.Update(0, crc32.IEEETable, p); got != want {
			t.Fatalf("fallback len %d: %#08x, crc32 %#08x", n, got, want)
		}
	}
	// Verify and Compute on the fallback path agree with the fast path.
	ip := make([]byte, 20+8+12+4096+4)
	ip[0], ip[9] = 0x45, 17
	ip[2], ip[3] = byte(len(ip)>>8), byte(len(ip))
	ip[22], ip[23] = 0x12, 0xb7
	ip[24], ip[25] = byte((len(ip)-20)>>8), byte(len(ip)-20)
	copy(ip[28:], buf)
	ip[28] = 0x04 // RC SEND_ONLY
	ip[28+1] = 0
	c, err := Compute(ip)
	if err != nil {
		t.Fatal(err)
	}
	hasFold, hasSmall = fastFold, fastSmall
	c2, err := Compute(ip)
	if err != nil || c2 != c {
		t.Fatalf("Compute: fallback %#08x, fast path %#08x (%v)", c, c2, err)
	}
}

// TestCopyVariantsFallback is TestCopyVariants on the path CPUs without the
// folding kernel take.
func TestCopyVariantsFallback(t *testing.T) {
	savedFold, savedSmall := hasFold, hasSmall
	defer func() { hasFold, hasSmall = savedFold, savedSmall }()
	hasFold = false
	t.Run("clmul", testCopyVariants)
	hasSmall = false
	t.Run("no-clmul", testCopyVariants)
}

// TestClmulSmall checks the one-lane kernel against hash/crc32 for every
// length from 16 to 300, every start register shape (zero, all ones,
// random) and every alignment of p within a buffer; the bytes around p are
// poison that must not count.
func TestClmulSmall(t *testing.T) {
	if !hasSmall {
		t.Skip("no PCLMULQDQ/SSE4.1 on this CPU: clmulSmall never runs")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 300+64)
	for n := 16; n <= 300; n++ {
		for off := range 16 {
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			p := buf[off : off+n]
			for _, crc := range []uint32{0, 0xffffffff, rng.Uint32(), 0x000000ff, 0xff000000} {
				want := crc32.Update(crc, crc32.IEEETable, p)
				if got := ^clmulSmall(^crc, p); got != want {
					t.Fatalf("len %d off %d crc %#x: %#x, want %#x", n, off, crc, got, want)
				}
			}
		}
	}
}

func FuzzClmulSmall(f *testing.F) {
	if !hasSmall {
		f.Skip("no PCLMULQDQ/SSE4.1 on this CPU: clmulSmall never runs")
	}
	f.Add(uint32(0), make([]byte, 16))
	f.Add(uint32(0xdeadbeef), []byte("a seventeen byte."))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		if len(p) < 16 {
			return
		}
		if got, want := ^clmulSmall(^crc, p), crc32.Update(crc, crc32.IEEETable, p); got != want {
			t.Fatalf("len %d crc %#x: %#x, want %#x", len(p), crc, got, want)
		}
	})
}
