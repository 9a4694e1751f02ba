//go:build linux

package share

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"time"
)

// MemberStatus describes one slot of a group.
type MemberStatus struct {
	Slot     int
	PID      uint32
	State    string // "live", "dead" (its socket is gone, not yet swept), "timewait"
	Joined   time.Time
	FreeAt   time.Time // TimeWait slots: when they return
	Rejector bool      // answers REQs nobody listens on
	Steered  uint64    // datagrams the program handed to it
	Ranges   [][2]uint32
	Services []uint64
}

// Counters are the group's drop counters.
type Counters struct {
	UnownedQPN  uint64 // datagrams for a QPN range nobody owns
	DeadOwner   uint64 // the owner's socket is gone
	NoListener  uint64 // REQ/SIDR_REQ for a service nobody listens on, and no rejector
	UnownedComm uint64 // CM message whose communication ID names no member
	NotCM       uint64 // QP1 datagram that is not a routable CM MAD
	Malformed   uint64 // too short for the headers
	ToRejector  uint64 // REQ/SIDR_REQ handed to the rejector
}

// Status is a snapshot of the group on an address.
type Status struct {
	Addr     netip.AddrPort
	Members  []MemberStatus
	Counters Counters
}

// ReadStatus reads the group of ap from its pins under pinRoot ("" means
// DefaultPinRoot). It takes no lock and changes nothing.
func ReadStatus(ap netip.AddrPort, pinRoot string) (*Status, error) {
	if pinRoot == "" {
		pinRoot = DefaultPinRoot
	}
	dir := dirName(pinRoot, ap)
	g, err := loadPinned(dir, true)
	if err != nil {
		if g = findLive(dir, groupKey(ap)); g == nil {
			return nil, fmt.Errorf("share: no group on %s (%s): %w", ap, dir, err)
		}
	}
	defer g.close()
	st := &Status{Addr: ap}
	var rej uint32
	g.cfg.Lookup(uint32(cfgRejector), &rej)
	bySlot := map[int]*MemberStatus{}
	for s := 0; s < MaxMembers; s++ {
		r := g.member(s)
		if r.State == stateFree {
			continue
		}
		ms := MemberStatus{Slot: s, PID: r.PID, Joined: time.Unix(0, r.Joined), Rejector: rej == uint32(s)+1}
		switch {
		case r.State == stateTimeWait:
			ms.State = "timewait"
			ms.FreeAt = time.Unix(0, r.FreeAt)
		case g.alive(s, r):
			ms.State = "live"
		default:
			ms.State = "dead"
		}
		g.stats.Lookup(uint32(s), &ms.Steered)
		st.Members = append(st.Members, ms)
	}
	for i := range st.Members {
		bySlot[st.Members[i].Slot] = &st.Members[i]
	}
	for r := uint32(1); r < numRanges; r++ {
		var owner uint32
		if g.ranges.Lookup(r, &owner) == nil && owner != 0 {
			if ms := bySlot[int(owner-1)]; ms != nil {
				ms.Ranges = append(ms.Ranges, [2]uint32{r * RangeSize, (r+1)*RangeSize - 1})
			}
		}
	}
	var key [8]byte
	var val uint32
	it := g.services.Iterate()
	for it.Next(&key, &val) {
		if ms := bySlot[int(val)-1]; val != 0 && ms != nil {
			ms.Services = append(ms.Services, binary.BigEndian.Uint64(key[:]))
		}
	}
	for i := range st.Members {
		sort.Slice(st.Members[i].Services, func(a, b int) bool { return st.Members[i].Services[a] < st.Members[i].Services[b] })
	}
	c := func(i int) uint64 {
		var v uint64
		g.stats.Lookup(uint32(MaxMembers+i), &v)
		return v
	}
	st.Counters = Counters{UnownedQPN: c(ctrUnownedQPN), DeadOwner: c(ctrDeadOwner), NoListener: c(ctrNoListener),
		UnownedComm: c(ctrUnownedComm), NotCM: c(ctrNotCM), Malformed: c(ctrMalformed), ToRejector: c(ctrToRejector)}
	return st, nil
}

// Counters returns the group's drop counters as this member sees them.
func (m *Member) Counters() Counters {
	c := func(i int) uint64 {
		var v uint64
		m.g.stats.Lookup(uint32(MaxMembers+i), &v)
		return v
	}
	return Counters{UnownedQPN: c(ctrUnownedQPN), DeadOwner: c(ctrDeadOwner), NoListener: c(ctrNoListener),
		UnownedComm: c(ctrUnownedComm), NotCM: c(ctrNotCM), Malformed: c(ctrMalformed), ToRejector: c(ctrToRejector)}
}
