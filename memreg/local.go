package memreg

import "fmt"

// SGE is one element of a local scatter/gather list, as in ibv_sge: Addr
// is an address in the IOVA space of the region named by LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// resolveLocal finds the region an SGE piece (addr, n>0) may use with the
// local rights acc (0 = read, or AccessLocalWrite).
func (pd *PD) resolveLocal(key uint32, addr, n uint64, acc Access) (*entry, uint64, error) {
	e := pd.t.lookup(key)
	switch {
	case e == nil:
		return nil, 0, pd.t.missErr(key)
	case e.key != key:
		return nil, 0, ErrStaleKey
	case e.pd != pd:
		return nil, 0, ErrWrongPD
	case e.kind != kindMR:
		return e, 0, ErrKeyType
	case e.access&acc != acc:
		return e, 0, ErrAccessDenied
	}
	last := addr + n - 1
	if last < addr {
		return e, 0, ErrAddressWrap
	}
	if addr < e.start || last > e.last {
		return e, 0, ErrOutOfBounds
	}
	return e, addr - e.start, nil
}

// checkLocalFlags refuses rights other than local ones; small enough to
// be inlined, the error built out of line.
func checkLocalFlags(op Op, acc Access) error {
	if acc&^AccessLocalWrite != 0 {
		return localFlagsErr(op, acc)
	}
	return nil
}

func localFlagsErr(op Op, acc Access) error {
	return &AccessError{Op: op, Err: fmt.Errorf("%w: %v is not a local right", ErrInvalidAccessFlags, acc)}
}

// CheckSGEs checks every element of a scatter/gather list against its
// lkey: the key is live, of this PD, names a memory region (not a window),
// grants acc (0 for a gather source, AccessLocalWrite for a receive buffer
// or a READ/atomic destination), and the element lies inside the region.
// Zero-length elements are skipped, as zero-length accesses check no key.
// It returns the list's total length.
func (pd *PD) CheckSGEs(sges []SGE, acc Access) (total uint64, err error) {
	if err := checkLocalFlags(OpCheckSGE, acc); err != nil {
		return 0, err
	}
	for i := range sges {
		s := &sges[i]
		if s.Length == 0 {
			continue
		}
		if e, _, err := pd.resolveLocal(s.LKey, s.Addr, uint64(s.Length), acc); err != nil {
			return 0, accessErr(OpCheckSGE, s.LKey, s.Addr, uint64(s.Length), err, e, acc)
		}
		total += uint64(s.Length)
	}
	return total, nil
}

// Gather copies len(dst) bytes out of local memory, starting at byte
// offset of the concatenated list (local read needs no flag). It fails
// with ErrLength when the list is shorter than offset+len(dst).
func (pd *PD) Gather(sges []SGE, offset uint64, dst []byte) error {
	return pd.move(OpGather, sges, offset, dst, 0, nil, nil)
}

// Scatter places src into local memory at byte offset of the concatenated
// list (a receive buffer for SEND, the destination of an RDMA READ); every
// region written needs AccessLocalWrite. It fails with ErrLength when src
// does not fit. Each element's copy happens under its region's pin; if an
// element fails its check, the bytes before it have been placed (as a NIC
// would have) and the error names the element.
func (pd *PD) Scatter(sges []SGE, offset uint64, src []byte) error {
	return pd.move(OpScatter, sges, offset, src, AccessLocalWrite, nil, nil)
}

// move copies between buf and the list at offset: Scatter (op OpScatter,
// buf into memory) and Gather (OpGather, memory into buf). With sl set
// (OpScatter only, ps non-nil) each region is held in ps instead of being
// pinned per element, and the last element written is remembered in sl.
func (pd *PD) move(op Op, sges []SGE, offset uint64, buf []byte, acc Access, ps *Pins, sl *ScatterList) error {
	n := uint64(len(buf))
	if n == 0 {
		return nil
	}
	if len(sges) == 1 {
		// A list of one element (a small message's usual case): no
		// walk to total the list and to find the element at offset.
		s := &sges[0]
		if l := uint64(s.Length); offset <= l && n <= l-offset {
			return pd.moveOne(op, s, s.Addr+offset, buf, acc, ps, sl, 0)
		}
	}
	var total uint64
	for i := range sges {
		total += uint64(sges[i].Length)
	}
	if offset > total || n > total-offset {
		return &AccessError{Op: op, VA: offset, Len: n, Err: ErrLength,
			Detail: fmt.Sprintf("list holds %d bytes", total)}
	}
	skip := offset
	for i := range sges {
		s := &sges[i]
		l := uint64(s.Length)
		if skip >= l {
			skip -= l
			continue
		}
		chunk := min(l-skip, uint64(len(buf)))
		addr := s.Addr + skip
		skip = 0
		if err := pd.moveOne(op, s, addr, buf[:chunk], acc, ps, sl, offset+n-uint64(len(buf))-(addr-s.Addr)); err != nil {
			return err
		}
		buf = buf[chunk:]
		if len(buf) == 0 {
			return nil
		}
	}
	return nil
}

// moveOne is move's copy between buf and element s of the list at addr
// (inside s; the element starts at byte start of the list).
func (pd *PD) moveOne(op Op, s *SGE, addr uint64, buf []byte, acc Access, ps *Pins, sl *ScatterList, start uint64) error {
	chunk := uint64(len(buf))
	e, off, err := pd.resolveLocal(s.LKey, addr, chunk, acc)
	if err != nil {
		return accessErr(op, s.LKey, addr, chunk, err, e, acc)
	}
	if sl != nil {
		if !ps.hold(e) {
			return accessErr(op, s.LKey, addr, chunk, ErrStaleKey, e, 0)
		}
		copy(e.mem[off:off+chunk], buf)
		sl.remember(ps, e, s, start)
		return nil
	}
	if !e.pin() {
		return accessErr(op, s.LKey, addr, chunk, ErrStaleKey, e, 0)
	}
	if op == OpScatter {
		copy(e.mem[off:off+chunk], buf)
	} else {
		copy(buf, e.mem[off:off+chunk])
	}
	e.unpin()
	return nil
}

// GatherView is Gather without the copy, for a zero-copy send: it returns
// the n bytes at byte offset of the concatenated list as a slice of the
// registered memory itself, when they lie inside one element (all nil
// when they span elements: the caller gathers them with Gather). The
// checks and errors are Gather's, made now; the slice is read later (by
// the link, when the packet leaves), so the verbs rule applies: the
// memory must not change until the work request that reads it has
// completed. The sender reads the slice only between the returned Hold's
// Acquire and Release, so a Deregister (which waits for such reads, and
// makes later Acquires fail) is safe at any time, memory from mmap
// included: once it returns nothing reads the view.
func (pd *PD) GatherView(sges []SGE, offset uint64, n int) ([]byte, *Hold, error) {
	if n <= 0 {
		return nil, nil, nil
	}
	skip := offset
	for i := range sges {
		s := &sges[i]
		l := uint64(s.Length)
		if skip >= l {
			skip -= l
			continue
		}
		if l-skip < uint64(n) {
			return nil, nil, nil // spans elements (or runs past the list: Gather says so)
		}
		addr := s.Addr + skip
		e, off, err := pd.resolveLocal(s.LKey, addr, uint64(n), 0)
		if err != nil {
			return nil, nil, accessErr(OpGather, s.LKey, addr, uint64(n), err, e, 0)
		}
		if !e.pin() {
			return nil, nil, accessErr(OpGather, s.LKey, addr, uint64(n), ErrStaleKey, e, 0)
		}
		e.unpin()
		end := off + uint64(n)
		return e.mem[off:end:end], (*Hold)(e), nil
	}
	return nil, nil, nil
}

// Hold guards the memory of a zero-copy view (PD.GatherView,
// QPView.ReadView) between the check that made the view and the send that
// reads it, which may come much later (a packet queued behind others, a
// paced QP): the sender calls Acquire right before it reads the view and
// Release once it is done (its Link.Send returned). Acquire pins the
// registration — the MR, or the memory window the view was taken
// through — as every other access does, and fails once Deregister (or
// the window's unbind, invalidation or dealloc) has begun; that call then
// waits for the Release of every Acquire that succeeded. So no view is
// read after Deregister returns, whether its packet was queued before or
// not: a sender that cannot Acquire drops the packet instead.
type Hold entry

// Acquire pins the view's registration for a read; false means it is
// gone (the view must not be read).
func (h *Hold) Acquire() bool { return (*entry)(h).pin() }

// Release ends a read started by a successful Acquire.
func (h *Hold) Release() { (*entry)(h).unpin() }

// Ref is the registration a scatter/gather list of one element was
// checked against (CheckSGEsRef), kept with the work request so that the
// copy made later (GatherRef, ScatterList.InitRef) need not look the lkey up
// again. A Ref is a hint, never trusted: it is used only if it is the
// region the element's lkey names, of this PD, granting the rights the
// copy needs, with the element inside it — and, as every access, only
// under a pin, which fails once Deregister has begun. Registrations never
// change after they are made: re-registering memory (Deregister, then
// RegisterMR) makes a new one under a new key, and a local SGE never
// names a window. So a copy through a Ref fails exactly when the lookup
// would have failed; it then takes the lookup's path, with its errors.
type Ref entry

// covers reports whether e is the region element s's lkey names, of pd,
// granting acc, with s (non-empty) inside it.
func (e *entry) covers(pd *PD, s *SGE, acc Access) bool {
	last := s.Addr + uint64(s.Length) - 1
	return e.key == s.LKey && e.pd == pd && e.kind == kindMR && e.access&acc == acc &&
		s.Length != 0 && last >= s.Addr && s.Addr >= e.start && last <= e.last
}

// CheckSGE is CheckSGEsRef's usual case, for posting: it returns the
// region element s's lkey names when s is non-empty and passes every
// check CheckSGEs makes (a live key of pd naming a memory region that
// grants acc, a local right, with s inside it), and nil otherwise — the
// caller then calls CheckSGEsRef (or CheckSGEs), which says why. It
// makes no call and builds no error, so that a post of a valid element
// costs a key lookup and a few comparisons.
func (pd *PD) CheckSGE(s *SGE, acc Access) *Ref {
	e := pd.t.lookup(s.LKey)
	if e == nil || e.key != s.LKey || e.pd != pd || e.kind != kindMR || e.access&acc != acc || acc&^AccessLocalWrite != 0 {
		return nil
	}
	// Inside [start, last] with a non-zero length, without wrapping:
	// off is below the region's length n exactly when start <= Addr
	// (a region never wraps the address space, so Addr < start makes
	// off wrap to at least n), and Length <= n-off exactly when the
	// element's last byte is at or below last.
	off, n := s.Addr-e.start, uint64(len(e.mem))
	if s.Length == 0 || off >= n || uint64(s.Length) > n-off {
		return nil
	}
	return (*Ref)(e)
}

// CheckSGEsRef is CheckSGEs that also returns, for a list of one
// non-empty element that passes, the region it was checked against (nil
// for any other list).
func (pd *PD) CheckSGEsRef(sges []SGE, acc Access) (total uint64, r *Ref, err error) {
	if len(sges) == 1 && sges[0].Length != 0 && acc&^AccessLocalWrite == 0 {
		s := &sges[0]
		// What resolveLocal checks, without its call and its error's
		// classification, which only a list that fails needs.
		if r := pd.CheckSGE(s, acc); r != nil {
			return uint64(s.Length), r, nil
		}
		e, _, err := pd.resolveLocal(s.LKey, s.Addr, uint64(s.Length), acc)
		if err != nil {
			return 0, nil, accessErr(OpCheckSGE, s.LKey, s.Addr, uint64(s.Length), err, e, acc)
		}
		return uint64(s.Length), (*Ref)(e), nil
	}
	total, err = pd.CheckSGEs(sges, acc)
	return total, nil, err
}

// GatherRef is Gather of a list that CheckSGEsRef returned r for (r may
// be nil): the same copy, checks and errors, without the key lookup while
// r is still the element's live region.
func (pd *PD) GatherRef(sges []SGE, r *Ref, offset uint64, dst []byte) error {
	if e := (*entry)(r); e != nil && len(sges) == 1 && len(dst) != 0 {
		s := &sges[0]
		n, l := uint64(len(dst)), uint64(s.Length)
		if offset <= l && n <= l-offset && e.covers(pd, s, 0) && e.pin() {
			o := s.Addr - e.start + offset
			copy(dst, e.mem[o:o+n])
			e.unpin()
			return nil
		}
	}
	return pd.Gather(sges, offset, dst)
}
