package memreg

import (
	"math"
	"testing"
)

// TestCheckSGEMatchesCheckSGEs: CheckSGE, the posting fast path, accepts
// an element exactly when CheckSGEs accepts it with a non-zero length,
// and then returns the region its lkey names — over live, stale,
// unknown, window and other-PD keys, keys in the table's first page and
// beyond it, rights local and not, and addresses and lengths at and
// around every edge of a region (one ending at the top of the address
// space included). A check it skipped, or an edge it moved, shows here.
func TestCheckSGEMatchesCheckSGEs(t *testing.T) {
	tb := NewTable(Limits{})
	pd, other := mustPD(t, tb), mustPD(t, tb)
	buf := alignedBuf(64)
	rw := mustMR(t, pd, buf, 0x1000, AccessLocalWrite|AccessRemoteWrite|AccessMWBind)
	ro := mustMR(t, pd, buf, math.MaxUint64-63, 0) // ends at 2^64-1
	theirs := mustMR(t, other, buf, 0x1000, AccessLocalWrite)
	gone := mustMR(t, pd, buf, 0x1000, AccessLocalWrite)
	goneKey := gone.LKey()
	if err := gone.Deregister(); err != nil {
		t.Fatal(err)
	}
	mw, err := pd.AllocMW(MWType1)
	if err != nil {
		t.Fatal(err)
	}
	wkey, err := mw.Bind(rw, 0x1000, 64, AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	// Past the first page of the key table (indices >= 4096).
	var far *MR
	for far == nil || KeyIndex(far.LKey()) < pageSize {
		far = mustMR(t, pd, buf, 0x8000, AccessLocalWrite)
	}

	type region struct {
		key        uint32
		start, len uint64
	}
	regions := []region{
		{rw.LKey(), 0x1000, 64}, {ro.LKey(), math.MaxUint64 - 63, 64}, {theirs.LKey(), 0x1000, 64},
		{goneKey, 0x1000, 64}, {wkey, 0x1000, 64}, {far.LKey(), 0x8000, 64},
		{rw.LKey() ^ 1, 0x1000, 64}, {0, 0x1000, 64}, {0xffffff00, 0x1000, 64},
	}
	accs := []Access{0, AccessLocalWrite, AccessRemoteWrite, AccessLocalWrite | AccessRemoteRead}
	lens := []uint64{0, 1, 2, 63, 64, 65, math.MaxUint32}
	n, accepted := 0, 0
	for _, r := range regions {
		last := r.start + r.len - 1
		addrs := []uint64{0, r.start - 1, r.start, r.start + 1, r.start + 32, last - 1, last, last + 1, math.MaxUint64}
		for _, addr := range addrs {
			for _, l := range lens {
				for _, acc := range accs {
					for _, p := range []*PD{pd, other} {
						s := SGE{Addr: addr, Length: uint32(l), LKey: r.key}
						ref := p.CheckSGE(&s, acc)
						_, err := p.CheckSGEs([]SGE{s}, acc)
						want := err == nil && s.Length != 0
						if (ref != nil) != want {
							t.Fatalf("key %#x addr %#x len %d acc %v own PD %v: CheckSGE accepts %v, CheckSGEs %v", s.LKey, addr, l, acc, p == pd, ref != nil, err)
						}
						if ref != nil && (*entry)(ref) != tb.lookup(s.LKey) {
							t.Fatalf("key %#x addr %#x len %d: CheckSGE returned another region", s.LKey, addr, l)
						}
						if _, rr, err := p.CheckSGEsRef([]SGE{s}, acc); rr != ref && err == nil {
							t.Fatalf("key %#x addr %#x len %d: CheckSGEsRef and CheckSGE return different regions", s.LKey, addr, l)
						}
						n++
						if ref != nil {
							accepted++
						}
					}
				}
			}
		}
	}
	if accepted == 0 || accepted == n {
		t.Fatalf("%d of %d elements accepted: the cases do not cover both answers", accepted, n)
	}
}
