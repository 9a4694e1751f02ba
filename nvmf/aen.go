package nvmf

import (
	"encoding/binary"
	"fmt"

	"github.com/gorocev2/rocev2/nvme"
)

// Asynchronous events of the target: the Namespace Attribute Changed
// notice, as nvmet sends it (drivers/nvme/target: nvmet_ns_changed,
// nvmet_add_async_event, nvmet_execute_get_log_changed_ns).
const (
	// aenNSAttr is the Namespace Attribute Notices bit of OAES and of
	// the Asynchronous Event Configuration (bit 8).
	aenNSAttr = 1 << 8
	// aecSupported are the Asynchronous Event Configuration bits Set
	// Features takes: the SMART critical warnings (bits 4:0) and the
	// notices OAES reports (nvmet's NVMET_AEN_CFG_ALL, without ANA).
	aecSupported = 0x1f | aenNSAttr
	// maxChangedNS is how many NSIDs the Changed Namespace List holds
	// (NVME_MAX_CHANGED_NAMESPACES).
	maxChangedNS = 1024
	// aeNoticeNSChanged is the notice's Asynchronous Event Information.
	aeNoticeNSChanged = 0x00
)

// nsChangedEvent is the AER completion of a namespace change: notice,
// Namespace Attribute Changed, log page 04h.
var nsChangedEvent = nvme.AsyncEvent{Type: nvme.AENotice, Info: aeNoticeNSChanged, LID: nvme.LogChangedNS}

// nsChanged notes that namespace nsid changed (added, removed or
// resized), as nvmet_ns_changed does for each controller: nsid joins the
// Changed Namespace List, and unless the host disabled the notice (Set
// Features 0Bh bit 8 clear) or one is already out that it has not
// acknowledged (reading log page 04h with RAE clear), the notice
// completes a parked AER or waits for the next one.
func (c *tctrl) nsChanged(nsid uint32) {
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		return
	}
	c.addChangedNS(nsid)
	if c.aec&aenNSAttr == 0 || c.nsMasked {
		c.mu.Unlock()
		return
	}
	c.nsMasked = true
	c.events = append(c.events, nsChangedEvent)
	admin := c.queues[0]
	c.mu.Unlock()
	if admin != nil {
		admin.kick()
	}
}

// addChangedNS adds nsid to the Changed Namespace List (c.mu held): once,
// and when the list is full, the list becomes FFFFFFFFh alone ("more
// than 1024 changed") until the host reads it.
func (c *tctrl) addChangedNS(nsid uint32) {
	if c.changedAll {
		return
	}
	for _, id := range c.changedNS {
		if id == nsid {
			return
		}
	}
	if len(c.changedNS) == maxChangedNS {
		c.changedNS, c.changedAll = c.changedNS[:0], true
		return
	}
	c.changedNS = append(c.changedNS, nsid)
}

// takeChangedNSLog builds log page 04h for a host's read of it: the
// changed NSIDs, or FFFFFFFFh in the first entry when more than 1024
// changed, then zeros. The list starts again (nvmet clears it whatever
// RAE says); with RAE (Retain Asynchronous Event) clear the notice is
// acknowledged and the next change sends another. Both under one hold of
// c.mu, as nvmet_execute_get_log_changed_ns under ctrl->lock: a change
// that lands meanwhile is in this page or stays for the next read.
func (c *tctrl) takeChangedNSLog(rae bool) []byte {
	page := make([]byte, maxChangedNS*4)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changedAll {
		binary.LittleEndian.PutUint32(page, 0xffffffff)
	} else {
		for i, id := range c.changedNS {
			binary.LittleEndian.PutUint32(page[4*i:], id)
		}
	}
	c.changedNS, c.changedAll = c.changedNS[:0], false
	if !rae {
		c.nsMasked = false
	}
	return page
}

// takeEvents pairs queued events with parked AERs (c.mu not held): the
// admin queue answers each pair.
func (c *tctrl) takeEvents() (cids []uint16, evs []nvme.AsyncEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.events) > 0 && len(c.aers) > 0 {
		cids = append(cids, c.aers[0])
		evs = append(evs, c.events[0])
		c.aers, c.events = c.aers[1:], c.events[1:]
	}
	return cids, evs
}

// kick wakes the admin queue's goroutine to answer parked AERs with the
// events queued for them (serveEvents).
func (q *tqueue) kick() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// serveEvents completes parked AERs with queued events (the admin queue's
// goroutine, which owns the queue's response buffers).
func (q *tqueue) serveEvents() {
	if q.qid != 0 || q.ctrl == nil {
		return
	}
	cids, evs := q.ctrl.takeEvents()
	for i, cid := range cids {
		q.answerResult(cid, 0, evs[i].Result())
	}
}

// notifyNSChanged tells every controller of sub that namespace nsid
// changed.
func (t *Target) notifyNSChanged(sub *Subsystem, nsid uint32) {
	t.mu.Lock()
	cs := make([]*tctrl, 0, len(t.ctrls))
	for _, c := range t.ctrls {
		if c.sub == sub {
			cs = append(cs, c)
		}
	}
	t.mu.Unlock()
	for _, c := range cs {
		c.nsChanged(nsid)
	}
}

// subsystem returns the subsystem named nqn, or an error naming the
// method.
func (t *Target) subsystem(method, nqn string) (*Subsystem, error) {
	s := t.subs[nqn]
	if s == nil {
		return nil, fmt.Errorf("nvmf: Target.%s: nqn %q: no such subsystem", method, nqn)
	}
	return s, nil
}

// AddNamespace adds ns to the subsystem nqn while the target runs, as
// Subsystem.Namespaces takes it (ID 0: the lowest free one; the NGUID is
// derived from the NQN and ID when zero), and tells the connected hosts
// (a Namespace Attribute Changed notice; Linux's host scans again and
// adds the block device). It returns ns's ID.
func (t *Target) AddNamespace(nqn string, ns *Namespace) (uint32, error) {
	s, err := t.subsystem("AddNamespace", nqn)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	used := map[uint32]bool{}
	for _, n := range s.Namespaces {
		if n == ns {
			s.mu.Unlock()
			return 0, fmt.Errorf("nvmf: Target.AddNamespace: ns (ID %d) is already in %q", ns.ID, nqn)
		}
		used[n.ID] = true
	}
	if err := ns.setup(nqn, used, "Target.AddNamespace: ns"); err != nil {
		s.mu.Unlock()
		return 0, err
	}
	s.Namespaces = append(s.Namespaces[:len(s.Namespaces):len(s.Namespaces)], ns)
	s.mu.Unlock()
	t.logf("nvmf: %s: namespace %d added (%d blocks of %d bytes)", nqn, ns.ID, ns.blocks.Load(), ns.BlockSize)
	t.notifyNSChanged(s, ns.ID)
	return ns.ID, nil
}

// RemoveNamespace removes namespace nsid from the subsystem nqn while the
// target runs and tells the connected hosts. Commands for it fail from
// now on (Invalid Namespace); it returns once the ones already running on
// its Backend have finished (as nvmet_ns_disable waits for them), so the
// caller may close the Backend then. It returns the namespace removed.
func (t *Target) RemoveNamespace(nqn string, nsid uint32) (*Namespace, error) {
	s, err := t.subsystem("RemoveNamespace", nqn)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	var ns *Namespace
	kept := make([]*Namespace, 0, len(s.Namespaces))
	for _, n := range s.Namespaces {
		if n.ID == nsid {
			ns = n
			continue
		}
		kept = append(kept, n)
	}
	if ns == nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("nvmf: Target.RemoveNamespace: nsid %d: no such namespace in %q", nsid, nqn)
	}
	s.Namespaces = kept
	s.mu.Unlock()
	// Wait for the commands that found it before it went (acquire).
	ns.running.Lock()
	ns.running.Unlock() //lint:ignore SA2001 a barrier: nothing runs under it
	t.logf("nvmf: %s: namespace %d removed", nqn, nsid)
	t.notifyNSChanged(s, nsid)
	return ns, nil
}

// RevalidateNamespace reads the size of namespace nsid's Backend again
// (nvmet_ns_revalidate: a backing file or device that grew or shrank)
// and, when its size in blocks changed, takes the new one and tells the
// connected hosts (Linux's host revalidates the namespace and the block
// device's size follows). It reports whether the size changed. A
// backend now smaller than a block is an error, and the old size stays.
func (t *Target) RevalidateNamespace(nqn string, nsid uint32) (bool, error) {
	s, err := t.subsystem("RevalidateNamespace", nqn)
	if err != nil {
		return false, err
	}
	ns := s.namespace(nsid)
	if ns == nil {
		return false, fmt.Errorf("nvmf: Target.RevalidateNamespace: nsid %d: no such namespace in %q", nsid, nqn)
	}
	blocks := uint64(max(ns.Backend.Size(), 0)) >> ns.shift
	if blocks == 0 {
		return false, fmt.Errorf("nvmf: Target.RevalidateNamespace: namespace %d of %q: backend smaller than a block", nsid, nqn)
	}
	if old := ns.blocks.Swap(blocks); old == blocks {
		return false, nil
	} else {
		t.logf("nvmf: %s: namespace %d resized: %d blocks, was %d", nqn, nsid, blocks, old)
	}
	t.notifyNSChanged(s, nsid)
	return true, nil
}
