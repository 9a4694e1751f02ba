package memreg

import (
	"fmt"
	"sync"
)

// MWType is the memory window type.
type MWType uint8

// Memory window types (IBTA 10.6.7).
const (
	// MWType1 windows are bound by the consumer directly (ibv_bind_mw);
	// every bind (and unbind, a bind of length 0) gives a new key byte.
	// They cannot be invalidated.
	MWType1 MWType = 1
	// MWType2 windows are bound by a bind work request on a QP, which
	// chooses the key byte; the binding is usable only through that QP and
	// ends with a local invalidate or a SEND with Invalidate.
	MWType2 MWType = 2
)

// String returns "type1" or "type2".
func (t MWType) String() string {
	switch t {
	case MWType1:
		return "type1"
	case MWType2:
		return "type2"
	}
	return fmt.Sprintf("MWType(%d)", uint8(t))
}

// MW is a memory window: a remote key onto a sub-range of a memory region
// with its own remote rights. Window rkeys share the key space of regions.
// All methods are safe for concurrent use.
type MW struct {
	pd  *PD
	typ MWType
	idx uint32
	mu  sync.Mutex // serializes bind / invalidate / dealloc of this window
	// Written under mu and t.mu; read under either:
	cur  *entry // the slot's entry: a binding, or an unbound placeholder
	dead bool
}

// AllocMW allocates an unbound window of the given type (ErrLimit at MaxMW).
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("memreg: alloc MW: %w: window type %d", ErrInvalidArgument, typ)
	}
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.dead {
		return nil, fmt.Errorf("memreg: alloc MW: PD %w", ErrClosed)
	}
	if err := t.closedErr("alloc MW"); err != nil {
		return nil, err
	}
	if t.lim.MaxMW > 0 && t.usage.MWs >= t.lim.MaxMW {
		return nil, fmt.Errorf("memreg: alloc MW: %w: MaxMW=%d windows", ErrLimit, t.lim.MaxMW)
	}
	idx, key, err := t.allocIndex()
	if err != nil {
		return nil, fmt.Errorf("memreg: alloc MW: %w", err)
	}
	mw := &MW{pd: pd, typ: typ, idx: idx}
	mw.cur = mw.unboundEntry(key)
	t.slot(idx).Store(mw.cur)
	pd.nMW++
	t.usage.MWs++
	return mw, nil
}

func (mw *MW) kind() kind {
	if mw.typ == MWType2 {
		return kindMW2
	}
	return kindMW1
}

func (mw *MW) unboundEntry(key uint32) *entry {
	return &entry{key: key, kind: mw.kind(), unbound: true, qpn: anyQP, pd: mw.pd, mw: mw}
}

// RKey returns the window's current rkey.
func (mw *MW) RKey() uint32 {
	t := mw.pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	return mw.cur.key
}

// Type returns the window's type.
func (mw *MW) Type() MWType { return mw.typ }

// PD returns the window's protection domain.
func (mw *MW) PD() *PD { return mw.pd }

// Bound reports whether the window is bound to a region.
func (mw *MW) Bound() bool {
	t := mw.pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	return !mw.cur.unbound
}

// Bind binds a type 1 window to [addr, addr+length) of mr (addresses in
// mr's IOVA space) with the remote rights access, and returns the window's
// new rkey (index unchanged, key byte + 1, as ibv_bind_mw does). A length
// of 0 unbinds the window (mr may then be nil). Rules (IBTA / rxe
// rxe_check_bind_mw): the window and mr share the PD (ErrWrongPD); mr was
// registered with AccessMWBind (C10-73, ErrAccessDenied); access holds only
// remote rights, and remote write/atomic need mr's local write (C10-74,
// ErrInvalidAccessFlags); the range lies inside mr (C10-75, ErrOutOfBounds
// / ErrAddressWrap). Accesses through the old binding finish before Bind
// returns.
func (mw *MW) Bind(mr *MR, addr, length uint64, access Access) (rkey uint32, err error) {
	if mw.typ != MWType1 {
		return 0, mw.bindErr(mw.RKey(), addr, length, fmt.Errorf("%w: type 2 windows are bound with BindQP", ErrInvalidState))
	}
	return mw.bind(anyQP, mr, addr, length, access, 0, false)
}

// BindQP performs a bind work request for a type 2 window posted on QP
// qpn: the window must be unbound (o10-37.2.30, ErrInvalidState), length
// must be non-zero (o10-37.2.40, ErrInvalidArgument), keyByte is the
// consumer's new key byte; other rules as Bind. The binding is usable
// remotely only through ForQP(qpn) (the PD-level calls skip that check).
func (mw *MW) BindQP(qpn uint32, mr *MR, addr, length uint64, access Access, keyByte uint8) (rkey uint32, err error) {
	if mw.typ != MWType2 {
		return 0, mw.bindErr(mw.RKey(), addr, length, fmt.Errorf("%w: type 1 windows are bound with Bind", ErrInvalidState))
	}
	if length == 0 {
		return 0, mw.bindErr(mw.RKey(), addr, length, fmt.Errorf("%w: a type 2 bind needs a non-zero length", ErrInvalidArgument))
	}
	return mw.bind(qpn&0xffffff, mr, addr, length, access, keyByte, true)
}

// bindErr is a refused bind that the window is at fault for; key is the
// window's current rkey (mw.RKey(), or mw.cur.key under the table lock).
func (mw *MW) bindErr(key uint32, addr, length uint64, err error) error {
	return &AccessError{Op: OpBind, Key: key, VA: addr, Len: length, Err: err, Detail: "the window's rkey"}
}

// mrBindErr is a refused bind that the region mr is at fault for: the
// error names the region's lkey.
func mrBindErr(mr *MR, addr, length uint64, detail string, err error) error {
	d := "the region's lkey"
	if detail != "" {
		d += "; " + detail
	}
	return &AccessError{Op: OpBind, Key: mr.key, VA: addr, Len: length, Err: err, Detail: d}
}

func (mw *MW) bind(qpn uint32, mr *MR, addr, length uint64, access Access, keyByte uint8, setKey bool) (uint32, error) {
	if length != 0 {
		if mr == nil {
			return 0, mw.bindErr(mw.RKey(), addr, length, fmt.Errorf("%w: nil region", ErrInvalidArgument))
		}
		if access&^accessRemote != 0 {
			return 0, mw.bindErr(mw.RKey(), addr, length, fmt.Errorf("%w: a window carries only remote rights, not %v", ErrInvalidAccessFlags, access&^accessRemote))
		}
		if mr.pd != mw.pd {
			return 0, mrBindErr(mr, addr, length, "", ErrWrongPD)
		}
		if mr.access&AccessMWBind == 0 {
			return 0, mrBindErr(mr, addr, length, fmt.Sprintf("region grants %v, binding needs MW_BIND", mr.access), ErrAccessDenied)
		}
		if access&accessNeedsLocalWrite != 0 && mr.access&AccessLocalWrite == 0 {
			return 0, mrBindErr(mr, addr, length, "", fmt.Errorf("%w: a window with remote write/atomic needs a region with local write", ErrInvalidAccessFlags))
		}
		last := addr + length - 1
		if last < addr {
			return 0, mw.bindErr(mw.RKey(), addr, length, ErrAddressWrap)
		}
		if addr < mr.e.start || last > mr.e.last {
			return 0, mrBindErr(mr, addr, length, fmt.Sprintf("region covers [%#x, %#x]", mr.e.start, mr.e.last), ErrOutOfBounds)
		}
	}

	mw.mu.Lock()
	defer mw.mu.Unlock()
	t := mw.pd.t
	t.mu.Lock()
	switch {
	case mw.dead:
		t.mu.Unlock()
		return 0, mw.bindErr(mw.cur.key, addr, length, fmt.Errorf("window %w", ErrClosed))
	case length != 0 && mr.dead:
		t.mu.Unlock()
		return 0, mrBindErr(mr, addr, length, "", fmt.Errorf("region %w", ErrClosed))
	case length != 0 && t.closed: // unbinding gives back, and is allowed
		err := t.closedCause()
		t.mu.Unlock()
		return 0, mw.bindErr(mw.cur.key, addr, length, err)
	case setKey && !mw.cur.unbound:
		t.mu.Unlock()
		return 0, mw.bindErr(mw.cur.key, addr, length, fmt.Errorf("%w: type 2 window is already bound", ErrInvalidState))
	}
	var key uint32
	if setKey {
		key = t.setKeyByte(mw.idx, keyByte)
	} else {
		key = t.bumpKey(mw.idx)
	}
	var ne *entry
	if length == 0 {
		ne = mw.unboundEntry(key)
	} else {
		off := addr - mr.e.start
		if mw.typ == MWType1 {
			qpn = anyQP
		}
		ne = &entry{
			key:    key,
			kind:   mw.kind(),
			access: access,
			qpn:    qpn,
			pd:     mw.pd,
			start:  addr,
			last:   addr + length - 1,
			mem:    mr.e.mem[off : off+length : off+length],
			mr:     mr,
			mw:     mw,
		}
		mr.windows++
	}
	old := mw.replace(ne)
	t.mu.Unlock()
	mw.retire(old)
	return key, nil
}

// replace publishes ne as the window's entry and stops accesses through
// the old one. Called with mw.mu and t.mu held.
func (mw *MW) replace(ne *entry) *entry {
	old := mw.cur
	old.kill()
	mw.cur = ne
	mw.pd.t.slot(mw.idx).Store(ne)
	return old
}

// retire waits for accesses through an old entry to finish, then releases
// its hold on the region. Called with mw.mu held, t.mu not held.
func (mw *MW) retire(old *entry) {
	old.drain()
	if old.mr != nil {
		t := mw.pd.t
		t.mu.Lock()
		old.mr.windows--
		t.mu.Unlock()
	}
}

// invalidate ends the binding of a type 2 window named by rkey.
func (mw *MW) invalidate(op Op, rkey uint32, qpn uint32) error {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	t := mw.pd.t
	t.mu.Lock()
	cur := mw.cur
	var err error
	switch {
	case mw.dead || cur.key != rkey:
		err = ErrStaleKey
	case mw.typ == MWType1:
		err = fmt.Errorf("%w: type 1 windows cannot be invalidated (o10-37.2.26)", ErrInvalidState)
	case cur.unbound:
		err = ErrNotBound
	case qpn != anyQP && cur.qpn != qpn:
		err = ErrWrongQP
	}
	if err != nil {
		t.mu.Unlock()
		return accessErr(op, rkey, 0, 0, err, cur, 0)
	}
	old := mw.replace(mw.unboundEntry(rkey))
	t.mu.Unlock()
	mw.retire(old)
	return nil
}

// Invalidate performs a local invalidate of a bound type 2 window: the
// binding ends (the rkey keeps its value but no longer grants access) and
// accesses through it finish before Invalidate returns.
func (mw *MW) Invalidate() error {
	t := mw.pd.t
	t.mu.Lock()
	key := mw.cur.key
	t.mu.Unlock()
	return mw.invalidate(OpInvalidateLocal, key, anyQP)
}

// Dealloc frees the window (bound or not); accesses through it finish
// before Dealloc returns and its key becomes stale.
func (mw *MW) Dealloc() error {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	t := mw.pd.t
	t.mu.Lock()
	if mw.dead {
		t.mu.Unlock()
		return fmt.Errorf("memreg: dealloc MW: %w", ErrClosed)
	}
	mw.dead = true
	old := mw.cur
	old.kill()
	t.slot(mw.idx).Store(nil)
	t.freeIndex(mw.idx)
	mw.pd.nMW--
	mw.pd.idleLocked()
	t.usage.MWs--
	t.mu.Unlock()
	mw.retire(old)
	return nil
}

// invalidateKey finds the window an invalidate names and invalidates it.
func (v QPView) invalidateKey(op Op, rkey uint32) error {
	e := v.pd.t.lookup(rkey)
	var err error
	switch {
	case e == nil:
		err = v.pd.t.missErr(rkey)
	case e.key != rkey:
		err = ErrStaleKey
	case e.pd != v.pd:
		err = ErrWrongPD
	case e.kind == kindMR:
		err = fmt.Errorf("%w: %#08x is a memory region; only type 2 windows can be invalidated", ErrKeyType, rkey)
	}
	if err != nil {
		return accessErr(op, rkey, 0, 0, err, e, 0)
	}
	return e.mw.invalidate(op, rkey, v.qpn)
}

// InvalidateRemote executes the invalidate carried by a SEND with
// Invalidate arriving on this QP: rkey must name a bound type 2 window of
// the PD that is bound to this QP. Every failure maps to NAK Invalid
// Request (see NAKCode).
func (v QPView) InvalidateRemote(rkey uint32) error { return v.invalidateKey(OpInvalidateRemote, rkey) }

// InvalidateLocal executes a local invalidate work request posted on this
// QP for rkey (a bound type 2 window of the PD).
func (v QPView) InvalidateLocal(rkey uint32) error { return v.invalidateKey(OpInvalidateLocal, rkey) }

// InvalidateRemote executes a SEND with Invalidate's invalidate of rkey;
// like QPView.InvalidateRemote but without checking which QP the window
// is bound to.
func (pd *PD) InvalidateRemote(rkey uint32) error { return pd.any().InvalidateRemote(rkey) }

// InvalidateLocal invalidates the type 2 window rkey of the PD, without
// checking which QP it is bound to.
func (pd *PD) InvalidateLocal(rkey uint32) error { return pd.any().InvalidateLocal(rkey) }
