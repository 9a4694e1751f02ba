package memreg

// Pins holds registrations pinned by one goroutine across a batch of
// placements, such as the packets of one received batch. A BatchTarget
// pins its registration into Pins on its first Write of a batch; its
// later Writes of the same batch check bounds and copy, with no atomic
// operation. Release unpins everything: one pair of atomic operations per
// registration and batch instead of one per placement.
//
// While a registration is held in Pins, Deregister (and a window's
// unbind, invalidate or dealloc) waits for it: the holder must Release at
// the end of every batch, before it blocks for any length of time, and
// before it deregisters or invalidates anything itself (that would wait
// for its own pin for ever). The guarantee of Deregister is unchanged:
// when it returns, every placement through a held pin has finished and
// none can start.
//
// Pins is not safe for concurrent use. The zero Pins is ready to use.
type Pins struct {
	gen uint64   // Release calls that unpinned something; a BatchTarget is held while its gen is this
	es  []*entry // the pinned registrations, in pin order (one pin each)
}

// Release unpins every registration held. BatchTargets pinned before it
// pin again on their next Write.
func (ps *Pins) Release() {
	if len(ps.es) == 0 {
		return
	}
	for i, e := range ps.es {
		e.unpin()
		ps.es[i] = nil
	}
	ps.es = ps.es[:0]
	ps.gen++
}

// Len returns how many pins are held.
func (ps *Pins) Len() int { return len(ps.es) }

// hold pins e into ps, or finds it already held (the registration pinned
// last is checked: consecutive messages through one region share a pin).
// It fails once the registration is gone.
func (ps *Pins) hold(e *entry) bool {
	if k := len(ps.es); k > 0 && ps.es[k-1] == e {
		return true
	}
	if !e.pin() {
		return false
	}
	ps.es = append(ps.es, e)
	return true
}

// BatchTarget is a Target that places through a Pins: the per-packet
// placement path of a responder that receives packets in batches. It is
// a plain value (the responder keeps one per WRITE message in progress);
// it holds nothing itself, the Pins does. Like the Pins it writes through,
// it is used by one goroutine at a time.
type BatchTarget struct {
	mem []byte // the target's bytes (nil for a zero-length target)
	ps  *Pins  // the Pins the registration is held in, at generation gen
	gen uint64
	t   Target
}

// Batched returns the target as a BatchTarget.
func (t Target) Batched() BatchTarget {
	bt := BatchTarget{t: t}
	if t.e != nil {
		bt.mem = t.e.mem[t.off : t.off+uint64(t.n) : t.off+uint64(t.n)]
	}
	return bt
}

// Target returns the target.
func (bt *BatchTarget) Target() Target { return bt.t }

// Write places p at byte offset off of the target, like Target.Write (same
// rules and errors). With ps non-nil the registration is pinned into ps on
// the first Write after ps's last Release and stays pinned until the next
// one; with ps nil every Write pins and unpins, as Target.Write does.
func (bt *BatchTarget) Write(ps *Pins, off uint64, p []byte) error {
	// The hot path: held in ps since its last Release, write right, in
	// bounds (n >= 1); one call, the copy.
	n := uint64(len(p))
	if ps != nil && bt.ps == ps && bt.gen == ps.gen && bt.t.acc&AccessRemoteWrite != 0 &&
		n-1 < uint64(len(bt.mem)) && off <= uint64(len(bt.mem))-n {
		copy(bt.mem[off:], p) // n bytes: off+n <= len(bt.mem)
		return nil
	}
	return bt.writeSlow(ps, off, p)
}

//go:noinline
func (bt *BatchTarget) writeSlow(ps *Pins, off uint64, p []byte) error {
	if ps == nil {
		return bt.t.Write(off, p)
	}
	n := uint64(len(p))
	if n == 0 {
		return nil
	}
	if err := bt.t.check(OpWrite, off, n, AccessRemoteWrite); err != nil {
		return err
	}
	if bt.ps != ps || bt.gen != ps.gen {
		if !ps.hold(bt.t.e) {
			return accessErr(OpWrite, bt.t.key, bt.t.VA()+off, n, ErrStaleKey, bt.t.e, 0)
		}
		bt.ps, bt.gen = ps, ps.gen
	}
	copy(bt.mem[off:], p) // n bytes: off+n <= len(bt.mem)
	return nil
}

// ScatterList places the pieces of one message (the packets of a SEND,
// the responses of an RDMA READ) into a scatter/gather list, like
// Scatter, holding the regions in a Pins across a batch. It remembers the
// list element it wrote last: a piece that lies inside that element is
// placed with a bounds check and a copy while the region is held (no
// lookup, no atomic operation), and after a Release the region is held
// again with one pin. Any other piece takes Scatter's full path (same
// checks, same errors) and holds what it writes. A ScatterList is used by
// one goroutine at a time (it remembers its last element).
type ScatterList struct {
	pd    *PD
	sges  []SGE
	mem   []byte // the element written last, whole; valid while held in ps at gen
	start uint64 // list offset of mem[0]
	ps    *Pins
	gen   uint64
	e     *entry // the region of mem
}

// ScatterList returns a ScatterList over sges (not copied: the caller
// keeps them unchanged while it uses the ScatterList).
func (pd *PD) ScatterList(sges []SGE) ScatterList { return ScatterList{pd: pd, sges: sges} }

// InitRef makes sl a ScatterList over a list that CheckSGEsRef returned
// r for (r may be nil), in place: written field by field, where a
// ScatterList returned by value was built, zeroed and copied whole. While
// r is the element's live region with local write access, the first
// Scatter in a batch holds r in the Pins (the pin fails once Deregister
// has begun) and copies, with no key lookup; otherwise Scatter takes its
// full path, with its checks and errors.
func (sl *ScatterList) InitRef(pd *PD, sges []SGE, r *Ref) {
	sl.pd, sl.sges, sl.start, sl.ps, sl.gen = pd, sges, 0, nil, 0
	if e := (*entry)(r); e != nil && len(sges) == 1 && e.covers(pd, &sges[0], AccessLocalWrite) {
		// Remembered as the element written last, held in no Pins yet:
		// scatterSlow holds it (or, if it is gone, takes the full path).
		o, l := sges[0].Addr-e.start, uint64(sges[0].Length)
		sl.mem, sl.e = e.mem[o:o+l:o+l], e
		return
	}
	sl.mem, sl.e = nil, nil
}

// Scatter places src at byte offset of the concatenated list, like
// PD.Scatter (same rules and errors). With ps non-nil the regions written
// are held in ps until its next Release; with ps nil it is PD.Scatter.
func (sl *ScatterList) Scatter(ps *Pins, offset uint64, src []byte) error {
	n := uint64(len(src))
	if ps != nil && sl.ps == ps && sl.gen == ps.gen && offset >= sl.start &&
		n-1 < uint64(len(sl.mem)) && offset-sl.start <= uint64(len(sl.mem))-n {
		o := offset - sl.start
		copy(sl.mem[o:], src) // n bytes: o+n <= len(sl.mem)
		return nil
	}
	return sl.scatterSlow(ps, offset, src)
}

//go:noinline
func (sl *ScatterList) scatterSlow(ps *Pins, offset uint64, src []byte) error {
	if ps == nil {
		return sl.pd.Scatter(sl.sges, offset, src)
	}
	// Inside the element written last, in a later batch: hold its region
	// again. If that succeeds the registration is still the one every
	// check passed for (entries never change; a deregistration marks it
	// dead first), so the checks need not run again.
	n := uint64(len(src))
	if sl.e != nil && offset >= sl.start && n-1 < uint64(len(sl.mem)) && offset-sl.start <= uint64(len(sl.mem))-n &&
		ps.hold(sl.e) {
		sl.ps, sl.gen = ps, ps.gen
		o := offset - sl.start
		copy(sl.mem[o:], src) // n bytes: o+n <= len(sl.mem)
		return nil
	}
	return sl.pd.move(OpScatter, sl.sges, offset, src, AccessLocalWrite, ps, sl)
}

// remember records element s, starting at list offset start, as the one
// written last; its region e is held in ps. The element passed every
// check when it was posted and e is the same registration (its key
// matched), so it lies inside e; it is checked again all the same.
func (sl *ScatterList) remember(ps *Pins, e *entry, s *SGE, start uint64) {
	l := uint64(s.Length)
	last := s.Addr + l - 1
	if l == 0 || last < s.Addr || s.Addr < e.start || last > e.last {
		sl.mem, sl.ps, sl.e = nil, nil, nil
		return
	}
	o := s.Addr - e.start
	sl.mem, sl.e = e.mem[o:o+l:o+l], e
	sl.start = start
	sl.ps, sl.gen = ps, ps.gen
}

// ScatterRef places src at offset 0 of a list that CheckSGEsRef returned
// r for (r may be nil): what InitRef followed by one Scatter(ps, 0, src)
// does, for a message placed whole by one call (a SEND ONLY), which needs
// no ScatterList afterwards. While r is the element's live region with
// local write access and src fits the element, r is held in ps (as
// Scatter holds it) and src copied, with no key lookup; otherwise it takes
// Scatter's full path, with its checks and errors.
func (pd *PD) ScatterRef(ps *Pins, sges []SGE, r *Ref, src []byte) error {
	if e := (*entry)(r); e != nil && ps != nil && len(sges) == 1 && len(src) != 0 {
		s := &sges[0]
		if n := uint64(len(src)); n <= uint64(s.Length) && e.covers(pd, s, AccessLocalWrite) && ps.hold(e) {
			o := s.Addr - e.start
			copy(e.mem[o:o+n:o+n], src)
			return nil
		}
	}
	var sl ScatterList
	sl.InitRef(pd, sges, r)
	return sl.Scatter(ps, 0, src)
}
