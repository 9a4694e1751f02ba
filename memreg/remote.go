package memreg

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// QPView performs the remote-facing operations on behalf of one QP. It
// adds the one check the PD-level methods cannot make: a type 2 memory
// window is usable only through the QP it is bound to. The PD-level
// methods (pd.CheckRemote, ...) are the same calls without that check.
// A QPView is a small value; its methods are safe for concurrent use.
type QPView struct {
	pd  *PD
	qpn uint32
}

// ForQP returns the remote-facing operations as seen by QP qpn (24 bits).
func (pd *PD) ForQP(qpn uint32) QPView { return QPView{pd: pd, qpn: qpn & 0xffffff} }

func (pd *PD) any() QPView { return QPView{pd: pd, qpn: anyQP} }

// resolveRemote finds the registration a remote access (key, va, n>0, acc)
// may use and returns it with the byte offset of va in its memory. It does
// not pin. The error is a bare sentinel (no allocation); e is returned when
// known, for the error's detail.
func (v QPView) resolveRemote(key uint32, va, n uint64, acc Access) (*entry, uint64, error) {
	if n > maxDMALen {
		return nil, 0, ErrLength
	}
	e := v.pd.t.lookup(key)
	switch {
	case e == nil:
		return nil, 0, v.pd.t.missErr(key)
	case e.key != key:
		return nil, 0, ErrStaleKey
	case e.pd != v.pd:
		return nil, 0, ErrWrongPD
	case e.unbound:
		return e, 0, ErrNotBound
	case e.kind == kindMW2 && v.qpn != anyQP && e.qpn != v.qpn:
		return e, 0, ErrWrongQP
	case e.access&acc != acc:
		return e, 0, ErrAccessDenied
	}
	last := va + n - 1
	if last < va {
		return e, 0, ErrAddressWrap
	}
	if va < e.start || last > e.last {
		return e, 0, ErrOutOfBounds
	}
	return e, va - e.start, nil
}

// accessErr wraps a sentinel into an *AccessError with a useful detail.
//
//go:noinline
func accessErr(op Op, key uint32, va, n uint64, err error, e *entry, need Access) error {
	ae := &AccessError{Op: op, Key: key, VA: va, Len: n, Err: err}
	switch err {
	case ErrAccessDenied:
		if e != nil {
			ae.Detail = fmt.Sprintf("needs %v, key grants %v", need, e.access)
		}
	case ErrOutOfBounds:
		if e != nil {
			ae.Detail = fmt.Sprintf("key covers [%#x, %#x]", e.start, e.last)
		}
	case ErrWrongQP:
		if e != nil {
			ae.Detail = fmt.Sprintf("window bound to QP %#x", e.qpn)
		}
	case ErrLength:
		if op.local() {
			ae.Detail = "beyond the end of the scatter/gather list"
		} else {
			ae.Detail = "DMA length above 2^31"
		}
	case ErrStaleKey:
		if e != nil {
			ae.Detail = "registration released during the access"
		}
	}
	return ae
}

func checkRemoteFlags(op Op, key uint32, va, n uint64, acc Access) error {
	if acc == 0 || acc&^accessRemote != 0 {
		return &AccessError{Op: op, Key: key, VA: va, Len: n,
			Err: fmt.Errorf("%w: %v is not a set of remote rights", ErrInvalidAccessFlags, acc)}
	}
	return nil
}

// CheckRemote checks a remote access of length bytes at va through rkey
// needing the remote rights acc (AccessRemoteWrite, AccessRemoteRead,
// AccessRemoteAtomic, or a union). A zero length is valid and checks no
// key (IBTA: the R_Key is not validated when the DMA length is 0). The
// checks run in rxe's order: length (<= 2^31), key, PD, window state/QP,
// rights, wrap, bounds. CheckRemote does not check atomic alignment.
func (v QPView) CheckRemote(rkey uint32, va uint64, length uint32, acc Access) error {
	if acc != 0 && acc&^accessRemote == 0 && v.pd.t.lookup(rkey).fast(v.pd, v.qpn, rkey, va, uint64(length), acc) {
		return nil
	}
	return v.checkSlow(rkey, va, length, acc)
}

func (v QPView) checkSlow(rkey uint32, va uint64, length uint32, acc Access) error {
	if err := checkRemoteFlags(OpCheck, rkey, va, uint64(length), acc); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	if e, _, err := v.resolveRemote(rkey, va, uint64(length), acc); err != nil {
		return accessErr(OpCheck, rkey, va, uint64(length), err, e, acc)
	}
	return nil
}

// fast reports whether entry e passes every remote check for (key, va,
// n, acc) seen from QP qpn. It is the lock-free hot path; on false the
// slow path (resolveRemote) finds the rule that failed. n == 0 and
// unbound windows (access 0) always take the slow path.
func (e *entry) fast(pd *PD, qpn, key uint32, va, n uint64, acc Access) bool {
	last := va + n - 1
	return e != nil && e.key == key && e.pd == pd && e.access&acc == acc &&
		(e.qpn == anyQP || e.qpn == qpn || qpn == anyQP) &&
		n-1 < maxDMALen && va >= e.start && last <= e.last && last >= va
}

// WriteRemote places data at va through rkey (RDMA WRITE); it needs
// AccessRemoteWrite. The copy runs while the registration is pinned, so it
// either completes before a concurrent Deregister returns or does not start.
func (v QPView) WriteRemote(rkey uint32, va uint64, data []byte) error {
	n := uint64(len(data))
	if e := v.pd.t.lookup(rkey); e.fast(v.pd, v.qpn, rkey, va, n, AccessRemoteWrite) {
		// Address the copy before pinning: loads after the locked add
		// wait for it, loads before it overlap the previous copy's drain.
		off := va - e.start
		dst := e.mem[off : off+n]
		if e.pin() {
			copy(dst, data)
			e.unpin()
			return nil
		}
	}
	return v.writeSlow(rkey, va, data)
}

// writeSlow and readSlow stay separate, not inlined, so that the hot
// functions compile to the same code as when each had its own slow path.
//
//go:noinline
func (v QPView) writeSlow(rkey uint32, va uint64, data []byte) error {
	return v.moveSlow(OpWrite, rkey, va, data, AccessRemoteWrite)
}

// ReadRemote copies len(dst) bytes at va through rkey into dst (RDMA READ
// response data); it needs AccessRemoteRead.
func (v QPView) ReadRemote(rkey uint32, va uint64, dst []byte) error {
	n := uint64(len(dst))
	if e := v.pd.t.lookup(rkey); e.fast(v.pd, v.qpn, rkey, va, n, AccessRemoteRead) {
		off := va - e.start
		src := e.mem[off : off+n]
		if e.pin() {
			copy(dst, src)
			e.unpin()
			return nil
		}
	}
	return v.readSlow(rkey, va, dst)
}

// ReadView is ReadRemote without the copy, for a zero-copy READ
// response: it makes ReadRemote's checks for the n > 0 bytes at va
// through rkey and returns them as a slice of the registered memory
// itself, with the Hold that guards the later read (see PD.GatherView).
func (v QPView) ReadView(rkey uint32, va uint64, n int) ([]byte, *Hold, error) {
	if n <= 0 {
		return nil, nil, nil
	}
	e, mem, err := v.pinRemote(OpRead, rkey, va, uint64(n), AccessRemoteRead, 0)
	if err != nil {
		return nil, nil, err
	}
	e.unpin()
	return mem[:n:n], (*Hold)(e), nil
}

//go:noinline
func (v QPView) readSlow(rkey uint32, va uint64, dst []byte) error {
	return v.moveSlow(OpRead, rkey, va, dst, AccessRemoteRead)
}

// moveSlow is the checked path of WriteRemote (op OpWrite: buf into
// memory) and ReadRemote (op OpRead: memory into buf).
func (v QPView) moveSlow(op Op, rkey uint32, va uint64, buf []byte, acc Access) error {
	if len(buf) == 0 {
		return nil
	}
	e, mem, err := v.pinRemote(op, rkey, va, uint64(len(buf)), acc, 0)
	if err != nil {
		return err
	}
	if op == OpWrite {
		copy(mem, buf)
	} else {
		copy(buf, mem)
	}
	e.unpin()
	return nil
}

// pinRemote runs every check of a remote access (key, va, n>0, acc), then
// requires va&alignMask == 0 (ErrMisaligned), and pins the registration.
// It returns the pinned entry and the n bytes of memory at va; the error
// is an *AccessError for op. The caller unpins.
func (v QPView) pinRemote(op Op, rkey uint32, va, n uint64, acc Access, alignMask uint64) (*entry, []byte, error) {
	e, off, err := v.resolveRemote(rkey, va, n, acc)
	if err == nil && va&alignMask != 0 {
		err = ErrMisaligned
	}
	if err != nil {
		return nil, nil, accessErr(op, rkey, va, n, err, e, acc)
	}
	if !e.pin() {
		return nil, nil, accessErr(op, rkey, va, n, ErrStaleKey, e, 0)
	}
	return e, e.mem[off : off+n : off+n], nil
}

// atomicTarget resolves and pins the 8 bytes an atomic works on.
func (v QPView) atomicTarget(op Op, rkey uint32, va uint64) (*entry, []byte, error) {
	if e := v.pd.t.lookup(rkey); e.fast(v.pd, v.qpn, rkey, va, 8, AccessRemoteAtomic) && va&7 == 0 && e.pin() {
		off := va - e.start
		return e, e.mem[off : off+8 : off+8], nil
	}
	return v.pinRemote(op, rkey, va, 8, AccessRemoteAtomic, 7)
}

// atomicStripes serialize atomics on host addresses that are not 8-byte
// aligned (possible only when a custom IOVA is congruent to 0 mod 8 while
// the host address is not). Every atomic on such an address takes the same
// stripe, so they stay atomic with respect to each other.
var atomicStripes [64]struct {
	sync.Mutex
	_ [56]byte
}

func stripe(p unsafe.Pointer) *sync.Mutex { return &atomicStripes[(uintptr(p)>>3)%64].Mutex }

// CompareSwap is the responder side of an ATOMIC CmpSwap: if the 8 bytes
// at va equal compare they are replaced by swap; the original value is
// returned either way. It needs AccessRemoteAtomic and an 8-byte aligned
// va (ErrMisaligned). Memory is read and written in host byte order;
// compare and swap are host values (the caller decodes the big-endian
// AtomicETH fields). Atomic with respect to every other CompareSwap and
// FetchAdd on the same memory.
func (v QPView) CompareSwap(rkey uint32, va uint64, compare, swap uint64) (orig uint64, err error) {
	e, b, err := v.atomicTarget(OpCompareSwap, rkey, va)
	if err != nil {
		return 0, err
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)&7 == 0 {
		w := (*uint64)(p)
		for {
			orig = atomic.LoadUint64(w)
			if orig != compare || atomic.CompareAndSwapUint64(w, orig, swap) {
				break
			}
		}
	} else {
		mu := stripe(p)
		mu.Lock()
		orig = binary.NativeEndian.Uint64(b)
		if orig == compare {
			binary.NativeEndian.PutUint64(b, swap)
		}
		mu.Unlock()
	}
	e.unpin()
	return orig, nil
}

// FetchAdd is the responder side of an ATOMIC FetchAdd: it adds add
// (modulo 2^64) to the 8 bytes at va and returns their original value.
// Same rules as CompareSwap.
func (v QPView) FetchAdd(rkey uint32, va uint64, add uint64) (orig uint64, err error) {
	e, b, err := v.atomicTarget(OpFetchAdd, rkey, va)
	if err != nil {
		return 0, err
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)&7 == 0 {
		orig = atomic.AddUint64((*uint64)(p), add) - add
	} else {
		mu := stripe(p)
		mu.Lock()
		orig = binary.NativeEndian.Uint64(b)
		binary.NativeEndian.PutUint64(b, orig+add)
		mu.Unlock()
	}
	e.unpin()
	return orig, nil
}

// Target is the result of a successful remote access check: the place
// where a multi-packet RDMA WRITE lands or an RDMA READ is served from.
// It holds no pin: each Write/Read pins the registration again and fails
// with ErrStaleKey once the registration (or window binding) is gone.
// The zero Target (from a zero-length Lookup) has length 0. A Target is
// a value; its methods are safe for concurrent use.
//
// Target is five machine words so that a Write or Read call (target,
// offset and slice) passes all its arguments in registers (amd64: nine).
type Target struct {
	e   *entry
	off uint64 // offset of the target's first byte in e.mem; its VA when e is nil
	n   uint32 // length checked; at most 2^31
	acc Access
	key uint32
}

// Lookup checks a remote access like CheckRemote and returns its target.
func (v QPView) Lookup(rkey uint32, va uint64, length uint32, acc Access) (Target, error) {
	n := uint64(length)
	if err := checkRemoteFlags(OpCheck, rkey, va, n, acc); err != nil {
		return Target{}, err
	}
	if n == 0 {
		return Target{off: va, key: rkey, acc: acc}, nil
	}
	e, off, err := v.resolveRemote(rkey, va, n, acc)
	if err != nil {
		return Target{}, accessErr(OpCheck, rkey, va, n, err, e, acc)
	}
	return Target{e: e, off: off, n: length, acc: acc, key: rkey}, nil
}

// Len returns the length the target was checked for.
func (t Target) Len() uint64 { return uint64(t.n) }

// VA returns the address the target starts at.
func (t Target) VA() uint64 {
	if t.e == nil {
		return t.off
	}
	return t.e.start + t.off
}

// Write places p at byte offset off of the target (off is relative to the
// VA it was looked up with). The target must have been looked up with
// AccessRemoteWrite, and [off, off+len(p)) must lie inside it.
func (t Target) Write(off uint64, p []byte) error {
	// The hot path: all checks in one condition (1 <= n <= t.n implies a
	// non-zero target, so e is set), the copy addressed before the pin,
	// one call (the copy) and only e needed after it. Zero lengths and
	// every failure go to writeSlow, which finds the rule that failed.
	n := uint64(len(p))
	if e := t.e; t.acc&AccessRemoteWrite != 0 && n-1 < uint64(t.n) && off <= uint64(t.n)-n {
		s := t.off + off
		dst := e.mem[s : s+n]
		if e.pin() {
			copy(dst, p)
			e.unpin()
			return nil
		}
	}
	return t.writeSlow(off, p)
}

// writeSlow and readSlow: see QPView.writeSlow.
//
//go:noinline
func (t Target) writeSlow(off uint64, p []byte) error {
	return t.moveSlow(OpWrite, off, p, AccessRemoteWrite)
}

// WriteV places the payloads back to back starting at byte offset off of
// the target (the consecutive packets of a multi-packet WRITE received in
// one batch) under a single pin: one pair of atomic operations for the
// whole batch instead of one per packet. All of [off, off+total) must lie
// inside the target; nothing is placed otherwise.
func (t Target) WriteV(off uint64, payloads [][]byte) error {
	var n uint64
	for _, p := range payloads {
		n += uint64(len(p))
	}
	if n == 0 {
		return nil
	}
	if err := t.pin(OpWrite, off, n, AccessRemoteWrite); err != nil {
		return err
	}
	s := t.off + off
	for _, p := range payloads {
		s += uint64(copy(t.e.mem[s:s+uint64(len(p))], p))
	}
	t.e.unpin()
	return nil
}

// Read copies len(dst) bytes at byte offset off of the target into dst.
// The target must have been looked up with AccessRemoteRead.
func (t Target) Read(off uint64, dst []byte) error {
	// Laid out like Write.
	n := uint64(len(dst))
	if e := t.e; t.acc&AccessRemoteRead != 0 && n-1 < uint64(t.n) && off <= uint64(t.n)-n {
		s := t.off + off
		src := e.mem[s : s+n]
		if e.pin() {
			copy(dst, src)
			e.unpin()
			return nil
		}
	}
	return t.readSlow(off, dst)
}

//go:noinline
func (t Target) readSlow(off uint64, dst []byte) error {
	return t.moveSlow(OpRead, off, dst, AccessRemoteRead)
}

// moveSlow is the checked path of Write (op OpWrite: buf into memory) and
// Read (op OpRead: memory into buf).
func (t Target) moveSlow(op Op, off uint64, buf []byte, need Access) error {
	n := uint64(len(buf))
	if n == 0 {
		return nil
	}
	if err := t.pin(op, off, n, need); err != nil {
		return err
	}
	s := t.off + off
	if op == OpWrite {
		copy(t.e.mem[s:s+n], buf)
	} else {
		copy(buf, t.e.mem[s:s+n])
	}
	t.e.unpin()
	return nil
}

// pin checks that the target grants need and that [off, off+n), n > 0,
// lies inside it, then pins its registration (ErrStaleKey once that is
// gone). On nil the caller unpins t.e.
func (t Target) pin(op Op, off, n uint64, need Access) error {
	if err := t.check(op, off, n, need); err != nil {
		return err
	}
	if !t.e.pin() {
		return accessErr(op, t.key, t.VA()+off, n, ErrStaleKey, t.e, 0)
	}
	return nil
}

// check checks that the target grants need and that [off, off+n), n > 0,
// lies inside it (then t.e is set).
func (t Target) check(op Op, off, n uint64, need Access) error {
	if t.acc&need != need {
		return accessErr(op, t.key, t.VA()+off, n, ErrAccessDenied, t.e, need)
	}
	if tn := uint64(t.n); off > tn || n > tn-off {
		return &AccessError{Op: op, Key: t.key, VA: t.VA() + off, Len: n, Err: ErrOutOfBounds,
			Detail: fmt.Sprintf("target is %d bytes at %#x", tn, t.VA())}
	}
	return nil
}

// The PD-level remote calls: the same as through ForQP, without the type 2
// window QP check (the PD does not know which QP a request arrived on).

// CheckRemote checks a remote access; see QPView.CheckRemote.
func (pd *PD) CheckRemote(rkey uint32, va uint64, length uint32, acc Access) error {
	return pd.any().CheckRemote(rkey, va, length, acc)
}

// WriteRemote places data at va through rkey; see QPView.WriteRemote.
func (pd *PD) WriteRemote(rkey uint32, va uint64, data []byte) error {
	return pd.any().WriteRemote(rkey, va, data)
}

// ReadRemote copies out of memory at va through rkey; see QPView.ReadRemote.
func (pd *PD) ReadRemote(rkey uint32, va uint64, dst []byte) error {
	return pd.any().ReadRemote(rkey, va, dst)
}

// CompareSwap runs an atomic compare-and-swap; see QPView.CompareSwap.
func (pd *PD) CompareSwap(rkey uint32, va uint64, compare, swap uint64) (orig uint64, err error) {
	return pd.any().CompareSwap(rkey, va, compare, swap)
}

// FetchAdd runs an atomic fetch-and-add; see QPView.FetchAdd.
func (pd *PD) FetchAdd(rkey uint32, va uint64, add uint64) (orig uint64, err error) {
	return pd.any().FetchAdd(rkey, va, add)
}

// Lookup checks a remote access and returns its target; see QPView.Lookup.
func (pd *PD) Lookup(rkey uint32, va uint64, length uint32, acc Access) (Target, error) {
	return pd.any().Lookup(rkey, va, length, acc)
}
