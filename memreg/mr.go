package memreg

import (
	"fmt"
	"unsafe"
)

// MR is a memory region: caller memory (a Go byte slice, or memory from
// mmap) that the table translates and guards. The memory stays the
// caller's; after Deregister returns this package never touches it again.
// All methods are safe for concurrent use, also with accesses through the
// region's keys: Deregister waits for the accesses in flight.
type MR struct {
	pd     *PD
	e      *entry
	key    uint32
	iova   uint64
	n      int
	access Access
	// Under t.mu:
	windows int // windows bound to this region (including unbinds still draining)
	dead    bool
}

// RegisterMR registers buf with the given access flags; the region's IOVA
// is the host address of buf[0] (what ibv_reg_mr does). Unless access has
// AccessOnDemand, the region's pages are faulted in first (on Linux), as
// ibv_reg_mr's pinning does: a region's first transfer then runs at the
// speed of the next (10,000 QP pairs, each writing 64 KiB from fresh
// memory of its own into fresh memory of its own: 0.21 of one QP's
// goodput in the first second, 355,000 page faults, without it).
func (pd *PD) RegisterMR(buf []byte, access Access) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("memreg: register: %w: empty buffer", ErrInvalidArgument)
	}
	return pd.RegisterMRIOVA(buf, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), access)
}

// RegisterMRIOVA registers buf so that remote and local addresses
// [iova, iova+len(buf)) map onto it (ibv_reg_mr_iova).
//
// The access flags must obey the verbs rules: only the defined bits, and
// AccessRemoteWrite or AccessRemoteAtomic only together with
// AccessLocalWrite (ErrInvalidAccessFlags). Limits give ErrLimit.
func (pd *PD) RegisterMRIOVA(buf []byte, iova uint64, access Access) (*MR, error) {
	if err := validMR(access); err != nil {
		return nil, fmt.Errorf("memreg: register with %v: %w", access, err)
	}
	n := uint64(len(buf))
	if n == 0 {
		return nil, fmt.Errorf("memreg: register: %w: empty buffer", ErrInvalidArgument)
	}
	if iova+n-1 < iova {
		return nil, fmt.Errorf("memreg: register iova %#x len %d: %w", iova, n, ErrAddressWrap)
	}
	if access&AccessOnDemand == 0 {
		// Before the table's lock: faulting in a large region takes a
		// while (about 0.3 s per GiB of fresh memory here).
		if err := populate(buf, access&(AccessLocalWrite|accessNeedsLocalWrite) != 0); err != nil {
			return nil, fmt.Errorf("memreg: register %d bytes at %#x with %v: %w", n, iova, access, err)
		}
	}
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.dead {
		return nil, fmt.Errorf("memreg: register: PD %w", ErrClosed)
	}
	if err := t.closedErr("register"); err != nil {
		return nil, err
	}
	if t.lim.MaxMR > 0 && t.usage.MRs >= t.lim.MaxMR {
		return nil, fmt.Errorf("memreg: register: %w: MaxMR=%d regions", ErrLimit, t.lim.MaxMR)
	}
	if t.lim.MaxBytes > 0 && (n > t.lim.MaxBytes || t.usage.Bytes > t.lim.MaxBytes-n) {
		return nil, fmt.Errorf("memreg: register %d bytes: %w: MaxBytes=%d, %d registered",
			n, ErrLimit, t.lim.MaxBytes, t.usage.Bytes)
	}
	idx, key, err := t.allocIndex()
	if err != nil {
		return nil, fmt.Errorf("memreg: register: %w", err)
	}
	mr := &MR{pd: pd, key: key, iova: iova, n: len(buf), access: access}
	mr.e = &entry{
		key:    key,
		kind:   kindMR,
		access: access,
		qpn:    anyQP,
		pd:     pd,
		start:  iova,
		last:   iova + n - 1,
		mem:    buf[:n:n],
		mr:     mr,
	}
	t.slot(idx).Store(mr.e)
	pd.nMR++
	t.usage.MRs++
	t.usage.Bytes += n
	return mr, nil
}

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.key }

// RKey returns the remote key. It equals the lkey (as in rxe); it is
// honoured remotely only for the remote rights the region was registered
// with, and a remote access the region does not grant fails with
// ErrAccessDenied.
func (mr *MR) RKey() uint32 { return mr.key }

// SGE returns the scatter/gather element for n bytes at offset off into the
// region: Addr IOVA()+off, Length n, LKey LKey(). It does not check the
// range; PostSend and PostRecv do, and name the SGE that falls outside.
func (mr *MR) SGE(off uint64, n uint32) SGE {
	return SGE{Addr: mr.iova + off, Length: n, LKey: mr.key}
}

// IOVA returns the address of the region's first byte in its key's address space.
func (mr *MR) IOVA() uint64 { return mr.iova }

// Len returns the region's length in bytes.
func (mr *MR) Len() int { return mr.n }

// Access returns the flags the region was registered with.
func (mr *MR) Access() Access { return mr.access }

// PD returns the region's protection domain.
func (mr *MR) PD() *PD { return mr.pd }

// Deregister removes the region. It fails with ErrBusy while a memory
// window is bound to it and with ErrClosed if already deregistered. It
// works on a closed table (Table.Close): the memory can always be released.
// When it returns, every access that was using the region has finished
// and no later access reaches the memory: the caller owns it again.
// The key's index is reused only after 4096 other released ones, and then
// with the next key byte: the key names nothing for at least 256 × 4096
// registrations.
func (mr *MR) Deregister() error {
	t := mr.pd.t
	t.mu.Lock()
	switch {
	case mr.dead:
		t.mu.Unlock()
		return fmt.Errorf("memreg: deregister key %#08x: %w", mr.key, ErrClosed)
	case mr.windows > 0:
		n := mr.windows
		t.mu.Unlock()
		return fmt.Errorf("memreg: deregister key %#08x: %w: %d memory windows bound", mr.key, ErrBusy, n)
	}
	mr.dead = true
	mr.e.kill()
	t.slot(mr.key >> 8).Store(nil)
	t.freeIndex(mr.key >> 8)
	mr.pd.nMR--
	mr.pd.idleLocked()
	t.usage.MRs--
	t.usage.Bytes -= uint64(mr.n)
	t.mu.Unlock()
	mr.e.drain()
	return nil
}
