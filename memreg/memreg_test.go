package memreg

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/gorocev2/rocev2/aeth"
)

// alignedBuf returns n bytes whose first byte is 8-byte aligned.
func alignedBuf(n int) []byte {
	w := make([]uint64, (n+7)/8+1)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

func mustPD(t testing.TB, tb *Table) *PD {
	t.Helper()
	pd, err := tb.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	return pd
}

func mustMR(t testing.TB, pd *PD, buf []byte, iova uint64, acc Access) *MR {
	t.Helper()
	mr, err := pd.RegisterMRIOVA(buf, iova, acc)
	if err != nil {
		t.Fatalf("register %v: %v", acc, err)
	}
	return mr
}

const (
	allRights = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic | AccessMWBind
	qpA       = 0x11
	qpB       = 0x12
)

// fixture is a table with one region of every kind the access matrix needs.
type fixture struct {
	tb                        *Table
	pd, pd2                   *PD
	rw, ro, local, other, odd *MR
	staleKey, staleByteKey    uint32
	unknownKey                uint32
	w1, w2, wUnbound, wInv    *MW
	w1Key, w2Key, wUnboundKey uint32
	wInvKey, w1OldKey         uint32
}

const (
	ioRW    = 0x10000 // rw: 4096 bytes, all rights
	ioRO    = 0x20000 // ro: 4096 bytes, remote read only
	ioLocal = 0x30000 // local: 4096 bytes, local write only
	ioOther = 0x40000 // other: 4096 bytes in pd2
	ioOdd   = 0x50000 // odd: aligned IOVA over a host address that is not 8-byte aligned
	ioStale = 0x60000
)

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{tb: NewTable(Limits{})}
	f.pd = mustPD(t, f.tb)
	f.pd2 = mustPD(t, f.tb)
	f.rw = mustMR(t, f.pd, alignedBuf(4096), ioRW, allRights)
	f.ro = mustMR(t, f.pd, alignedBuf(4096), ioRO, AccessRemoteRead)
	f.local = mustMR(t, f.pd, alignedBuf(4096), ioLocal, AccessLocalWrite)
	f.other = mustMR(t, f.pd2, alignedBuf(4096), ioOther, allRights)
	f.odd = mustMR(t, f.pd, alignedBuf(4096 + 8)[3:4096+3], ioOdd, allRights)

	gone := mustMR(t, f.pd, alignedBuf(64), ioStale, allRights)
	f.staleKey = gone.RKey()
	if err := gone.Deregister(); err != nil {
		t.Fatal(err)
	}
	f.staleByteKey = f.rw.RKey() ^ 0x5a // same index, another key byte
	f.unknownKey = 0xfff000<<8 | 7

	var err error
	if f.w1, err = f.pd.AllocMW(MWType1); err != nil {
		t.Fatal(err)
	}
	f.w1OldKey = f.w1.RKey()
	// Window 1: read-only view of rw [ioRW+1024, ioRW+2048).
	if f.w1Key, err = f.w1.Bind(f.rw, ioRW+1024, 1024, AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	f.w2, _ = f.pd.AllocMW(MWType2)
	// Window 2: write+atomic view of rw [ioRW+2048, ioRW+3072) for QP qpA.
	if f.w2Key, err = f.w2.BindQP(qpA, f.rw, ioRW+2048, 1024, AccessRemoteWrite|AccessRemoteAtomic, 0x77); err != nil {
		t.Fatal(err)
	}
	f.wUnbound, _ = f.pd.AllocMW(MWType1)
	f.wUnboundKey = f.wUnbound.RKey()
	f.wInv, _ = f.pd.AllocMW(MWType2)
	if f.wInvKey, err = f.wInv.BindQP(qpA, f.rw, ioRW, 64, AccessRemoteWrite, 0x01); err != nil {
		t.Fatal(err)
	}
	if err := f.wInv.Invalidate(); err != nil {
		t.Fatal(err)
	}
	return f
}

type opKind int

const (
	doCheck opKind = iota
	doWrite
	doRead
	doCAS
	doFAA
)

func (o opKind) String() string {
	return [...]string{"check", "write", "read", "cas", "faa"}[o]
}

// run performs one remote operation through view v.
func run(v QPView, op opKind, key uint32, va uint64, n uint32, acc Access) error {
	switch op {
	case doCheck:
		return v.CheckRemote(key, va, n, acc)
	case doWrite:
		return v.WriteRemote(key, va, make([]byte, n))
	case doRead:
		return v.ReadRemote(key, va, make([]byte, n))
	case doCAS:
		_, err := v.CompareSwap(key, va, 0, 1)
		return err
	case doFAA:
		_, err := v.FetchAdd(key, va, 1)
		return err
	}
	panic("bad op")
}

// TestAccessMatrix exercises every access rule, each case expecting its
// specific sentinel and the NAK code a responder would send.
func TestAccessMatrix(t *testing.T) {
	f := newFixture(t)
	const (
		RW  = AccessRemoteWrite
		RR  = AccessRemoteRead
		RA  = AccessRemoteAtomic
		ok  = aeth.NAKCode(255) // marker: no error expected
		acc = aeth.NAKRemoteAccessError
		inv = aeth.NAKInvalidRequest
	)
	rw, ro, local, other, odd := f.rw.RKey(), f.ro.RKey(), f.local.RKey(), f.other.RKey(), f.odd.RKey()
	cases := []struct {
		name string
		qp   uint32 // 0: PD-level call; otherwise ForQP(qp)
		op   opKind
		key  uint32
		va   uint64
		n    uint32
		acc  Access
		err  error
		nak  aeth.NAKCode
	}{
		// Valid accesses.
		{"write whole region", 0, doWrite, rw, ioRW, 4096, RW, nil, ok},
		{"read last byte", 0, doRead, rw, ioRW + 4095, 1, RR, nil, ok},
		{"check union of rights", 0, doCheck, rw, ioRW, 8, RW | RR | RA, nil, ok},
		{"cas aligned", 0, doCAS, rw, ioRW + 8, 8, RA, nil, ok},
		{"faa last word", 0, doFAA, rw, ioRW + 4088, 8, RA, nil, ok},
		{"faa host-misaligned region (stripe lock)", 0, doFAA, odd, ioOdd + 16, 8, RA, nil, ok},
		{"read-only region read", 0, doRead, ro, ioRO, 100, RR, nil, ok},
		// Zero length: valid, no key is checked.
		{"zero-length check, unknown key", 0, doCheck, f.unknownKey, 0, 0, RW, nil, ok},
		{"zero-length write, stale key", 0, doWrite, f.staleKey, ^uint64(0), 0, RW, nil, ok},
		{"zero-length read, wrong PD", 0, doRead, other, 0, 0, RR, nil, ok},
		// Unknown key.
		{"unknown key index", 0, doWrite, f.unknownKey, ioRW, 8, RW, ErrUnknownKey, acc},
		{"key index 0", 0, doRead, 0x000000ab, 0, 8, RR, ErrUnknownKey, acc},
		{"unknown key atomic", 0, doFAA, f.unknownKey, 0, 8, RA, ErrUnknownKey, acc},
		// Stale key.
		{"deregistered region", 0, doWrite, f.staleKey, ioStale, 8, RW, ErrStaleKey, acc},
		{"wrong key byte", 0, doRead, f.staleByteKey, ioRW, 8, RR, ErrStaleKey, acc},
		{"window key before rebind", 0, doRead, f.w1OldKey, ioRW + 1024, 8, RR, ErrStaleKey, acc},
		// Wrong PD.
		{"other PD's region", 0, doWrite, other, ioOther, 8, RW, ErrWrongPD, acc},
		{"other PD's region atomic", 0, doCAS, other, ioOther, 8, RA, ErrWrongPD, acc},
		// Missing access right.
		{"write to read-only region", 0, doWrite, ro, ioRO, 8, RW, ErrAccessDenied, acc},
		{"atomic on read-only region", 0, doFAA, ro, ioRO, 8, RA, ErrAccessDenied, acc},
		{"remote read of local-only region", 0, doRead, local, ioLocal, 8, RR, ErrAccessDenied, acc},
		{"check needs a right not granted", 0, doCheck, ro, ioRO, 8, RR | RW, ErrAccessDenied, acc},
		// Out of bounds.
		{"va below region", 0, doWrite, rw, ioRW - 1, 8, RW, ErrOutOfBounds, acc},
		{"end past region", 0, doRead, rw, ioRW + 4090, 7, RR, ErrOutOfBounds, acc},
		{"va far past region", 0, doCheck, rw, ioRW + 1<<20, 1, RW, ErrOutOfBounds, acc},
		{"atomic straddles end", 0, doFAA, rw, ioRW + 4096, 8, RA, ErrOutOfBounds, acc},
		{"misaligned and out of bounds: bounds first (rxe order)", 0, doCAS, rw, ioRW + 4093, 8, RA, ErrOutOfBounds, acc},
		// va+length wrap.
		{"va+len wraps", 0, doWrite, rw, ^uint64(0) - 3, 8, RW, ErrAddressWrap, acc},
		{"va+len wraps by one", 0, doCheck, rw, ^uint64(0), 2, RR, ErrAddressWrap, acc},
		// Malformed: length, alignment, flags -> invalid request.
		{"DMA length above 2^31", 0, doCheck, rw, ioRW, 1<<31 + 1, RW, ErrLength, inv},
		{"DMA length above 2^31 unknown key (length first)", 0, doCheck, f.unknownKey, 0, 1<<31 + 1, RR, ErrLength, inv},
		{"misaligned cas", 0, doCAS, rw, ioRW + 4, 8, RA, ErrMisaligned, inv},
		{"misaligned faa", 0, doFAA, rw, ioRW + 1, 8, RA, ErrMisaligned, inv},
		{"local right in remote check", 0, doCheck, rw, ioRW, 8, AccessLocalWrite, ErrInvalidAccessFlags, inv},
		{"no right in remote check", 0, doCheck, rw, ioRW, 8, 0, ErrInvalidAccessFlags, inv},
		// Type 1 window (read-only, [ioRW+1024, ioRW+2048)).
		{"window read inside", 0, doRead, f.w1Key, ioRW + 1024, 1024, RR, nil, ok},
		{"window write denied", 0, doWrite, f.w1Key, ioRW + 1024, 8, RW, ErrAccessDenied, acc},
		{"window read outside window, inside region", 0, doRead, f.w1Key, ioRW + 2040, 16, RR, ErrOutOfBounds, acc},
		{"window read below window", 0, doRead, f.w1Key, ioRW, 8, RR, ErrOutOfBounds, acc},
		{"unbound type 1 window", 0, doRead, f.wUnboundKey, ioRW, 8, RR, ErrNotBound, acc},
		// Type 2 window (write+atomic, [ioRW+2048, ioRW+3072), QP qpA).
		{"type 2 window write from its QP", qpA, doWrite, f.w2Key, ioRW + 2048, 1024, RW, nil, ok},
		{"type 2 window atomic from its QP", qpA, doFAA, f.w2Key, ioRW + 3064, 8, RA, nil, ok},
		{"type 2 window from another QP", qpB, doWrite, f.w2Key, ioRW + 2048, 8, RW, ErrWrongQP, acc},
		{"type 2 window read denied", qpA, doRead, f.w2Key, ioRW + 2048, 8, RR, ErrAccessDenied, acc},
		{"type 2 window out of range", qpA, doWrite, f.w2Key, ioRW + 3072, 8, RW, ErrOutOfBounds, acc},
		{"type 2 window misaligned atomic", qpA, doCAS, f.w2Key, ioRW + 2052, 8, RA, ErrMisaligned, inv},
		{"invalidated type 2 window", qpA, doWrite, f.wInvKey, ioRW, 8, RW, ErrNotBound, acc},
		{"region key through another QP view", qpB, doWrite, rw, ioRW, 8, RW, nil, ok},
	}
	for _, c := range cases {
		t.Run(c.op.String()+"/"+c.name, func(t *testing.T) {
			v := f.pd.any()
			if c.qp != 0 {
				v = f.pd.ForQP(c.qp)
			}
			err := run(v, c.op, c.key, c.va, c.n, c.acc)
			if c.err == nil {
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				return
			}
			if !errors.Is(err, c.err) {
				t.Fatalf("want %v, got %v", c.err, err)
			}
			var ae *AccessError
			if !errors.As(err, &ae) {
				t.Fatalf("%T is not an *AccessError", err)
			}
			if ae.Key != c.key || ae.VA != c.va {
				t.Errorf("AccessError names key %#x va %#x, want %#x %#x", ae.Key, ae.VA, c.key, c.va)
			}
			if got := NAKCode(err); got != c.nak {
				t.Errorf("NAKCode = %v, want %v (err %v)", got, c.nak, err)
			}
			t.Log(err)
		})
	}
}

// TestRegistrationRules covers the verbs flag rules and argument errors.
func TestRegistrationRules(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := make([]byte, 64)
	cases := []struct {
		name string
		buf  []byte
		iova uint64
		acc  Access
		err  error
	}{
		{"local write", buf, 0x1000, AccessLocalWrite, nil},
		{"read only (no flags)", buf, 0x1000, 0, nil},
		{"remote read without local write", buf, 0x1000, AccessRemoteRead, nil},
		{"remote write with local write", buf, 0x1000, AccessLocalWrite | AccessRemoteWrite, nil},
		{"mw bind alone", buf, 0x1000, AccessMWBind, nil},
		{"remote write without local write", buf, 0x1000, AccessRemoteWrite, ErrInvalidAccessFlags},
		{"remote atomic without local write", buf, 0x1000, AccessRemoteAtomic | AccessRemoteRead, ErrInvalidAccessFlags},
		{"unknown flag bit", buf, 0x1000, AccessLocalWrite | 0x100, ErrInvalidAccessFlags},
		{"empty buffer", nil, 0x1000, AccessLocalWrite, ErrInvalidArgument},
		{"iova+len wraps", buf, ^uint64(0) - 10, AccessLocalWrite, ErrAddressWrap},
		{"iova ends at top of address space", buf, ^uint64(0) - 63, AccessLocalWrite, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mr, err := pd.RegisterMRIOVA(c.buf, c.iova, c.acc)
			if !errors.Is(err, c.err) {
				t.Fatalf("want %v, got %v", c.err, err)
			}
			if err == nil {
				if mr.Access() != c.acc || mr.IOVA() != c.iova || mr.Len() != len(c.buf) || mr.LKey() != mr.RKey() {
					t.Errorf("region reports access %v iova %#x len %d keys %#x/%#x", mr.Access(), mr.IOVA(), mr.Len(), mr.LKey(), mr.RKey())
				}
				if err := mr.Deregister(); err != nil {
					t.Fatal(err)
				}
			} else {
				t.Log(err)
			}
		})
	}
	// RegisterMR uses the host address as IOVA.
	mr, err := pd.RegisterMR(buf, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if mr.IOVA() != uint64(uintptr(unsafe.Pointer(&buf[0]))) {
		t.Errorf("IOVA %#x is not the buffer's address", mr.IOVA())
	}
	if err := pd.WriteRemote(mr.RKey(), mr.IOVA()+60, []byte{1, 2, 3, 4}); err != nil || buf[63] != 4 {
		t.Errorf("write through host-address IOVA: %v, byte %d", err, buf[63])
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := mr.Deregister(); !errors.Is(err, ErrClosed) {
		t.Errorf("second deregister: %v, want ErrClosed", err)
	}
	if _, err := pd.RegisterMR(nil, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("RegisterMR(nil): %v", err)
	}
}

// TestKeyReuse: a region deregistered and registered again over and over
// (a bounce buffer per request) never gets a key it had before within
// reuseAfter × 256 registrations, every old key fails as stale, and a
// released index comes back only after reuseAfter others, with the next
// key byte. Before, the same index came back at once and the key
// repeated exactly every 256 registrations (a peer's stale rkey wrote
// the new region).
func TestKeyReuse(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(64)
	mr := mustMR(t, pd, buf, 0x1000, allRights)
	first := mr.RKey()
	seen := map[uint32]bool{first: true}
	keys := []uint32{first}
	for i := 0; i < 3*reuseAfter; i++ {
		if err := mr.Deregister(); err != nil {
			t.Fatal(err)
		}
		mr = mustMR(t, pd, buf, 0x1000, allRights)
		k := mr.RKey()
		if seen[k] {
			t.Fatalf("registration %d: key %#x handed out again", i+1, k)
		}
		seen[k] = true
		keys = append(keys, k)
		if i%97 == 0 {
			for _, old := range keys[:len(keys)-1] {
				if err := pd.WriteRemote(old, 0x1000, []byte{1}); !errors.Is(err, ErrStaleKey) {
					t.Fatalf("old key %#x: %v, want ErrStaleKey", old, err)
				}
			}
		}
		if err := pd.WriteRemote(k, 0x1000, []byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	// The first index came back after reuseAfter releases, key byte + 1.
	back := keys[reuseAfter]
	if KeyIndex(back) != KeyIndex(first) || KeyByte(back) != KeyByte(first)+1 {
		t.Fatalf("registration %d got %#x, want index %#x with key byte %#x", reuseAfter, back, KeyIndex(first), KeyByte(first)+1)
	}
	for i, k := range keys[1:reuseAfter] {
		if KeyIndex(k) == KeyIndex(first) {
			t.Fatalf("registration %d reused the first index before %d others were released", i+1, reuseAfter)
		}
	}
}

// TestLimits: every limit gives ErrLimit and frees up again on release.
func TestLimits(t *testing.T) {
	tb := NewTable(Limits{MaxMR: 2, MaxBytes: 100, MaxPD: 1, MaxMW: 1})
	pd := mustPD(t, tb)
	if _, err := tb.AllocPD(); !errors.Is(err, ErrLimit) {
		t.Errorf("second PD: %v", err)
	}
	a := mustMR(t, pd, make([]byte, 60), 0, AccessLocalWrite)
	if _, err := pd.RegisterMR(make([]byte, 41), AccessLocalWrite); !errors.Is(err, ErrLimit) {
		t.Errorf("bytes over MaxBytes: %v", err)
	} else {
		t.Log(err)
	}
	b := mustMR(t, pd, make([]byte, 40), 0, AccessLocalWrite)
	if _, err := pd.RegisterMR(make([]byte, 1), AccessLocalWrite); !errors.Is(err, ErrLimit) {
		t.Errorf("third MR: %v", err)
	} else {
		t.Log(err)
	}
	if u := tb.Usage(); u != (Usage{PDs: 1, MRs: 2, Bytes: 100}) {
		t.Errorf("usage %+v", u)
	}
	if _, err := tb.AllocPD(); !errors.Is(err, ErrLimit) {
		t.Errorf("PD over limit: %v", err)
	}
	mw, err := pd.AllocMW(MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.AllocMW(MWType2); !errors.Is(err, ErrLimit) {
		t.Errorf("second MW: %v", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Errorf("dealloc PD with live objects: %v", err)
	}
	if err := a.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegisterMR(make([]byte, 60), AccessLocalWrite); err != nil {
		t.Errorf("after release: %v", err)
	}
	_ = b
	mw.Dealloc()
	if _, err := pd.AllocMW(MWType2); err != nil {
		t.Errorf("MW after dealloc: %v", err)
	}
}

func TestAccessString(t *testing.T) {
	for a, want := range map[Access]string{
		0:                                   "NONE",
		AccessLocalWrite | AccessRemoteRead: "LOCAL_WRITE|REMOTE_READ",
		allRights:                           "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC|MW_BIND",
		AccessRemoteAtomic | 0x300:          "REMOTE_ATOMIC|0x300",
	} {
		if got := a.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint32(a), got, want)
		}
	}
}

func TestErrorText(t *testing.T) {
	f := newFixture(t)
	err := f.pd.WriteRemote(f.ro.RKey(), ioRO+8, make([]byte, 16))
	want := "memreg: write key " // then the key, va, len and rule
	if s := err.Error(); len(s) < len(want) || s[:len(want)] != want {
		t.Fatalf("error text %q", s)
	}
	t.Log(err)
	err = f.pd.ReadRemote(f.rw.RKey(), ioRW+4000, make([]byte, 200))
	t.Log(err)
	var ae *AccessError
	if !errors.As(err, &ae) || ae.Op != OpRead || ae.Len != 200 || ae.Detail == "" {
		t.Fatalf("%#v", ae)
	}
}

// TestPDAcquire: a PD held by another object (a QP) cannot be deallocated
// until it is released; a dead PD cannot be acquired.
func TestPDAcquire(t *testing.T) {
	tb := NewTable(Limits{})
	pd, err := tb.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.Acquire(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dealloc of an acquired PD = %v, want ErrBusy", err)
	}
	pd.Release()
	if err := pd.Dealloc(); err != nil {
		t.Fatalf("Dealloc after Release = %v", err)
	}
	if err := pd.Acquire(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire of a dead PD = %v, want ErrClosed", err)
	}
}

// TestMRSGE: MR.SGE addresses the region through its IOVA and lkey, and
// the SGE it gives is accepted (in range) or rejected (out of range).
func TestMRSGE(t *testing.T) {
	tb := NewTable(Limits{})
	pd, _ := tb.AllocPD()
	buf := make([]byte, 64)
	mr, err := pd.RegisterMRIOVA(buf, 0x1000, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	s := mr.SGE(16, 32)
	if s != (SGE{Addr: 0x1010, Length: 32, LKey: mr.LKey()}) {
		t.Fatalf("SGE = %+v", s)
	}
	if n, err := pd.CheckSGEs([]SGE{s}, AccessLocalWrite); err != nil || n != 32 {
		t.Fatalf("CheckSGEs(in range) = %d, %v", n, err)
	}
	if _, err := pd.CheckSGEs([]SGE{mr.SGE(48, 32)}, 0); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("CheckSGEs(out of range) = %v, want ErrOutOfBounds", err)
	}
}
