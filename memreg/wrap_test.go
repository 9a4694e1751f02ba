package memreg

import "testing"

// TestWindowKeyCycle: a type 1 window's rkey changes at every bind by one
// in its 8-bit key byte (verbs' ibv_inc_rkey, as rxe's provider binds):
// a peer's stale rkey of the window is refused for the next 255 binds and
// names the window again only at the 256th — the verbs key format allows
// no more. A window deallocated and allocated again does not get its
// index back before reuseAfter other indices were released.
func TestWindowKeyCycle(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	mr := mustMR(t, pd, alignedBuf(64), 0x1000, allRights)
	mw, err := pd.AllocMW(MWType1)
	if err != nil {
		t.Fatal(err)
	}
	first, err := mw.Bind(mr, 0x1000, 64, AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 256; i++ {
		k, err := mw.Bind(mr, 0x1000, 64, AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		if KeyIndex(k) != KeyIndex(first) || KeyByte(k) != KeyByte(first)+uint8(i) {
			t.Fatalf("bind %d: rkey %#x, want index %#x key byte %#x", i, k, KeyIndex(first), KeyByte(first)+uint8(i))
		}
		stale := pd.CheckRemote(first, 0x1000, 8, AccessRemoteRead)
		if i < 256 && stale == nil {
			t.Fatalf("bind %d: the first bind's rkey %#x still reads the window", i, first)
		}
		if i == 256 && stale != nil {
			t.Fatalf("bind 256: rkey %#x: %v (the key byte has gone round)", first, stale)
		}
	}
	idx := KeyIndex(first)
	if err := mw.Dealloc(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < reuseAfter; i++ {
		w, err := pd.AllocMW(MWType1)
		if err != nil {
			t.Fatal(err)
		}
		if KeyIndex(w.RKey()) == idx {
			t.Fatalf("window %d got the deallocated window's index %#x back", i, idx)
		}
	}
}
