package memreg

import (
	"errors"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
)

// TestBindRules: each bind rule of IBTA/rxe gives its specific error.
func TestBindRules(t *testing.T) {
	tb := NewTable(Limits{})
	pd, pd2 := mustPD(t, tb), mustPD(t, tb)
	full := mustMR(t, pd, alignedBuf(4096), 0x10000, allRights)
	noBind := mustMR(t, pd, alignedBuf(4096), 0x20000, AccessLocalWrite|AccessRemoteWrite)
	noLW := mustMR(t, pd, alignedBuf(4096), 0x30000, AccessMWBind|AccessRemoteRead)
	other := mustMR(t, pd2, alignedBuf(4096), 0x40000, allRights)
	w1, _ := pd.AllocMW(MWType1)
	w2, _ := pd.AllocMW(MWType2)

	cases := []struct {
		name   string
		mw     *MW
		type2  bool
		mr     *MR
		addr   uint64
		length uint64
		acc    Access
		err    error
	}{
		{"type 1 ok", w1, false, full, 0x10000, 4096, AccessRemoteRead | AccessRemoteWrite, nil},
		{"type 1 unbind (length 0)", w1, false, nil, 0, 0, 0, nil},
		{"region without MW_BIND (C10-73)", w1, false, noBind, 0x20000, 16, AccessRemoteRead, ErrAccessDenied},
		{"writable window on region without local write (C10-74)", w1, false, noLW, 0x30000, 16, AccessRemoteWrite, ErrInvalidAccessFlags},
		{"atomic window on region without local write (C10-74)", w1, false, noLW, 0x30000, 16, AccessRemoteAtomic, ErrInvalidAccessFlags},
		{"read window on region without local write", w1, false, noLW, 0x30000, 16, AccessRemoteRead, nil},
		{"window with local right", w1, false, full, 0x10000, 16, AccessLocalWrite, ErrInvalidAccessFlags},
		{"window below region (C10-75)", w1, false, full, 0xfff8, 16, AccessRemoteRead, ErrOutOfBounds},
		{"window past region (C10-75)", w1, false, full, 0x10ff0, 17, AccessRemoteRead, ErrOutOfBounds},
		{"window range wraps", w1, false, full, ^uint64(0) - 2, 16, AccessRemoteRead, ErrAddressWrap},
		{"region of another PD", w1, false, other, 0x40000, 16, AccessRemoteRead, ErrWrongPD},
		{"nil region", w1, false, nil, 0, 16, AccessRemoteRead, ErrInvalidArgument},
		{"type 2 through Bind", w2, false, full, 0x10000, 16, AccessRemoteRead, ErrInvalidState},
		{"type 1 through BindQP", w1, true, full, 0x10000, 16, AccessRemoteRead, ErrInvalidState},
		{"type 2 zero length (o10-37.2.40)", w2, true, full, 0x10000, 0, AccessRemoteRead, ErrInvalidArgument},
		{"type 2 ok", w2, true, full, 0x10000, 16, AccessRemoteRead, nil},
		{"type 2 bound twice (o10-37.2.30)", w2, true, full, 0x10000, 16, AccessRemoteRead, ErrInvalidState},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			if c.type2 {
				_, err = c.mw.BindQP(qpA, c.mr, c.addr, c.length, c.acc, 0x42)
			} else {
				_, err = c.mw.Bind(c.mr, c.addr, c.length, c.acc)
			}
			if !errors.Is(err, c.err) {
				t.Fatalf("want %v, got %v", c.err, err)
			}
			if err != nil {
				t.Log(err)
				// The error names the key at fault: the region's lkey
				// when the region refuses, else the window's rkey
				// (not the table index with key byte 0).
				var ae *AccessError
				if !errors.As(err, &ae) {
					t.Fatalf("%T, want *AccessError", err)
				}
				key, who := c.mw.RKey(), "the window's rkey"
				if c.mr != nil && (errors.Is(err, ErrAccessDenied) || errors.Is(err, ErrOutOfBounds) || errors.Is(err, ErrWrongPD) || c.mr == noLW) {
					key, who = c.mr.LKey(), "the region's lkey"
				}
				if ae.Key != key || !strings.Contains(ae.Detail, who) {
					t.Fatalf("error names key %#x (%q), want %#x (%s)", ae.Key, ae.Detail, key, who)
				}
			}
		})
	}
}

// TestWindowLifecycle: binds, rebinds, invalidations, deregistration
// refusal and the keys that go with them.
func TestWindowLifecycle(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(4096)
	mr := mustMR(t, pd, buf, 0x10000, allRights)
	plain := mustMR(t, pd, alignedBuf(64), 0x90000, AccessLocalWrite|AccessRemoteWrite)

	// Type 1: every bind bumps the key byte; old keys go stale.
	w1, _ := pd.AllocMW(MWType1)
	k0 := w1.RKey()
	k1, err := w1.Bind(mr, 0x10100, 256, AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if KeyIndex(k1) != KeyIndex(k0) || KeyByte(k1) != KeyByte(k0)+1 || w1.RKey() != k1 || !w1.Bound() {
		t.Fatalf("type 1 bind key %#x -> %#x", k0, k1)
	}
	if err := pd.WriteRemote(k1, 0x10100, []byte{9}); err != nil || buf[0x100] != 9 {
		t.Fatalf("write through window: %v", err)
	}
	if err := mr.Deregister(); !errors.Is(err, ErrBusy) {
		t.Fatalf("deregister with bound window: %v, want ErrBusy", err)
	} else {
		t.Log(err)
	}
	k2, err := w1.Bind(mr, 0x10200, 256, AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.WriteRemote(k1, 0x10100, []byte{9}); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("old type 1 key after rebind: %v", err)
	}
	if err := w1.Invalidate(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("invalidate type 1: %v", err)
	}
	if err := pd.InvalidateRemote(k2); !errors.Is(err, ErrInvalidState) || NAKCode(err) != aeth.NAKInvalidRequest {
		t.Fatalf("remote invalidate type 1: %v (NAK %v)", err, NAKCode(err))
	}
	k3, err := w1.Bind(nil, 0, 0, 0) // unbind
	if err != nil {
		t.Fatal(err)
	}
	if w1.Bound() || KeyByte(k3) != KeyByte(k2)+1 {
		t.Fatalf("unbind: bound=%v key %#x", w1.Bound(), k3)
	}
	if err := pd.ReadRemote(k3, 0x10200, make([]byte, 1)); !errors.Is(err, ErrNotBound) {
		t.Fatalf("read through unbound window: %v", err)
	}

	// Type 2: bound through a QP with a chosen key byte.
	w2, _ := pd.AllocMW(MWType2)
	k, err := w2.BindQP(qpA, mr, 0x10000, 64, AccessRemoteWrite|AccessRemoteRead, 0xc3)
	if err != nil {
		t.Fatal(err)
	}
	if KeyByte(k) != 0xc3 || KeyIndex(k) != KeyIndex(w2.RKey()) {
		t.Fatalf("type 2 key %#x", k)
	}
	if err := pd.ForQP(qpB).InvalidateRemote(k); !errors.Is(err, ErrWrongQP) || NAKCode(err) != aeth.NAKInvalidRequest {
		t.Fatalf("remote invalidate from another QP: %v", err)
	}
	if err := pd.ForQP(qpA).InvalidateRemote(k ^ 1); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("remote invalidate with wrong key byte: %v", err)
	}
	if err := pd.ForQP(qpA).InvalidateRemote(plain.RKey()); !errors.Is(err, ErrKeyType) || NAKCode(err) != aeth.NAKInvalidRequest {
		t.Fatalf("remote invalidate of an MR: %v", err)
	}
	if err := pd.ForQP(qpA).InvalidateRemote(0xfff00001); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("remote invalidate of unknown key: %v", err)
	}
	if err := pd.ForQP(qpA).InvalidateRemote(k); err != nil {
		t.Fatalf("remote invalidate: %v", err)
	}
	if err := pd.ForQP(qpA).WriteRemote(k, 0x10000, []byte{1}); !errors.Is(err, ErrNotBound) {
		t.Fatalf("write after remote invalidate: %v", err)
	}
	if err := pd.ForQP(qpA).InvalidateRemote(k); !errors.Is(err, ErrNotBound) {
		t.Fatalf("second invalidate: %v", err)
	}
	// Rebind with a new key byte; local invalidate through the key.
	k4, err := w2.BindQP(qpB, mr, 0x10000, 64, AccessRemoteRead, 0xc4)
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.ForQP(qpB).ReadRemote(k, 0x10000, make([]byte, 8)); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("old type 2 key: %v", err)
	}
	if err := pd.ForQP(qpB).InvalidateLocal(k4); err != nil {
		t.Fatal(err)
	}
	if _, err := w2.BindQP(qpB, mr, 0x10000, 64, AccessRemoteRead, 0xc5); err != nil {
		t.Fatal(err)
	}
	if err := w2.Invalidate(); err != nil {
		t.Fatal(err)
	}
	if err := w2.Invalidate(); !errors.Is(err, ErrNotBound) {
		t.Fatalf("invalidate unbound type 2: %v", err)
	}
	// Windows unbound: the region deregisters.
	if err := mr.Deregister(); err != nil {
		t.Fatalf("deregister after unbinding: %v", err)
	}
	if _, err := w1.Bind(mr, 0x10000, 16, AccessRemoteRead); !errors.Is(err, ErrClosed) {
		t.Fatalf("bind to deregistered region: %v", err)
	}
	// Dealloc makes the window key stale and frees the PD.
	kd := w2.RKey()
	if err := w2.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := w2.Dealloc(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second dealloc: %v", err)
	}
	if err := pd.CheckRemote(kd, 0x10000, 8, AccessRemoteRead); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("dealloc'd window key: %v", err)
	}
	fresh := mustMR(t, pd, alignedBuf(64), 0xa0000, allRights)
	if _, err := w2.BindQP(qpA, fresh, 0xa0000, 8, AccessRemoteRead, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("bind dealloc'd window: %v", err)
	}
	w1.Dealloc()
	plain.Deregister()
	fresh.Deregister()
	if err := pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if _, err := pd.RegisterMR(buf, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("register on dealloc'd PD: %v", err)
	}
	if _, err := pd.AllocMW(MWType1); !errors.Is(err, ErrClosed) {
		t.Fatalf("alloc MW on dealloc'd PD: %v", err)
	}
	if _, err := pd.AllocMW(3); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("alloc MW type 3: %v", err)
	}
}

// TestDeregisterWithDealloc: deallocating a bound window releases the region.
func TestDeregisterWithDealloc(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	mr := mustMR(t, pd, alignedBuf(64), 0x1000, allRights)
	w, _ := pd.AllocMW(MWType2)
	if _, err := w.BindQP(1, mr, 0x1000, 64, AccessRemoteRead, 7); err != nil {
		t.Fatal(err)
	}
	if err := mr.Deregister(); !errors.Is(err, ErrBusy) {
		t.Fatal(err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if u := tb.Usage(); u != (Usage{PDs: 1}) {
		t.Fatalf("usage %+v", u)
	}
}
