//go:build amd64 && !purego

package icrc

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

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
