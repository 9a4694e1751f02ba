package transport

import (
	"net/netip"
	"testing"
)

// TestFairQueue: a full queue drops the oldest request of the source
// holding the most (never the lone one), and take hands out the newest of
// each source in turn.
func TestFairQueue(t *testing.T) {
	q := newFairQueue(8)
	heavy, lone := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("192.0.2.3")
	mad := func(src netip.Addr, n byte) *MAD {
		m := &MAD{Src: src}
		m.Data[0] = n
		return m
	}
	q.put(mad(lone, 100))
	drops := 0
	for i := byte(1); i <= 50; i++ {
		if q.put(mad(heavy, i)) {
			drops++
		}
	}
	if drops != 43 || len(q.items) != 8 || q.perSrc[lone] != 1 || q.perSrc[heavy] != 7 {
		t.Fatalf("%d drops, %d queued, lone %d, heavy %d", drops, len(q.items), q.perSrc[lone], q.perSrc[heavy])
	}
	got := q.take(nil, 3)
	if len(got) != 3 || got[0].Data[0] != 50 || got[1].Data[0] != 100 || got[2].Data[0] != 49 {
		t.Fatalf("took %d, %d, %d: want the heavy source's newest, the lone one, then the heavy's next", got[0].Data[0], got[1].Data[0], got[2].Data[0])
	}
	got = q.take(got[:0], 100)
	if len(got) != 5 || len(q.items) != 0 || len(q.perSrc) != 0 {
		t.Fatalf("took %d of the rest, %d left, %d sources", len(got), len(q.items), len(q.perSrc))
	}
	// Every source holds one: the oldest goes.
	for i := byte(1); i <= 9; i++ {
		q.put(mad(netip.AddrFrom4([4]byte{203, 0, 113, i}), i))
	}
	if q.items[0].Data[0] != 2 {
		t.Fatalf("oldest left %d, want 2", q.items[0].Data[0])
	}
}
