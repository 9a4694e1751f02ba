package transport

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/gorocev2/rocev2/memreg"
)

// TestPostOneResetsWQE: a post writes a reused send WQE field by field;
// nothing of the WR that used the slot before may survive — not its
// completion state, not a READ's scatter list (which caches a region of
// the memory table), not the fields only atomics, UD, binds and
// invalidates use. The result must be what a fresh WQE would be, through
// postFast (the usual WR) and through postSlow (the same WR checked in
// full) alike; the slot left as pushWQE leaves it (extra set).
func TestPostOneResetsWQE(t *testing.T) {
	// A field added to either struct must be reset by both paths too.
	if n := reflect.TypeFor[sendWQE]().NumField(); n != 14 {
		t.Fatalf("sendWQE has %d fields; postFast and pushWQE write 14", n)
	}
	if n := reflect.TypeFor[SendWR]().NumField(); n != 15 {
		t.Fatalf("SendWR has %d fields; pushWQE writes 15, postFast and clearExtra too", n)
	}
	a, _, _ := newPair(t, pairOpts{})
	_, mr := a.buffer(t, 64, 0)
	_, omr := a.buffer(t, 64, memreg.AccessLocalWrite)
	qp := a.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
	for _, path := range []string{"postFast", "postSlow"} {
		w := qp.sqAt(qp.sqEnd)
		old := sge(omr, 32, 16)
		_, oldRef, err := a.pd.CheckSGEsRef(old, memreg.AccessLocalWrite)
		if err != nil || oldRef == nil {
			t.Fatal(oldRef, err)
		}
		ah := &AH{}
		*w = sendWQE{wr: SendWR{WRID: 1, Opcode: WRRead, SGEs: old, Flags: SendFence, Imm: 2, InvRKey: 3,
			RemoteAddr: 4, RKey: 5, CompareAdd: 6, Swap: 7, AH: ah, RemoteQPN: 8, RemoteQKey: 9,
			MW: &memreg.MW{}, Bind: MWBindInfo{MR: mr, Addr: 1, Length: 2, Access: 3}},
			sges: w.sges[:1], length: 16, npkts: 3, firstPSN: 5, signaled: true, rdCounted: true, done: true,
			localDone: true, probe: true, extra: true, status: WCLocProtErr, rsl: a.pd.ScatterList(old), ref: oldRef}
		w.sges[0] = old[0]
		wr := SendWR{WRID: 42, Opcode: WRSend, SGEs: sge(mr, 0, 8), Imm: 11}
		switch path {
		case "postFast":
			if !qp.postFast(&wr) {
				t.Fatal("postFast declined a valid SEND")
			}
		default:
			if err := qp.postSlow(0, &wr); err != nil {
				t.Fatal(err)
			}
		}
		qp.sqEnd-- // not sent
		// The region the WR's list names.
		_, ref, _ := a.pd.CheckSGEsRef(wr.SGEs, 0)
		want := sendWQE{wr: SendWR{WRID: 42, Opcode: WRSend, Imm: 11}, sges: w.sges, length: 8,
			signaled: qp.init.SigAll, ref: ref, extra: path == "postSlow"}
		if !reflect.DeepEqual(*w, want) {
			t.Fatalf("%s: reused WQE:\n%+v\nwant\n%+v", path, *w, want)
		}
		if !reflect.DeepEqual(w.sges, wr.SGEs) || &w.sges[0] == &wr.SGEs[0] {
			t.Fatalf("%s: WQE SGEs %v, want a copy of %v", path, w.sges, wr.SGEs)
		}
	}
}

// TestPostFastAgreesWithSlow: postFast takes only WRs that postSlow
// takes, and leaves the WQE as postSlow does (but for the fields of w.wr
// its opcodes never read, which it clears instead of copying); a WR it
// declines it leaves untouched, for postSlow to check and name. Random
// WRs (every opcode and one beyond, known and unknown flags, zero to two
// SGEs that are valid, read-only for a READ, out of bounds, of a stale
// key, of another PD, empty or too long) on RC, UC and UD QPs, with the
// queue sometimes full and the slot left dirty by the WRs before.
func TestPostFastAgreesWithSlow(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{sqDepth: 8})
	qp := a.qp
	_, rw := a.buffer(t, 64, 0)
	ro, err := a.pd.RegisterMR(make([]byte, 64), 0)
	if err != nil {
		t.Fatal(err)
	}
	stale, err := a.pd.RegisterMR(make([]byte, 64), memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	staleKey := stale.LKey()
	if err := stale.Deregister(); err != nil {
		t.Fatal(err)
	}
	opd, err := a.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := opd.RegisterMR(make([]byte, 64), memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	sges := []memreg.SGE{
		{Addr: rw.IOVA() + 8, Length: 8, LKey: rw.LKey()},
		{Addr: rw.IOVA(), Length: 64, LKey: rw.LKey()},
		{Addr: ro.IOVA(), Length: 16, LKey: ro.LKey()},
		{Addr: rw.IOVA() + 60, Length: 8, LKey: rw.LKey()},
		{Addr: rw.IOVA() - 1, Length: 8, LKey: rw.LKey()},
		{Addr: 0x1000, Length: 8, LKey: staleKey},
		{Addr: theirs.IOVA(), Length: 8, LKey: theirs.LKey()},
		{Addr: rw.IOVA(), Length: 0, LKey: rw.LKey()},
		{Addr: rw.IOVA(), Length: 1<<31 + 1, LKey: rw.LKey()},
	}
	flags := []SendFlags{0, SendSignaled, SendFence | SendSolicited, SendNoAckReq, 0x08, 0x40}
	r := rand.New(rand.NewPCG(31, 8))
	qp.mu.Lock()
	defer qp.mu.Unlock()
	typ := qp.init.Type
	defer func() { qp.init.Type = typ }()
	// The fields of w.wr postFast's opcodes never read: compared zeroed.
	norm := func(w sendWQE) sendWQE {
		w.sges = slices.Clone(w.sges)
		w.extra = false
		ww := &w.wr
		ww.SGEs, ww.InvRKey, ww.CompareAdd, ww.Swap = nil, 0, 0, 0
		ww.AH, ww.RemoteQPN, ww.RemoteQKey, ww.MW, ww.Bind = nil, 0, 0, nil, MWBindInfo{}
		return w
	}
	taken, declined := 0, 0
	for i := range 20000 {
		qp.init.Type = []QPType{QPTypeRC, QPTypeUC, QPTypeUD}[r.IntN(3)]
		wr := SendWR{WRID: uint64(i), Opcode: WROpcode(r.IntN(11)), Flags: flags[r.IntN(len(flags))], Imm: r.Uint32(),
			InvRKey: r.Uint32(), RemoteAddr: uint64(r.IntN(4)) * 4, RKey: r.Uint32(), CompareAdd: r.Uint64(), Swap: r.Uint64()}
		for range r.IntN(3) {
			wr.SGEs = append(wr.SGEs, sges[r.IntN(len(sges))])
		}
		if r.IntN(4) == 0 {
			wr.AH, wr.RemoteQPN, wr.RemoteQKey = &AH{dev: a.dev}, 0x11, 0x22
		}
		head := qp.sqHead
		if r.IntN(8) == 0 {
			qp.sqHead = qp.sqEnd - uint64(qp.init.MaxSendWR) // full
		}
		w := qp.sqAt(qp.sqEnd)
		before, end := norm(*w), qp.sqEnd
		beforeRaw := *w
		if !qp.postFast(&wr) {
			declined++
			if got := norm(*w); qp.sqEnd != end || !reflect.DeepEqual(got, before) || w.extra != beforeRaw.extra {
				t.Fatalf("WR %d (%+v, %v QP): postFast declined it but changed the queue", i, wr, qp.init.Type)
			}
			// Dirty the slot now and then through postSlow.
			if qp.postSlow(0, &wr) == nil {
				qp.sqEnd--
			}
			qp.sqHead = head
			continue
		}
		taken++
		fast := norm(*w)
		qp.sqEnd--
		*w = beforeRaw
		if err := qp.postSlow(0, &wr); err != nil {
			t.Fatalf("WR %d (%+v, %v QP): postFast took it, postSlow says %v", i, wr, qp.init.Type, err)
		}
		if slow := norm(*w); !reflect.DeepEqual(fast, slow) {
			t.Fatalf("WR %d (%+v, %v QP): postFast's WQE\n%+v\npostSlow's\n%+v", i, wr, qp.init.Type, fast, slow)
		}
		qp.sqEnd--
		if r.IntN(2) == 0 {
			*w = beforeRaw // the next WR finds the slot as it was (clean or not)
		}
		qp.sqHead = head
	}
	if taken < 1000 || declined < 1000 {
		t.Fatalf("postFast took %d and declined %d WRs: the cases do not cover both", taken, declined)
	}
}

// TestCopySGEs: the WQE's copy of a list is equal to it, never shares its
// memory, and reuses the WQE's own memory when it has room.
func TestCopySGEs(t *testing.T) {
	one := []memreg.SGE{{Addr: 1, Length: 2, LKey: 3}}
	three := []memreg.SGE{{Addr: 1}, {Addr: 2}, {Addr: 3}}
	own := make([]memreg.SGE, 0, 4)
	for _, c := range []struct {
		name     string
		dst, src []memreg.SGE
	}{
		{"one into room", own, one},
		{"one into nothing", nil, one},
		{"three into room", own, three},
		{"three into nothing", nil, three},
		{"none", own, nil},
	} {
		got := copySGEs(c.dst, c.src)
		if len(got) != len(c.src) || (len(got) > 0 && !reflect.DeepEqual(got, c.src)) {
			t.Errorf("%s: %v, want %v", c.name, got, c.src)
		}
		if len(got) > 0 && &got[0] == &c.src[0] {
			t.Errorf("%s: the copy shares the caller's memory", c.name)
		}
		if cap(c.dst) >= len(c.src) && len(got) > 0 && &got[:1][0] != &c.dst[:1][0] {
			t.Errorf("%s: the WQE's memory was not reused", c.name)
		}
	}
}

// TestRingMask: sqAt and rqAt find slot index mod the ring's length, with
// the mask or without, for every ring size — and the mask follows the
// ring when it grows (a mask left from the smaller ring would hand out
// the wrong slots).
func TestRingMask(t *testing.T) {
	qp := &QP{}
	for n := 1; n <= 9; n++ {
		qp.setSQ(make([]sendWQE, n))
		qp.setRQ(make([]recvWQE, n))
		for i := uint64(0); i < 40; i++ {
			if qp.sqAt(i) != &qp.sq[i%uint64(n)] || qp.rqAt(i) != &qp.rq[i%uint64(n)] {
				t.Fatalf("ring of %d: index %d in the wrong slot", n, i)
			}
		}
	}
	a, _, _ := newPair(t, pairOpts{sqDepth: 6, rqDepth: 12}) // rings start at 4
	q := a.qp
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, want := range []int{7} { // doubles, but to max_send_wr+1 at most
		l := len(q.sq)
		head, end := q.sqHead, q.sqEnd
		q.sqEnd = q.sqHead + uint64(l) // full: sqRoom grows it
		q.sqRoom()
		q.sqHead, q.sqEnd = head, end
		if len(q.sq) != want {
			t.Fatalf("send ring grew from %d to %d, want %d", l, len(q.sq), want)
		}
		for i := uint64(0); i < 40; i++ {
			if q.sqAt(i) != &q.sq[i%uint64(len(q.sq))] {
				t.Fatalf("send ring of %d: index %d in the wrong slot", len(q.sq), i)
			}
		}
	}
	for _, want := range []int{8, 12} {
		l := len(q.rq)
		head, end := q.rqHead, q.rqEnd
		q.rqEnd = q.rqHead + uint64(l)
		q.rqRoom()
		q.rqHead, q.rqEnd = head, end
		if len(q.rq) != want {
			t.Fatalf("receive ring grew from %d to %d, want %d", l, len(q.rq), want)
		}
		for i := uint64(0); i < 40; i++ {
			if q.rqAt(i) != &q.rq[i%uint64(len(q.rq))] {
				t.Fatalf("receive ring of %d: index %d in the wrong slot", len(q.rq), i)
			}
		}
	}
}

// TestPostAfterDeregister: a post checks its lkey against the table each
// time (no check is remembered between posts): once the region is
// deregistered, the SGE that was just posted (through postFast and
// PostRecv's in-line path) is refused, naming sg_list[0].lkey, for a
// SEND, a READ's destination and a receive alike — also after the same
// memory is registered again under a new key, which posts. A window's
// rkey is no lkey, bound or not.
func TestPostAfterDeregister(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{sqDepth: 64, rqDepth: 64})
	buf, mr := a.buffer(t, 64, memreg.AccessMWBind)
	posts := map[string]func(memreg.SGE) error{
		"SEND": func(s memreg.SGE) error { return a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: []memreg.SGE{s}}) },
		"READ": func(s memreg.SGE) error {
			return a.qp.PostSend(SendWR{Opcode: WRRead, SGEs: []memreg.SGE{s}, RemoteAddr: 0x1000, RKey: 0x1234})
		},
		"recv": func(s memreg.SGE) error { return a.qp.PostRecv(RecvWR{SGEs: []memreg.SGE{s}}) },
	}
	old := mr.SGE(0, 8)
	for name, post := range posts {
		if err := post(old); err != nil {
			t.Fatalf("%s before Deregister: %v", name, err)
		}
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	refused := func(when string, s memreg.SGE, cause error) {
		t.Helper()
		for name, post := range posts {
			err := post(s)
			var we *WRError
			if !errors.As(err, &we) || we.Field != "sg_list[0].lkey" || !errors.Is(err, cause) {
				t.Errorf("%s %s: %v, want sg_list[0].lkey refused (%v)", name, when, err, cause)
			}
		}
	}
	refused("after Deregister", old, memreg.ErrStaleKey)
	again, err := a.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	refused("after the memory is registered again", old, memreg.ErrStaleKey)
	for name, post := range posts {
		if err := post(again.SGE(0, 8)); err != nil {
			t.Fatalf("%s with the new key: %v", name, err)
		}
	}
	mw, err := a.pd.AllocMW(memreg.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	refused("naming an unbound window", memreg.SGE{Addr: again.IOVA(), Length: 8, LKey: mw.RKey()}, memreg.ErrKeyType)
	rkey, err := mw.Bind(again, again.IOVA(), 64, memreg.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	refused("naming a bound window", memreg.SGE{Addr: again.IOVA(), Length: 8, LKey: rkey}, memreg.ErrKeyType)
}
