package memreg

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Key layout, as verbs does it: key = index<<8 | keyByte.
const (
	keyIndexBits = 24
	maxIndex     = 1<<keyIndexBits - 1 // largest usable index; index 0 is never handed out
	pageShift    = 12
	pageSize     = 1 << pageShift
	pageMask     = pageSize - 1
	numPages     = 1 << (keyIndexBits - pageShift)

	// maxDMALen is the largest DMA length a responder accepts (IBTA: 2^31;
	// rxe check_length: RESPST_ERR_LENGTH above it).
	maxDMALen = 1 << 31

	// anyQP makes the PD-level remote calls skip the type 2 window QP check.
	anyQP = ^uint32(0)
)

// KeyIndex returns the 24-bit table index of a key.
func KeyIndex(key uint32) uint32 { return key >> 8 }

// KeyByte returns the 8-bit key (generation) byte of a key.
func KeyByte(key uint32) uint8 { return uint8(key) }

// Limits bounds what a Table hands out. A zero field means "no limit"
// (besides the 2^24-1 keys the key format allows).
type Limits struct {
	MaxMR    int    // live memory regions
	MaxBytes uint64 // sum of the lengths of live memory regions
	MaxPD    int    // live protection domains
	MaxMW    int    // live memory windows
}

// Usage is a snapshot of what a Table has handed out.
type Usage struct {
	PDs, MRs, MWs int
	Bytes         uint64
}

// Table is the memory translation table of one device: it owns the key
// space (lkeys, rkeys and window rkeys share it) and the limits.
//
// Lookups (every remote or local access) are O(1) and take no lock: two
// atomic loads (page, slot) and an atomic in-flight count on the
// registration. Registration, deregistration, binding and invalidation
// serialize on a mutex. Create tables with NewTable; the zero Table is
// not usable. All methods are safe for concurrent use.
type Table struct {
	lim   Limits
	page0 page // the first 4096 indices live inline: one dependent load less per lookup
	pages [numPages]atomic.Pointer[page]
	next  atomic.Uint32 // indices in [1, next) have been handed out at least once

	mu     sync.Mutex
	free   []uint32 // released indices, reused oldest first (FIFO) once reuseAfter are held
	rng    *rand.Rand
	usage  Usage
	closed bool  // Close was called; under mu
	cause  error // Close's cause; under mu
}

// page is one 4096-slot piece of the key table, allocated on first use.
type page struct {
	slots   [pageSize]atomic.Pointer[entry]
	keyByte [pageSize]uint8 // last key byte handed out per index; under Table.mu
}

// NewTable returns an empty table with the given limits.
func NewTable(l Limits) *Table {
	t := &Table{lim: l, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	t.pages[0].Store(&t.page0)
	t.next.Store(1)
	return t
}

// Limits returns the limits the table was created with.
func (t *Table) Limits() Limits { return t.lim }

// Close marks the table closed, for the owner of a table (a device) that
// is shutting down. Afterwards the calls that hand out or grant something
// (AllocPD, RegisterMR, RegisterMRIOVA, AllocMW, MW.Bind and MW.BindQP
// with a non-zero length, PD.Acquire) fail with an error that wraps ErrTableClosed and, if it is
// not nil, cause (the owner's own sentinel, so its callers can match it).
// The calls that give something back (MR.Deregister, unbinding Bind,
// MW.Invalidate, MW.Dealloc, PD.Release, PD.Dealloc) keep working, so that the memory
// and the accounting can still be released, and lookups of live
// registrations are not affected. Closing again keeps the first cause.
func (t *Table) Close(cause error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed, t.cause = true, cause
	}
}

// closedErr returns the error of a refused call on a closed table, or nil
// if the table is open. Under t.mu.
func (t *Table) closedErr(op string) error {
	if !t.closed {
		return nil
	}
	return fmt.Errorf("memreg: %s: %w", op, t.closedCause())
}

// closedCause is ErrTableClosed, wrapped with Close's cause. Under t.mu.
func (t *Table) closedCause() error {
	if t.cause == nil {
		return ErrTableClosed
	}
	return fmt.Errorf("%w: %w", ErrTableClosed, t.cause)
}

// Usage returns how many PDs, MRs, MWs and registered bytes are live.
func (t *Table) Usage() Usage {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.usage
}

// kind is what a key table entry describes.
type kind uint8

const (
	kindMR kind = iota + 1
	kindMW1
	kindMW2
)

// deadBit in entry.refs marks a registration that is gone: no new access
// may start; the low bits count the accesses in flight.
const deadBit = int64(1) << 62

// entry is one immutable registration (an MR, or one binding of a window)
// as the lookup path sees it. Only refs changes after publication.
type entry struct {
	refs atomic.Int64
	_    [56]byte // keep the hot counter off the read-only fields' cache line

	key     uint32
	kind    kind
	unbound bool   // a window with no binding
	access  Access // rights this key grants
	qpn     uint32 // type 2 window: the QP it is bound to; anyQP otherwise
	pd      *PD
	start   uint64 // first valid address (IOVA space)
	last    uint64 // last valid address (inclusive)
	mem     []byte // host memory backing [start, last]; a region's len(mem) is last-start+1 (PD.CheckSGE relies on it)
	mr      *MR    // the region itself, or the region a window is bound to
	mw      *MW    // the window, for window entries
}

// pin registers an access in flight; it fails if the registration is gone.
// While pinned, Deregister (or unbind) does not return.
func (e *entry) pin() bool {
	if e.refs.Add(1)&deadBit != 0 {
		e.refs.Add(-1)
		return false
	}
	return true
}

// unpin ends an access started by pin.
func (e *entry) unpin() { e.refs.Add(-1) }

// kill stops new accesses; drain then waits for those in flight.
func (e *entry) kill() { e.refs.Or(deadBit) }

// drain waits until no access pinned before kill is still running. The
// accesses it waits for are single memmoves or atomics, so it spins briefly
// and then sleeps with a growing, capped back-off.
func (e *entry) drain() {
	for i := 0; e.refs.Load() != deadBit; i++ {
		if i < 64 {
			runtime.Gosched()
		} else {
			d := time.Duration(i-63) * time.Microsecond
			time.Sleep(min(d, time.Millisecond))
		}
	}
}

// lookup returns the live entry at key's index (whatever its key byte), or nil.
func (t *Table) lookup(key uint32) *entry {
	idx := key >> 8
	if idx < pageSize {
		return t.page0.slots[idx].Load()
	}
	p := t.pages[idx>>pageShift].Load()
	if p == nil {
		return nil
	}
	return p.slots[idx&pageMask].Load()
}

// missErr classifies a key whose index holds no live entry.
func (t *Table) missErr(key uint32) error {
	idx := key >> 8
	if idx == 0 || idx >= t.next.Load() {
		return ErrUnknownKey
	}
	return ErrStaleKey
}

// slot returns the slot of an index that has been handed out.
func (t *Table) slot(idx uint32) *atomic.Pointer[entry] {
	return &t.pages[idx>>pageShift].Load().slots[idx&pageMask]
}

// allocIndex hands out an index and its next key. Called with t.mu held.
func (t *Table) allocIndex() (idx uint32, key uint32, err error) {
	if len(t.free) >= reuseAfter || len(t.free) > 0 && t.next.Load() > maxIndex {
		idx = t.free[0]
		t.free = t.free[1:]
	} else {
		idx = t.next.Load()
		if idx > maxIndex {
			return 0, 0, fmt.Errorf("%w: all %d keys are in use", ErrLimit, maxIndex)
		}
		p := t.pages[idx>>pageShift].Load()
		if p == nil {
			p = new(page)
			t.pages[idx>>pageShift].Store(p)
		}
		// A fresh index starts at a random key byte, as rxe does.
		p.keyByte[idx&pageMask] = uint8(t.rng.Uint32())
		t.next.Store(idx + 1)
	}
	return idx, t.bumpKey(idx), nil
}

// reuseAfter is how many released indices the table holds back before it
// reuses the oldest (fresh indices are handed out meanwhile, or a held one
// once all 2^24 have been). Reusing a released index at once brought one
// churned registration (a bounce buffer per request) back to the same
// index every time, so its key came back exactly 256 registrations after
// it was released — and a peer still holding it could write the new
// region of the same PD; now it takes at least 256 × 4096 registrations.
// rxe allocates indices cyclically for the same reason. It costs one
// table page (36 KiB) more at most.
const reuseAfter = 4096

// bumpKey gives idx a new key byte (previous + 1) and returns the key.
// Called with t.mu held.
func (t *Table) bumpKey(idx uint32) uint32 {
	p := t.pages[idx>>pageShift].Load()
	kb := p.keyByte[idx&pageMask] + 1
	p.keyByte[idx&pageMask] = kb
	return idx<<8 | uint32(kb)
}

// setKeyByte records a consumer-chosen key byte (type 2 bind). Called with t.mu held.
func (t *Table) setKeyByte(idx uint32, kb uint8) uint32 {
	t.pages[idx>>pageShift].Load().keyByte[idx&pageMask] = kb
	return idx<<8 | uint32(kb)
}

// freeIndex returns an index for reuse. Called with t.mu held, after its
// slot has been cleared.
func (t *Table) freeIndex(idx uint32) { t.free = append(t.free, idx) }
