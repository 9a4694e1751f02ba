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
	bt := tg.Batched()
	var pins Pins
	for name, fn := range map[string]func(){
		"BatchTarget.Write": func() {
			bt.Write(&pins, 0, p)
			bt.Write(&pins, 0, p)
			pins.Release()
		},
		"BatchTarget.Write(nil)": func() { bt.Write(nil, 0, p) },
		"ScatterList.Scatter": func() {
			sl := pd.ScatterList(sges)
			sl.Scatter(&pins, 0, p[:1000])
			sl.Scatter(&pins, 1000, p[:1000])
			sl.Scatter(&pins, 2000, p[:2000]) // crosses into the second element
			pins.Release()
			sl.Scatter(&pins, 100, p[:100])
			pins.Release()
		},
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

// BenchmarkPlace4KVsCopy interleaves batches of 64 plain 4 KiB copies with
// batches of 64 placements of the same bytes, so that both see the same
// machine noise, and reports the placement throughput as a percentage of
// the plain copy's: over all batches (place/copy-%), and best batch
// against best batch (best-place/copy-%, the least disturbed; the number
// to quote on a shared machine).
//
// Fairness: one registered buffer is split into two equal halves with the
// same alignment; the copies walk one half and the placements the other at
// the same offsets, 4 KiB apart, from the same source slice, and the order
// of the two batches alternates every iteration. Two sizes:
//   - L2: 2 x 256 KiB, both halves stay in the L2 cache. A plain 4 KiB copy
//     takes ~40 ns here, so every nanosecond of per-call work is ~2.5%.
//   - DRAM: 2 x 64 MiB (twice the L3 of the machines we run on), walked
//     continuously, so every 4 KiB lands on lines that are not cached: the
//     case of a large RDMA WRITE into application memory.
//
// WriteRemote does the full lookup and check per call (what the responder
// did per packet before BatchTarget); Target.Write is the per-packet path
// of a multi-packet WRITE checked once with Lookup; Target.WriteV places a
// batch of 64 packets under one pin; BatchTarget.Write is exactly what the
// transport's responder does per received RDMA WRITE packet: one
// BatchTarget.Write per packet into the receive batch's Pins, and the
// Pins' Release at the end of the batch (timed with the batch). Scatter is
// what the responder did per SEND packet (one-element receive list),
// ScatterList what it does now (the same with the batch's Pins).
func BenchmarkPlace4KVsCopy(b *testing.B) {
	const batch = 64
	for _, size := range []struct {
		name string
		half int
	}{{"L2", 256 << 10}, {"DRAM", 64 << 20}} {
		half := uint64(size.half)
		pd, mr, buf := benchSetup(b, 2*size.half)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1 // fault every page in before timing
		}
		key, iova := mr.RKey(), mr.IOVA()
		src := make([]byte, 4096)
		for i := range src {
			src[i] = byte(i)
		}
		tg, err := pd.Lookup(key, iova, uint32(half), AccessRemoteWrite)
		if err != nil {
			b.Fatal(err)
		}
		vec := make([][]byte, batch)
		for i := range vec {
			vec[i] = src
		}
		bt := tg.Batched()
		var pins Pins
		sges := []SGE{{iova, uint32(half), mr.LKey()}}
		for _, name := range []string{"control", "WriteRemote", "Target.Write", "Target.WriteV", "BatchTarget.Write", "Scatter", "ScatterList"} {
			b.Run(size.name+"/"+name, func(b *testing.B) {
				var tCopy, tPlace time.Duration
				bestCopy, bestPlace := time.Hour, time.Hour
				var cur uint64 // offset of this iteration's batch in either half
				copyBatch := func() time.Duration {
					t0 := time.Now()
					for i := range uint64(batch) {
						off := half + cur + i*4096
						copy(buf[off:off+4096], src)
					}
					return time.Since(t0)
				}
				placeBatch := func() time.Duration {
					t0 := time.Now()
					var err error
					switch name {
					case "control": // a plain copy into the placement half: the bench's own bias
						for i := range uint64(batch) {
							off := cur + i*4096
							copy(buf[off:off+4096], src)
						}
					case "WriteRemote":
						for i := range uint64(batch) {
							err = pd.WriteRemote(key, iova+cur+i*4096, src)
						}
					case "Target.Write":
						for i := range uint64(batch) {
							err = tg.Write(cur+i*4096, src)
						}
					case "Scatter": // a SEND's packets into a one-SGE receive buffer
						for i := range uint64(batch) {
							if e := pd.Scatter(sges, cur+i*4096, src); e != nil {
								err = e
							}
						}
					case "ScatterList": // the same through the responder's ScatterList and receive batch Pins
						sl := pd.ScatterList(sges)
						for i := range uint64(batch) {
							if e := sl.Scatter(&pins, cur+i*4096, src); e != nil {
								err = e
							}
						}
						pins.Release()
					case "Target.WriteV": // one pin per batch of 64 packets
						err = tg.WriteV(cur, vec)
					default: // BatchTarget.Write: one pin per receive batch, released with it
						for i := range uint64(batch) {
							if e := bt.Write(&pins, cur+i*4096, src); e != nil {
								err = e
							}
						}
						pins.Release()
					}
					d := time.Since(t0)
					if err != nil {
						b.Fatal(err)
					}
					return d
				}
				b.SetBytes(2 * 4096 * batch)
				odd := false
				for b.Loop() {
					var cp, pl time.Duration
					if odd {
						pl = placeBatch()
						cp = copyBatch()
					} else {
						cp = copyBatch()
						pl = placeBatch()
					}
					odd = !odd
					tCopy += cp
					tPlace += pl
					bestCopy, bestPlace = min(bestCopy, cp), min(bestPlace, pl)
					cur = (cur + batch*4096) % half
				}
				b.ReportMetric(float64(tCopy.Nanoseconds())/float64(b.N*batch), "copy-ns/4KiB")
				b.ReportMetric(float64(tPlace.Nanoseconds())/float64(b.N*batch), "place-ns/4KiB")
				b.ReportMetric(100*float64(tCopy)/float64(tPlace), "place/copy-%")
				b.ReportMetric(100*float64(bestCopy)/float64(bestPlace), "best-place/copy-%")
			})
		}
	}
}

// BenchmarkRegister64KiB registers and deregisters one 64 KiB buffer
// (resident already: it is reused) with the default access, whose
// registration faults the pages in (a madvise on Linux), and with
// AccessOnDemand, which does not.
func BenchmarkRegister64KiB(b *testing.B) {
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	for _, tc := range []struct {
		name string
		acc  Access
	}{{"populate", AccessLocalWrite | AccessRemoteWrite}, {"on-demand", AccessLocalWrite | AccessRemoteWrite | AccessOnDemand}} {
		b.Run(tc.name, func(b *testing.B) {
			pd := mustPD(b, NewTable(Limits{}))
			for range b.N {
				mr, err := pd.RegisterMR(buf, tc.acc)
				if err != nil {
					b.Fatal(err)
				}
				mr.Deregister()
			}
		})
	}
}
