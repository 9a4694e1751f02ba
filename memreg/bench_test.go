package memreg

import (
	"testing"
	"time"
)

func benchSetup(b testing.TB, size int) (*PD, *MR, []byte) {
	tb := NewTable(Limits{})
	pd := mustPD(b, tb)
	// Some other registrations so the table is not trivially small.
	for i := range 100 {
		mustMR(b, pd, alignedBuf(64), uint64(i+1)<<32, AccessLocalWrite)
	}
	buf := alignedBuf(size)
	return pd, mustMR(b, pd, buf, 0x10000, allRights), buf
}

// TestZeroAlloc: the hot paths allocate nothing.
func TestZeroAlloc(t *testing.T) {
	pd, mr, _ := benchSetup(t, 1<<16)
	key, va := mr.RKey(), mr.IOVA()
	p := make([]byte, 4096)
	sges := []SGE{{va, 2048, key}, {va + 8192, 2048, key}}
	tg, _ := pd.Lookup(key, va, 4096, AccessRemoteWrite)
	v := pd.ForQP(qpA)
	for name, fn := range map[string]func(){
		"CheckRemote":   func() { pd.CheckRemote(key, va, 4096, AccessRemoteWrite) },
		"ForQP.Check":   func() { v.CheckRemote(key, va, 4096, AccessRemoteWrite) },
		"WriteRemote":   func() { pd.WriteRemote(key, va, p) },
		"ReadRemote":    func() { pd.ReadRemote(key, va, p) },
		"Lookup":        func() { pd.Lookup(key, va, 4096, AccessRemoteWrite) },
		"Target.Write":  func() { tg.Write(0, p) },
		"Target.WriteV": func() { tg.WriteV(0, [][]byte{p[:100], p[100:]}) },
		"FetchAdd":      func() { pd.FetchAdd(key, va, 1) },
		"CompareSwap":   func() { pd.CompareSwap(key, va, 1, 2) },
		"CheckSGEs":     func() { pd.CheckSGEs(sges, AccessLocalWrite) },
		"Scatter":       func() { pd.Scatter(sges, 0, p) },
		"Gather":        func() { pd.Gather(sges, 0, p) },
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s allocates %.1f times per call", name, n)
		}
	}
}

// BenchmarkLookupCheck: key lookup + full access check, no data moved.
func BenchmarkLookupCheck(b *testing.B) {
	pd, mr, _ := benchSetup(b, 1<<16)
	key, va := mr.RKey(), mr.IOVA()+100
	b.ReportAllocs()
	for b.Loop() {
		if err := pd.CheckRemote(key, va, 4096, AccessRemoteWrite); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookupCheckParallel: the same from every P at once (lock-free read path).
func BenchmarkLookupCheckParallel(b *testing.B) {
	pd, mr, _ := benchSetup(b, 1<<16)
	key, va := mr.RKey(), mr.IOVA()+100
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := pd.CheckRemote(key, va, 4096, AccessRemoteWrite); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPlace4K compares placing 4 KiB through the table with a plain
// copy of the same bytes to the same place, in the same run:
// "hot" writes the same 4 KiB again and again (cache-resident: the
// check's cost is most visible); "stream" walks a 1 MiB region 4 KiB at a
// time, as the packets of a large RDMA WRITE do.
func BenchmarkPlace4K(b *testing.B) {
	const region = 1 << 20
	pd, mr, buf := benchSetup(b, region)
	key, iova := mr.RKey(), mr.IOVA()
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i)
	}
	tg, _ := pd.Lookup(key, iova, region, AccessRemoteWrite)
	sges := []SGE{{iova, region, mr.LKey()}}
	for _, mode := range []string{"hot", "stream"} {
		next := func(i uint64) uint64 {
			if mode == "hot" {
				return 8192
			}
			return (i * 4096) % region
		}
		b.Run(mode+"/copy", func(b *testing.B) {
			b.SetBytes(4096)
			var i uint64
			for b.Loop() {
				off := next(i)
				copy(buf[off:off+4096], src)
				i++
			}
		})
		b.Run(mode+"/WriteRemote", func(b *testing.B) {
			b.SetBytes(4096)
			b.ReportAllocs()
			var i uint64
			for b.Loop() {
				if err := pd.WriteRemote(key, iova+next(i), src); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		b.Run(mode+"/Target.Write", func(b *testing.B) {
			b.SetBytes(4096)
			b.ReportAllocs()
			var i uint64
			for b.Loop() {
				if err := tg.Write(next(i), src); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		b.Run(mode+"/Scatter", func(b *testing.B) {
			b.SetBytes(4096)
			b.ReportAllocs()
			var i uint64
			for b.Loop() {
				if err := pd.Scatter(sges, next(i), src); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkFetchAdd: one remote atomic, uncontended.
func BenchmarkFetchAdd(b *testing.B) {
	pd, mr, _ := benchSetup(b, 64)
	key, va := mr.RKey(), mr.IOVA()
	b.ReportAllocs()
	for b.Loop() {
		pd.FetchAdd(key, va, 1)
	}
}

// BenchmarkPlace4KVsCopy interleaves batches of plain 4 KiB copies with
// batches of placements of the same bytes to the same places (walking a
// 256 KiB region), so that both see the same machine noise, and reports
// the placement throughput as a percentage of the plain copy's: over all
// batches, and best batch against best batch (the least disturbed).
// WriteRemote does the full lookup and check per call; Target.Write is the
// per-packet path of a multi-packet WRITE checked once with Lookup;
// Target.WriteV places a batch of 64 packets under one pin.
func BenchmarkPlace4KVsCopy(b *testing.B) {
	const region, batch = 256 << 10, 64
	pd, mr, buf := benchSetup(b, region)
	key, iova := mr.RKey(), mr.IOVA()
	src := make([]byte, 4096)
	tg, err := pd.Lookup(key, iova, region, AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	vec := make([][]byte, batch)
	for i := range vec {
		vec[i] = src
	}
	for _, name := range []string{"WriteRemote", "Target.Write", "Target.WriteV"} {
		b.Run(name, func(b *testing.B) {
			var tCopy, tPlace time.Duration
			bestCopy, bestPlace := time.Hour, time.Hour
			b.SetBytes(2 * 4096 * batch)
			for b.Loop() {
				t0 := time.Now()
				for i := range batch {
					off := uint64(i*4096) % region
					copy(buf[off:off+4096], src)
				}
				t1 := time.Now()
				var err error
				switch name {
				case "WriteRemote":
					for i := range batch {
						err = pd.WriteRemote(key, iova+uint64(i*4096)%region, src)
					}
				case "Target.Write":
					for i := range batch {
						err = tg.Write(uint64(i*4096)%region, src)
					}
				default: // one pin per batch of 64 packets
					err = tg.WriteV(0, vec)
				}
				if err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				cp, pl := t1.Sub(t0), t2.Sub(t1)
				tCopy += cp
				tPlace += pl
				bestCopy, bestPlace = min(bestCopy, cp), min(bestPlace, pl)
			}
			b.ReportMetric(float64(tCopy.Nanoseconds())/float64(b.N*batch), "copy-ns/4KiB")
			b.ReportMetric(float64(tPlace.Nanoseconds())/float64(b.N*batch), "place-ns/4KiB")
			b.ReportMetric(100*float64(tCopy)/float64(tPlace), "place/copy-%")
			b.ReportMetric(100*float64(bestCopy)/float64(bestPlace), "best-place/copy-%")
		})
	}
}
