package transport

import (
	"reflect"
	"testing"

	"github.com/gorocev2/rocev2/memreg"
)

// TestPostOneResetsWQE: postOne writes a reused send WQE field by field;
// nothing of the WR that used the slot before may survive — not its
// completion state, not a READ's scatter list (which caches a region of
// the memory table). The result must be what a fresh WQE would be.
func TestPostOneResetsWQE(t *testing.T) {
	// A field added to either struct must be reset by postOne too.
	if n := reflect.TypeFor[sendWQE]().NumField(); n != 13 {
		t.Fatalf("sendWQE has %d fields; postOne writes 13", n)
	}
	if n := reflect.TypeFor[SendWR]().NumField(); n != 15 {
		t.Fatalf("SendWR has %d fields; postOne writes 15", n)
	}
	a, _, _ := newPair(t, pairOpts{})
	_, mr := a.buffer(t, 64, 0)
	_, omr := a.buffer(t, 64, memreg.AccessLocalWrite)
	qp := a.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
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
		sges: old, length: 16, npkts: 3, firstPSN: 5, signaled: true, rdCounted: true, done: true,
		localDone: true, probe: true, status: WCLocProtErr, rsl: a.pd.ScatterList(old), ref: oldRef}
	wr := SendWR{WRID: 42, Opcode: WRSend, SGEs: sge(mr, 0, 8), Imm: 11}
	if err := qp.postOne(0, &wr); err != nil {
		t.Fatal(err)
	}
	qp.sqEnd-- // not sent
	// The region the WR's list names.
	_, ref, _ := a.pd.CheckSGEsRef(wr.SGEs, 0)
	want := sendWQE{wr: SendWR{WRID: 42, Opcode: WRSend, SGEs: w.sges, Imm: 11}, sges: w.sges, length: 8,
		signaled: qp.init.SigAll, ref: ref}
	if !reflect.DeepEqual(*w, want) {
		t.Fatalf("reused WQE:\n%+v\nwant\n%+v", *w, want)
	}
	if !reflect.DeepEqual(w.sges, wr.SGEs) || &w.sges[0] == &wr.SGEs[0] {
		t.Fatalf("WQE SGEs %v, want a copy of %v", w.sges, wr.SGEs)
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
