package memreg

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestBatchTargetRules: BatchTarget.Write follows Target.Write's rules
// and errors, with and without Pins.
func TestBatchTargetRules(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(256)
	mr := mustMR(t, pd, buf, 0x1000, allRights)
	wt, err := pd.Lookup(mr.RKey(), 0x1010, 64, AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := pd.Lookup(mr.RKey(), 0x1010, 64, AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	zt, err := pd.Lookup(0xdeadbeef, 0x1234, 0, AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tg   Target
		off  uint64
		n    int
		want error // nil: placed at 0x10+off
	}{
		{"first byte", wt, 0, 1, nil},
		{"last bytes", wt, 60, 4, nil},
		{"whole target", wt, 0, 64, nil},
		{"zero length", wt, 10, 0, nil},
		{"zero length at end", wt, 64, 0, nil},
		{"one past the end", wt, 61, 4, ErrOutOfBounds},
		{"offset past the end", wt, 65, 1, ErrOutOfBounds},
		{"offset wraps", wt, ^uint64(0), 2, ErrOutOfBounds},
		{"longer than target", wt, 0, 65, ErrOutOfBounds},
		{"read-only target", rt, 0, 4, ErrAccessDenied},
		{"zero-length target", zt, 0, 1, ErrOutOfBounds},
		{"zero-length target, no data", zt, 0, 0, nil},
	} {
		for _, withPins := range []bool{false, true} {
			for i := range buf {
				buf[i] = 0
			}
			p := bytes.Repeat([]byte{0xab}, tc.n)
			var pins Pins
			ps := &pins
			if !withPins {
				ps = nil
			}
			bt := tc.tg.Batched()
			err := bt.Write(ps, tc.off, p)
			terr := tc.tg.Write(tc.off, p) // the same call through Target
			if tc.want == nil {
				if err != nil || terr != nil {
					t.Errorf("%s (pins %v): %v / Target.Write %v", tc.name, withPins, err, terr)
					continue
				}
				want := make([]byte, 256)
				copy(want[0x10+tc.off:], p)
				if !bytes.Equal(buf, want) {
					t.Errorf("%s (pins %v): wrong bytes placed", tc.name, withPins)
				}
			} else {
				if !errors.Is(err, tc.want) || !errors.Is(terr, tc.want) {
					t.Errorf("%s (pins %v): %v, Target.Write %v, want %v", tc.name, withPins, err, terr, tc.want)
				}
				if err != nil && err.Error() != terr.Error() {
					t.Errorf("%s (pins %v): error %q differs from Target.Write's %q", tc.name, withPins, err, terr)
				}
				if bytes.ContainsFunc(buf, func(r rune) bool { return r != 0 }) {
					t.Errorf("%s (pins %v): placed despite the error", tc.name, withPins)
				}
			}
			if pins.Len() > 1 {
				t.Errorf("%s: %d pins held after one Write", tc.name, pins.Len())
			}
			pins.Release()
		}
	}
}

// TestBatchTargetPins: a BatchTarget pins once per batch, consecutive
// targets in one region share the pin, Release unpins, and a Deregister
// waits for the Release and then nothing more is placed.
func TestBatchTargetPins(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(1 << 12)
	mr := mustMR(t, pd, buf, 0x10000, allRights)
	other := mustMR(t, pd, alignedBuf(64), 0x90000, allRights)
	lk := func(mr *MR, va uint64, n uint32) BatchTarget {
		tg, err := pd.Lookup(mr.RKey(), va, n, AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		return tg.Batched()
	}
	var pins Pins
	a, b, c := lk(mr, 0x10000, 1024), lk(mr, 0x10400, 1024), lk(other, 0x90000, 64)
	for i := range 3 {
		if err := a.Write(&pins, uint64(i), []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	if pins.Len() != 1 {
		t.Fatalf("three writes through one target: %d pins, want 1", pins.Len())
	}
	if err := b.Write(&pins, 0, []byte{2}); err != nil || pins.Len() != 1 {
		t.Fatalf("second target in the same region: %v, %d pins, want 1", err, pins.Len())
	}
	if err := c.Write(&pins, 0, []byte{3}); err != nil || pins.Len() != 2 {
		t.Fatalf("target in another region: %v, %d pins, want 2", err, pins.Len())
	}
	if got := mr.e.refs.Load(); got != 1 {
		t.Fatalf("region refs %d while held, want 1", got)
	}
	pins.Release()
	if pins.Len() != 0 || mr.e.refs.Load() != 0 || other.e.refs.Load() != 0 {
		t.Fatalf("after Release: %d pins, refs %d/%d", pins.Len(), mr.e.refs.Load(), other.e.refs.Load())
	}
	// A new batch pins again.
	if err := a.Write(&pins, 8, []byte{4}); err != nil || pins.Len() != 1 || mr.e.refs.Load() != 1 {
		t.Fatalf("write after Release: %v, %d pins, refs %d", err, pins.Len(), mr.e.refs.Load())
	}

	// Deregister while held: it does not return before Release; writes of
	// the batch still land (the registration is not gone yet).
	done := make(chan error, 1)
	go func() { done <- mr.Deregister() }()
	for mr.e.refs.Load()&deadBit == 0 {
		time.Sleep(time.Millisecond) // wait until Deregister has killed the entry
	}
	if err := a.Write(&pins, 9, []byte{5}); err != nil {
		t.Fatalf("write through a held pin during Deregister: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Deregister returned (%v) while a pin was held", err)
	case <-time.After(20 * time.Millisecond):
	}
	pins.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	snap := bytes.Clone(buf)
	if buf[9] != 5 {
		t.Fatalf("write before Release did not land")
	}
	for _, bt := range []*BatchTarget{&a, &b} {
		if err := bt.Write(&pins, 0, []byte{6}); !errors.Is(err, ErrStaleKey) {
			t.Fatalf("write after Deregister: %v, want ErrStaleKey", err)
		}
		if err := bt.Write(nil, 0, []byte{6}); !errors.Is(err, ErrStaleKey) {
			t.Fatalf("write (no pins) after Deregister: %v, want ErrStaleKey", err)
		}
	}
	if pins.Len() != 0 || !bytes.Equal(buf, snap) {
		t.Fatalf("memory changed after Deregister returned (pins %d)", pins.Len())
	}
}

// TestScatterListMatchesScatter: random scatter/gather lists (several
// regions, one without local write, zero-length and out-of-bounds
// elements) and random sequences of pieces, mostly consecutive as the
// packets of a SEND: ScatterList.Scatter through Pins (released at random
// points) places the same bytes and returns the same errors as
// PD.Scatter.
func TestScatterListMatchesScatter(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	const size = 4096
	bufs := [][]byte{alignedBuf(size), alignedBuf(size), alignedBuf(size)}
	mrs := []*MR{
		mustMR(t, pd, bufs[0], 0x10000, AccessLocalWrite),
		mustMR(t, pd, bufs[1], 0x20000, AccessLocalWrite|AccessRemoteWrite),
		mustMR(t, pd, bufs[2], 0x30000, AccessRemoteRead), // no local write
	}
	r := rand.New(rand.NewPCG(3, 4))
	type piece struct {
		off uint64
		n   int
	}
	for iter := range 2000 {
		var sges []SGE
		var total uint64
		for range 1 + r.IntN(4) {
			m := r.IntN(len(mrs))
			if r.IntN(10) == 0 {
				m = 2
			} else {
				m %= 2
			}
			addr := mrs[m].IOVA() + uint64(r.IntN(size))
			n := uint32(r.IntN(size/2 + 1))
			if r.IntN(20) == 0 {
				n = size // often past the end of the region
			}
			if r.IntN(20) == 0 {
				n = 0
			}
			sges = append(sges, SGE{Addr: addr, Length: n, LKey: mrs[m].LKey()})
			total += uint64(n)
		}
		var pieces []piece
		var off uint64
		for range 1 + r.IntN(12) {
			n := 1 + r.IntN(300)
			if r.IntN(8) == 0 {
				off = uint64(r.IntN(int(total) + 16)) // jump (also past the end)
			}
			pieces = append(pieces, piece{off, n})
			off += uint64(n)
		}
		src := make([]byte, 300)
		run := func(batched bool) ([]string, [][]byte) {
			for _, b := range bufs {
				clear(b)
			}
			var pins Pins
			sl := pd.ScatterList(sges)
			var errs []string
			for k, p := range pieces {
				for i := range src {
					src[i] = byte(k*31 + i + 1)
				}
				var err error
				if batched {
					err = sl.Scatter(&pins, p.off, src[:p.n])
					if r.IntN(4) == 0 {
						pins.Release()
					}
				} else {
					err = pd.Scatter(sges, p.off, src[:p.n])
				}
				errs = append(errs, fmt.Sprint(err))
			}
			pins.Release()
			out := make([][]byte, len(bufs))
			for i, b := range bufs {
				out[i] = bytes.Clone(b)
			}
			return errs, out
		}
		gotErrs, got := run(true)
		wantErrs, want := run(false)
		for k := range pieces {
			if gotErrs[k] != wantErrs[k] {
				t.Fatalf("iter %d: sges %+v piece %d %+v: ScatterList: %s, Scatter: %s", iter, sges, k, pieces[k], gotErrs[k], wantErrs[k])
			}
		}
		for i := range bufs {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("iter %d: sges %+v pieces %+v: region %d differs", iter, sges, pieces, i)
			}
		}
	}
	for _, mr := range mrs {
		if mr.e.refs.Load() != 0 {
			t.Fatalf("pins left behind: refs %d", mr.e.refs.Load())
		}
	}
}

// TestScatterListDeregister: a ScatterList holds its region until the
// Pins' Release; after Deregister returns it places nothing and fails
// like Scatter (stale key).
func TestScatterListDeregister(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(4096)
	mr := mustMR(t, pd, buf, 0x10000, AccessLocalWrite)
	sges := []SGE{{0x10000, 4096, mr.LKey()}}
	var pins Pins
	sl := pd.ScatterList(sges)
	if err := sl.Scatter(&pins, 0, []byte{1, 2}); err != nil || pins.Len() != 1 {
		t.Fatalf("%v, %d pins", err, pins.Len())
	}
	if err := sl.Scatter(&pins, 2, []byte{3}); err != nil || pins.Len() != 1 || mr.e.refs.Load() != 1 {
		t.Fatalf("second piece: %v, %d pins, refs %d", err, pins.Len(), mr.e.refs.Load())
	}
	done := make(chan error, 1)
	go func() { done <- mr.Deregister() }()
	for mr.e.refs.Load()&deadBit == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Deregister returned (%v) while held", err)
	case <-time.After(20 * time.Millisecond):
	}
	pins.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	snap := bytes.Clone(buf)
	err := sl.Scatter(&pins, 3, []byte{4})
	want := pd.Scatter(sges, 3, []byte{4})
	if !errors.Is(err, ErrStaleKey) || err.Error() != want.Error() {
		t.Fatalf("after Deregister: %v, Scatter says %v", err, want)
	}
	if !bytes.Equal(buf, snap) || !bytes.Equal(buf[:3], []byte{1, 2, 3}) || pins.Len() != 0 {
		t.Fatal("memory changed after Deregister returned")
	}
}
