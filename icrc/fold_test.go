package icrc

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"
)

// xPowMod returns x^n mod P in normal (non-reflected) bit order.
func xPowMod(n int) uint32 {
	r := uint32(1)
	for range n {
		top := r & 0x80000000
		r <<= 1
		if top != 0 {
			r ^= 0x04c11db7
		}
	}
	return r
}

// TestFoldConstants recomputes the fold constants hard-coded in
// fold_amd64.s: K_lo = rev32(x^(D+32) mod P) << 1, K_hi = rev32(x^(D-32) mod
// P) << 1. The D = 512 and D = 128 pairs are also hash/crc32's own.
func TestFoldConstants(t *testing.T) {
	for _, c := range []struct {
		d      int
		lo, hi uint64
	}{
		{2048, 0x11542778a, 0x1322d1430},
		{512, 0x154442bd4, 0x1c6e41596},
		{128, 0x1751997d0, 0x0ccaa009e},
	} {
		lo := uint64(bits.Reverse32(xPowMod(c.d+32))) << 1
		hi := uint64(bits.Reverse32(xPowMod(c.d-32))) << 1
		if lo != c.lo || hi != c.hi {
			t.Errorf("D=%d: computed %#x %#x, fold_amd64.s has %#x %#x", c.d, lo, hi, c.lo, c.hi)
		}
	}
}

// TestUpdateMatchesCRC32: update (the folding kernel where the CPU has it)
// equals crc32.Update for every length 0..2100, longer random lengths, random
// start values and every alignment of the data within 64 bytes.
func TestUpdateMatchesCRC32(t *testing.T) {
	if !hasFold {
		t.Logf("no AVX-512 VPCLMULQDQ on this CPU: update runs hash/crc32; comparing that")
	}
	r := rand.New(rand.NewPCG(7, 9))
	buf := make([]byte, 20000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	check := func(off, n int, start uint32) {
		p := buf[off : off+n]
		if got, want := update(start, p), crc32.Update(start, crc32.IEEETable, p); got != want {
			t.Fatalf("off %d len %d start %#x: update %#08x, crc32 %#08x", off, n, start, got, want)
		}
	}
	for n := 0; n <= 2100; n++ {
		check(n%64, n, r.Uint32())
	}
	for range 3000 {
		check(r.IntN(64), r.IntN(len(buf)-64), r.Uint32())
	}
	for _, n := range []int{256, 272, 320, 511, 512, 4096, 4140, 4156, 9000, 19000} {
		for off := range 64 {
			check(off, n, 0)
			check(off, n, ^uint32(0))
		}
	}
}

// TestFoldKernelSingleBit: flipping any one bit of a 1 KiB input changes the
// kernel's result exactly as it changes crc32's.
func TestFoldKernelSingleBit(t *testing.T) {
	p := make([]byte, 1024)
	for i := range len(p) * 8 {
		p[i/8] ^= 1 << (i % 8)
		if got, want := update(0, p), crc32.ChecksumIEEE(p); got != want {
			t.Fatalf("bit %d: update %#08x, crc32 %#08x", i, got, want)
		}
		p[i/8] ^= 1 << (i % 8)
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 300))
	f.Add(uint32(0xffffffff), make([]byte, 4156))
	f.Fuzz(func(t *testing.T, start uint32, p []byte) {
		want := crc32.Update(start, crc32.IEEETable, p)
		if got := update(start, p); got != want {
			t.Fatalf("len %d start %#x: update %#08x, crc32 %#08x", len(p), start, got, want)
		}
		dst := make([]byte, len(p)+1)
		dst[len(p)] = 0x5a
		if got := updateCopy(start, dst, p); got != want {
			t.Fatalf("len %d start %#x: updateCopy %#08x, crc32 %#08x", len(p), start, got, want)
		}
		if !bytes.Equal(dst[:len(p)], p) || dst[len(p)] != 0x5a {
			t.Fatalf("len %d: updateCopy copied wrong bytes or wrote past the end", len(p))
		}
	})
}

// BenchmarkUpdate runs the package's CRC (update: the folding kernel where
// the CPU has one) and, in the same run, crc32.Update over the same bytes;
// x_crc32 is our throughput as a multiple of hash/crc32's.
func BenchmarkUpdate(b *testing.B) {
	for _, n := range []int{64, 256, 1024, 4096, 4140, 65536} {
		p := make([]byte, n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				sink += update(0, p)
			}
			ours := time.Since(start)
			b.StopTimer()
			start = time.Now()
			for range b.N {
				sink += crc32.Update(0, crc32.IEEETable, p)
			}
			if ours > 0 {
				b.ReportMetric(float64(time.Since(start))/float64(ours), "x_crc32")
			}
		})
	}
}
