package icrc

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestCopyVariants checks ComputeIPv4Copy, ComputeIPv6Copy and
// SolveIPv4IDCopy against the plain functions for every length up to 1100
// and random longer ones, at random source and destination alignments: the
// same result, an exact copy, and nothing written past it. It runs the
// path this CPU and build take; TestCopyVariantsFallback (amd64) forces
// the path without the folding kernel.
func TestCopyVariants(t *testing.T) {
	if !hasFold {
		t.Log("no folding kernel in this build or on this CPU: the fallback path is checked")
	}
	testCopyVariants(t)
}

func testCopyVariants(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	src := make([]byte, 9100)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	dstBuf := make([]byte, 9200)
	lengths := make([]int, 0, 1200)
	for n := 0; n <= 1100; n++ {
		lengths = append(lengths, n)
	}
	for range 100 {
		lengths = append(lengths, 1100+r.IntN(8000))
	}
	for _, n := range lengths {
		so, do := r.IntN(64), r.IntN(64)
		p := src[so : so+n]
		h4 := &IPv4Pseudo{FlagsFrag: 0x4000, SrcPort: uint16(r.Uint32()), DstPort: 4791}
		fill(r, h4.Src[:])
		fill(r, h4.Dst[:])
		h6 := &IPv6Pseudo{SrcPort: uint16(r.Uint32()), DstPort: 4791}
		fill(r, h6.Src[:])
		fill(r, h6.Dst[:])
		if n >= bthSize+Size { // a payload whose ICRC is right for some ID
			h4.ID = uint16(r.Uint32())
			Store(p, ComputeIPv4(h4, p))
		}
		check := func(what string, got, want uint32, gotOK, wantOK bool) {
			t.Helper()
			dst := dstBuf[do : do+n+1]
			if got != want || gotOK != wantOK {
				t.Fatalf("%s len %d: %#x/%v, want %#x/%v", what, n, got, gotOK, want, wantOK)
			}
			if !bytes.Equal(dst[:n], p) {
				t.Fatalf("%s len %d (src+%d, dst+%d): copy differs", what, n, so, do)
			}
			if dst[n] != 0xa5 {
				t.Fatalf("%s len %d: wrote past the end", what, n)
			}
		}
		reset := func() []byte {
			clear(dstBuf)
			dstBuf[do+n] = 0xa5
			return dstBuf[do : do+n]
		}
		check("ComputeIPv4Copy", ComputeIPv4Copy(h4, reset(), p), ComputeIPv4(h4, p), true, true)
		check("ComputeIPv6Copy", ComputeIPv6Copy(h6, reset(), p), ComputeIPv6(h6, p), true, true)
		id, ok := SolveIPv4IDCopy(h4, reset(), p)
		wid, wok := SolveIPv4ID(h4, p)
		check("SolveIPv4IDCopy", uint32(id), uint32(wid), ok, wok)
		if n >= bthSize+Size && (!ok || id != h4.ID) {
			t.Fatalf("SolveIPv4IDCopy len %d: %d/%v, want ID %d", n, id, ok, h4.ID)
		}
	}
}

// TestCopyVariantsShortDst checks that a destination shorter than the
// payload panics before anything is written.
func TestCopyVariantsShortDst(t *testing.T) {
	p := make([]byte, 600)
	dst := make([]byte, 599, 1000) // short, with spare capacity that must not be written
	for name, f := range map[string]func(){
		"ComputeIPv4Copy": func() { ComputeIPv4Copy(&IPv4Pseudo{}, dst, p) },
		"ComputeIPv6Copy": func() { ComputeIPv6Copy(&IPv6Pseudo{}, dst, p) },
		"SolveIPv4IDCopy": func() { SolveIPv4IDCopy(&IPv4Pseudo{}, dst, p) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s with a short dst did not panic", name)
				}
			}()
			f()
		}()
	}
}

// BenchmarkSolveCopy4K compares SolveIPv4IDCopy with a copy followed by
// SolveIPv4ID (the GRO receive path before and after), same run.
func BenchmarkSolveCopy4K(b *testing.B) {
	h, p := pseudo4(benchPacket(4096, false))
	dst := make([]byte, len(p))
	b.Run("fused", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			if _, ok := SolveIPv4IDCopy(h, dst, p); !ok {
				b.Fatal("not solved")
			}
		}
	})
	b.Run("copy+solve", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			copy(dst, p)
			if _, ok := SolveIPv4ID(h, p); !ok {
				b.Fatal("not solved")
			}
		}
	})
}
