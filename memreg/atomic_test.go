package memreg

import (
	"encoding/binary"
	"errors"
	"runtime"
	"sync"
	"testing"
)

// atomicRegions returns a region whose host memory is 8-byte aligned and
// one whose host memory is not (aligned IOVA: the striped-lock fallback).
func atomicRegions(t *testing.T, pd *PD) map[string]*MR {
	return map[string]*MR{
		"host-aligned":    mustMR(t, pd, alignedBuf(64), 0x1000, allRights),
		"host-misaligned": mustMR(t, pd, alignedBuf(72)[5:69], 0x2000, allRights),
	}
}

// TestFetchAddLinearizable: N goroutines x M fetch-and-adds give the exact
// sum, and the returned originals are exactly 0..N*M-1 (each once).
func TestFetchAddLinearizable(t *testing.T) {
	const N, M = 8, 2000
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	for name, mr := range atomicRegions(t, pd) {
		t.Run(name, func(t *testing.T) {
			va := mr.IOVA() + 8
			seen := make([][]uint64, N)
			var wg sync.WaitGroup
			for g := range N {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range M {
						orig, err := pd.FetchAdd(mr.RKey(), va, 1)
						if err != nil {
							t.Error(err)
							return
						}
						seen[g] = append(seen[g], orig)
					}
				}()
			}
			wg.Wait()
			var b [8]byte
			if err := pd.ReadRemote(mr.RKey(), va, b[:]); err != nil {
				t.Fatal(err)
			}
			if got := binary.NativeEndian.Uint64(b[:]); got != N*M {
				t.Fatalf("sum %d, want %d", got, N*M)
			}
			hit := make([]bool, N*M)
			for _, s := range seen {
				for _, v := range s {
					if v >= N*M || hit[v] {
						t.Fatalf("original %d returned twice or out of range", v)
					}
					hit[v] = true
				}
			}
		})
	}
}

// TestCompareSwapSpinLock: a CAS spin lock in registered memory protects a
// plain (non-atomic) counter placed with ReadRemote/WriteRemote.
func TestCompareSwapSpinLock(t *testing.T) {
	const N, M = 6, 500
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	for name, mr := range atomicRegions(t, pd) {
		t.Run(name, func(t *testing.T) {
			key, lock, counter := mr.RKey(), mr.IOVA(), mr.IOVA()+16
			var wg sync.WaitGroup
			for range N {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var b [8]byte
					for range M {
						for {
							orig, err := pd.CompareSwap(key, lock, 0, 1)
							if err != nil {
								t.Error(err)
								return
							}
							if orig == 0 {
								break
							}
							runtime.Gosched()
						}
						if err := pd.ReadRemote(key, counter, b[:]); err != nil {
							t.Error(err)
						}
						binary.NativeEndian.PutUint64(b[:], binary.NativeEndian.Uint64(b[:])+1)
						if err := pd.WriteRemote(key, counter, b[:]); err != nil {
							t.Error(err)
						}
						if orig, err := pd.CompareSwap(key, lock, 1, 0); err != nil || orig != 1 {
							t.Errorf("unlock: orig %d, %v", orig, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			var b [8]byte
			pd.ReadRemote(key, counter, b[:])
			if got := binary.NativeEndian.Uint64(b[:]); got != N*M {
				t.Fatalf("counter %d, want %d", got, N*M)
			}
		})
	}
}

// TestCompareSwapIncrement: CAS-increment loops mixed with fetch-and-adds.
func TestCompareSwapIncrement(t *testing.T) {
	const N, M = 4, 1000
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	for name, mr := range atomicRegions(t, pd) {
		t.Run(name, func(t *testing.T) {
			key, va := mr.RKey(), mr.IOVA()+24
			var wg sync.WaitGroup
			for g := range N {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range M {
						if g%2 == 0 {
							pd.FetchAdd(key, va, 1)
							continue
						}
						cur, _ := pd.CompareSwap(key, va, 0, 0) // read
						for {
							orig, err := pd.CompareSwap(key, va, cur, cur+1)
							if err != nil {
								t.Error(err)
								return
							}
							if orig == cur {
								break
							}
							cur = orig
						}
					}
				}()
			}
			wg.Wait()
			if v, _ := pd.FetchAdd(key, va, 0); v != N*M {
				t.Fatalf("value %d, want %d", v, N*M)
			}
		})
	}
}

// TestAtomicSemantics: host byte order, wrap-around, CAS miss, results.
func TestAtomicSemantics(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	for name, mr := range atomicRegions(t, pd) {
		t.Run(name, func(t *testing.T) {
			key, va := mr.RKey(), mr.IOVA()+32
			var b [8]byte
			binary.NativeEndian.PutUint64(b[:], 0x0102030405060708)
			pd.WriteRemote(key, va, b[:])
			if orig, err := pd.FetchAdd(key, va, 0x10); err != nil || orig != 0x0102030405060708 {
				t.Fatalf("fetch-add orig %#x, %v (memory must be host order)", orig, err)
			}
			if orig, _ := pd.CompareSwap(key, va, 1, 99); orig != 0x0102030405060718 {
				t.Fatalf("CAS miss orig %#x", orig)
			}
			if orig, _ := pd.CompareSwap(key, va, 0x0102030405060718, ^uint64(0)); orig != 0x0102030405060718 {
				t.Fatalf("CAS hit orig %#x", orig)
			}
			if orig, _ := pd.FetchAdd(key, va, 2); orig != ^uint64(0) {
				t.Fatalf("orig %#x", orig)
			}
			pd.ReadRemote(key, va, b[:])
			if v := binary.NativeEndian.Uint64(b[:]); v != 1 {
				t.Fatalf("fetch-add does not wrap modulo 2^64: %#x", v)
			}
			if _, err := pd.FetchAdd(key, va+4, 1); !errors.Is(err, ErrMisaligned) {
				t.Fatalf("misaligned: %v", err)
			}
		})
	}
}
