package memreg

import (
	"bytes"
	"errors"
	"testing"
)

// TestRefDeregistered: a Ref kept from CheckSGEsRef is not used once its
// region is deregistered, nor after the same memory is registered again
// (at the same IOVA, under a new key): GatherRef and a ScatterList.InitRef's
// Scatter fail as Gather and Scatter do (ErrStaleKey), and neither reads
// nor writes the memory.
func TestRefDeregistered(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(64)
	for i := range buf {
		buf[i] = byte(i)
	}
	mr := mustMR(t, pd, buf, 0x1000, AccessLocalWrite)
	sges := []SGE{{Addr: 0x1010, Length: 16, LKey: mr.LKey()}}
	total, ref, err := pd.CheckSGEsRef(sges, AccessLocalWrite)
	if err != nil || total != 16 || ref == nil {
		t.Fatalf("CheckSGEsRef: %d %v %v", total, ref, err)
	}
	got := make([]byte, 8)
	if err := pd.GatherRef(sges, ref, 4, got); err != nil || !bytes.Equal(got, buf[0x14:0x1c]) {
		t.Fatalf("GatherRef live: %v %x", err, got)
	}
	var ps Pins
	var sl ScatterList
	sl.InitRef(pd, sges, ref)
	if err := sl.Scatter(&ps, 2, []byte{0xaa, 0xbb}); err != nil || buf[0x12] != 0xaa || buf[0x13] != 0xbb {
		t.Fatalf("Scatter live: %v %x", err, buf[0x10:0x20])
	}
	ps.Release()

	for _, again := range []bool{false, true} {
		if !again {
			if err := mr.Deregister(); err != nil {
				t.Fatal(err)
			}
		} else {
			// The memory registered anew at the same IOVA: a new key,
			// which the old SGE does not name.
			mr = mustMR(t, pd, buf, 0x1000, AccessLocalWrite)
		}
		want := pd.Gather(sges, 4, got)
		if !errors.Is(want, ErrStaleKey) {
			t.Fatalf("re-registered %v: Gather: %v", again, want)
		}
		clear(got)
		if err := pd.GatherRef(sges, ref, 4, got); err == nil || err.Error() != want.Error() {
			t.Fatalf("re-registered %v: GatherRef after Deregister: %v, want %v", again, err, want)
		}
		if !bytes.Equal(got, make([]byte, 8)) {
			t.Fatalf("re-registered %v: GatherRef read the memory: %x", again, got)
		}
		before := bytes.Clone(buf)
		var sl ScatterList
		sl.InitRef(pd, sges, ref)
		err := sl.Scatter(&ps, 2, []byte{0x11, 0x22})
		ps.Release()
		if !errors.Is(err, ErrStaleKey) {
			t.Fatalf("re-registered %v: Scatter after Deregister: %v", again, err)
		}
		if !bytes.Equal(buf, before) {
			t.Fatalf("re-registered %v: Scatter wrote the memory", again)
		}
		if again {
			// The new region's own SGE works.
			nsges := []SGE{{Addr: 0x1010, Length: 16, LKey: mr.LKey()}}
			if err := pd.GatherRef(nsges, ref, 4, got); err != nil || !bytes.Equal(got, buf[0x14:0x1c]) {
				t.Fatalf("GatherRef of the new region with the old Ref: %v %x", err, got)
			}
		}
	}
}

// TestRefMismatch: a Ref is only a hint. Used with an element it was not
// checked for (another region, a range outside it) or for a right it
// does not grant, the copy takes the full path: the element's own region,
// or the full path's error.
func TestRefMismatch(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	a, b := alignedBuf(64), alignedBuf(64)
	for i := range b {
		b[i] = 0x80 | byte(i)
	}
	ma := mustMR(t, pd, a, 0x1000, 0)                // read only
	mb := mustMR(t, pd, b, 0x1000, AccessLocalWrite) // the same IOVA, its own key
	_, ra, err := pd.CheckSGEsRef([]SGE{{Addr: 0x1000, Length: 64, LKey: ma.LKey()}}, 0)
	if err != nil || ra == nil {
		t.Fatal(ra, err)
	}
	got := make([]byte, 4)
	if err := pd.GatherRef([]SGE{{Addr: 0x1000, Length: 8, LKey: mb.LKey()}}, ra, 0, got); err != nil || !bytes.Equal(got, b[:4]) {
		t.Fatalf("GatherRef of b with a's Ref: %v %x", err, got)
	}
	// a granted no local write: the Scatter through its Ref is refused.
	var ps Pins
	var sl ScatterList
	sl.InitRef(pd, []SGE{{Addr: 0x1000, Length: 64, LKey: ma.LKey()}}, ra)
	if err := sl.Scatter(&ps, 0, []byte{1}); !errors.Is(err, ErrAccessDenied) {
		t.Fatalf("Scatter into a read-only region through its Ref: %v", err)
	}
	ps.Release()
	// An element reaching past the region: Gather's ErrOutOfBounds.
	if err := pd.GatherRef([]SGE{{Addr: 0x1000 + 60, Length: 8, LKey: ma.LKey()}}, ra, 0, make([]byte, 8)); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("GatherRef past the region: %v", err)
	}
	// Another PD's region: ErrWrongPD.
	pd2 := mustPD(t, tb)
	if err := pd2.GatherRef([]SGE{{Addr: 0x1000, Length: 8, LKey: ma.LKey()}}, ra, 0, got); !errors.Is(err, ErrWrongPD) {
		t.Fatalf("GatherRef through another PD: %v", err)
	}
	// Lists of other lengths carry no Ref.
	if _, r, err := pd.CheckSGEsRef([]SGE{{Addr: 0x1000, Length: 8, LKey: ma.LKey()}, {Addr: 0x1000, Length: 8, LKey: mb.LKey()}}, 0); err != nil || r != nil {
		t.Fatalf("two elements: %v %v", r, err)
	}
	if _, r, err := pd.CheckSGEsRef([]SGE{{Addr: 0x1000, Length: 8, LKey: 0x1234}}, 0); !errors.Is(err, ErrUnknownKey) || r != nil {
		t.Fatalf("unknown key: %v %v", r, err)
	}
}
