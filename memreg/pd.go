package memreg

import "fmt"

// PD is a protection domain: keys of one PD are never honoured for
// accesses arriving through another. All methods are safe for concurrent
// use.
type PD struct {
	t *Table
	// Under t.mu:
	nMR, nMW int
	users    int // objects (QPs, SRQs) that hold the PD: Acquire
	dead     bool
	// lazy: DeallocWhenIdle was called; the PD goes when nothing is left
	// in it.
	lazy bool
}

// AllocPD creates a protection domain.
func (t *Table) AllocPD() (*PD, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.closedErr("alloc PD"); err != nil {
		return nil, err
	}
	if t.lim.MaxPD > 0 && t.usage.PDs >= t.lim.MaxPD {
		return nil, fmt.Errorf("memreg: alloc PD: %w: MaxPD=%d", ErrLimit, t.lim.MaxPD)
	}
	t.usage.PDs++
	return &PD{t: t}, nil
}

// Table returns the table the PD belongs to.
func (pd *PD) Table() *Table { return pd.t }

// Acquire records that another object (a queue pair) uses the PD; Dealloc
// fails with ErrBusy until every Acquire is matched by a Release. It fails
// with ErrClosed once the PD is deallocated, and with ErrTableClosed once
// its table is closed (Table.Close).
func (pd *PD) Acquire() error {
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.dead {
		return fmt.Errorf("memreg: acquire PD: %w", ErrClosed)
	}
	if err := t.closedErr("acquire PD"); err != nil {
		return err
	}
	pd.users++
	return nil
}

// Release undoes one Acquire.
func (pd *PD) Release() {
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.users > 0 {
		pd.users--
	}
	pd.idleLocked()
}

// Dealloc releases the PD. It fails with ErrBusy while regions or windows
// of the PD are live or another object holds it (Acquire), and with
// ErrClosed if already released. It works on a closed table (Table.Close).
func (pd *PD) Dealloc() error {
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case pd.dead:
		return fmt.Errorf("memreg: dealloc PD: %w", ErrClosed)
	case pd.nMR > 0 || pd.nMW > 0 || pd.users > 0:
		return fmt.Errorf("memreg: dealloc PD: %w: %d regions and %d windows still live, %d queue pairs or SRQs still hold it",
			ErrBusy, pd.nMR, pd.nMW, pd.users)
	}
	pd.dead = true
	t.usage.PDs--
	return nil
}

// DeallocWhenIdle releases the PD now if nothing is left in it, else as
// soon as its last region and window are deregistered and its last holder
// released: for a PD whose owner goes away while its user still holds
// regions in it (a failed connection attempt, say). It fails with
// ErrClosed if the PD is released already.
func (pd *PD) DeallocWhenIdle() error {
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if pd.dead {
		return fmt.Errorf("memreg: dealloc PD: %w", ErrClosed)
	}
	pd.lazy = true
	pd.idleLocked()
	return nil
}

// idleLocked releases a PD marked by DeallocWhenIdle once it is empty.
// Called with t.mu held.
func (pd *PD) idleLocked() {
	if pd.lazy && !pd.dead && pd.nMR == 0 && pd.nMW == 0 && pd.users == 0 {
		pd.dead = true
		pd.t.usage.PDs--
	}
}
