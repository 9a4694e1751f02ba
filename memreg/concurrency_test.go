package memreg

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestNoPlacementAfterDeregister: many goroutines place, read and run
// atomics through published keys (also through BatchTargets holding a pin
// across several placements) while a controller keeps replacing the
// regions (register new, publish, deregister old). After each Deregister
// returns the old memory is snapshotted; at the end no retired buffer may
// differ from its snapshot. Run with -race: the race detector also checks
// that every write to a retired buffer happened before its Deregister
// returned.
func TestNoPlacementAfterDeregister(t *testing.T) {
	const (
		slots   = 4
		writers = 8
		stripe  = 256
		size    = writers*stripe + 64 // writer stripes, then 8 atomic words
		rounds  = 400
	)
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	iova := func(s int) uint64 { return uint64(s+1) << 20 }

	var keys [slots]atomic.Uint32
	mrs := make([]*MR, slots)
	bufs := make([][]byte, slots)
	for s := range slots {
		bufs[s] = alignedBuf(size)
		mrs[s] = mustMR(t, pd, bufs[s], iova(s), allRights)
		keys[s].Store(mrs[s].RKey())
	}

	var stop atomic.Bool
	var okOps, staleOps atomic.Int64
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			data := bytes.Repeat([]byte{byte(g + 1)}, stripe)
			rd := make([]byte, stripe)
			var pins Pins
			for i := 0; !stop.Load(); i++ {
				s := r.IntN(slots)
				key := keys[s].Load()
				base := iova(s)
				off := uint64(r.IntN(stripe))
				n := r.IntN(stripe-int(off)) + 1
				var err error
				switch i % 6 {
				case 0:
					err = pd.WriteRemote(key, base+uint64(g*stripe)+off, data[:n])
				case 1:
					err = pd.ReadRemote(key, base+uint64(g*stripe)+off, rd[:n])
				case 2:
					_, err = pd.FetchAdd(key, base+writers*stripe+uint64(8*(g%8)), 1)
				case 3:
					_, err = pd.CompareSwap(key, base+writers*stripe+uint64(8*(g%8)), uint64(i), uint64(i+1))
				case 4:
					var tg Target
					tg, err = pd.Lookup(key, base+uint64(g*stripe), stripe, AccessRemoteWrite)
					if err == nil {
						runtime.Gosched() // let a deregistration slip in between check and placement
						err = tg.Write(off, data[:n])
					}
				case 5: // a receive batch: several packets under one held pin
					var tg Target
					tg, err = pd.Lookup(key, base+uint64(g*stripe), stripe, AccessRemoteWrite)
					if err == nil {
						bt := tg.Batched()
						for k := uint64(0); k < 4 && err == nil; k++ {
							err = bt.Write(&pins, (off+k*17)%uint64(stripe-n+1), data[:n])
							runtime.Gosched() // let a deregistration start while the pin is held
						}
						pins.Release()
					}
				}
				switch {
				case err == nil:
					okOps.Add(1)
				case errors.Is(err, ErrStaleKey):
					staleOps.Add(1)
				default:
					t.Errorf("writer %d: %v", g, err)
					return
				}
			}
		}()
	}

	type retired struct{ buf, snap []byte }
	var gone []retired
	deadline := time.Now().Add(3 * time.Second)
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		s := round % slots
		nb := alignedBuf(size)
		nm := mustMR(t, pd, nb, iova(s), allRights)
		keys[s].Store(nm.RKey())
		if round%3 == 0 {
			runtime.Gosched() // let writers pick up both keys
		}
		if err := mrs[s].Deregister(); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, retired{bufs[s], bytes.Clone(bufs[s])})
		mrs[s], bufs[s] = nm, nb
	}
	time.Sleep(20 * time.Millisecond) // writers keep hammering with stale keys
	stop.Store(true)
	wg.Wait()

	for i, r := range gone {
		if !bytes.Equal(r.buf, r.snap) {
			t.Fatalf("retired buffer %d changed after Deregister returned", i)
		}
	}
	changed := 0
	for _, r := range gone {
		if bytes.ContainsFunc(r.snap, func(c rune) bool { return c != 0 }) {
			changed++
		}
	}
	t.Logf("%d regions retired (%d had been written), %d accesses ok, %d stale", len(gone), changed, okOps.Load(), staleOps.Load())
	if okOps.Load() == 0 || staleOps.Load() == 0 || changed == 0 {
		t.Fatalf("the test did not exercise the race: ok=%d stale=%d written=%d", okOps.Load(), staleOps.Load(), changed)
	}
}

// TestNoPlacementAfterInvalidate: the same guarantee for memory windows:
// after Invalidate returns, nothing more lands through the window (half
// the writers place through BatchTargets holding a pin per batch).
func TestNoPlacementAfterInvalidate(t *testing.T) {
	const (
		writers = 4
		stripe  = 128
		size    = writers * stripe
	)
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(size)
	mr := mustMR(t, pd, buf, 0x10000, allRights) // its own key is never published
	w, _ := pd.AllocMW(MWType2)
	var key atomic.Uint32
	k, err := w.BindQP(qpA, mr, 0x10000, size, AccessRemoteWrite, 0)
	if err != nil {
		t.Fatal(err)
	}
	key.Store(k)
	var stop atomic.Bool
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	v := pd.ForQP(qpA)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := bytes.Repeat([]byte{byte(g + 1)}, stripe)
			var pins Pins
			for i := 0; !stop.Load(); i++ {
				data[0]++
				var err error
				if g%2 == 0 {
					err = v.WriteRemote(key.Load(), 0x10000+uint64(g*stripe), data)
				} else { // a receive batch of 4 placements under one held pin
					var tg Target
					tg, err = v.Lookup(key.Load(), 0x10000+uint64(g*stripe), stripe, AccessRemoteWrite)
					if err == nil {
						bt := tg.Batched()
						for k := 0; k < 4 && err == nil; k++ {
							err = bt.Write(&pins, uint64(k), data[:stripe-4])
						}
						pins.Release()
					}
				}
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrNotBound), errors.Is(err, ErrStaleKey):
					failed.Add(1)
				default:
					t.Errorf("writer %d: %v", g, err)
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for round := 1; round < 200 && time.Now().Before(deadline); round++ {
		runtime.Gosched()
		if err := w.Invalidate(); err != nil {
			t.Fatal(err)
		}
		snap := bytes.Clone(buf)
		runtime.Gosched()
		time.Sleep(20 * time.Microsecond) // writers run into the unbound window
		if !bytes.Equal(snap, buf) {
			t.Fatalf("round %d: window memory changed after Invalidate returned", round)
		}
		k, err := w.BindQP(qpA, mr, 0x10000, size, AccessRemoteWrite, uint8(round))
		if err != nil {
			t.Fatal(err)
		}
		key.Store(k)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d writes landed, %d refused", ok.Load(), failed.Load())
	if ok.Load() == 0 || failed.Load() == 0 {
		t.Fatalf("race not exercised: ok=%d failed=%d", ok.Load(), failed.Load())
	}
}
