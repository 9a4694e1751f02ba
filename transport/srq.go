package transport

import (
	"fmt"
	"sync"

	"github.com/gorocev2/rocev2/memreg"
)

// SRQAttr are the attributes of a shared receive queue.
type SRQAttr struct {
	// MaxWR is how many receive WRs the SRQ holds (1..65536).
	MaxWR int
	// MaxSGE bounds the SGEs per WR (1..32; default 1).
	MaxSGE int
	// Limit arms the SRQ limit event: when the number of posted WRs falls
	// below Limit, the device raises EventSRQLimitReached once and the
	// limit disarms (0: not armed). Modify re-arms it.
	Limit int
}

// SRQ is a shared receive queue: the receive WRs of every QP attached to
// it (QPInitAttr.SRQ). A message takes the oldest WR when it starts; an
// empty SRQ makes an RC responder send RNR NAKs, as a QP's empty receive
// queue does. All methods are safe for concurrent use.
type SRQ struct {
	dev    *Device
	pd     *memreg.PD
	maxSGE int

	mu        sync.Mutex
	rq        []recvWQE
	head, end uint64
	limit     int

	users     int  // QPs attached (under dev.mu)
	destroyed bool // under dev.mu
	dead      bool // under mu: Destroy ran; posting is refused
}

// CreateSRQ creates a shared receive queue in pd.
func (d *Device) CreateSRQ(pd *memreg.PD, a SRQAttr) (*SRQ, error) {
	if pd == nil {
		return nil, errorf(ErrInvalidConfig, "CreateSRQ: nil pd")
	}
	if pd.Table() != d.table {
		return nil, errorf(ErrWrongDevice, "CreateSRQ: pd")
	}
	if a.MaxWR <= 0 || a.MaxWR > 1<<16 {
		return nil, errorf(ErrInvalidConfig, "CreateSRQ: max_wr %d out of range 1..%d", a.MaxWR, 1<<16)
	}
	if a.MaxSGE == 0 {
		a.MaxSGE = 1
	}
	if a.MaxSGE < 0 || a.MaxSGE > 32 {
		return nil, errorf(ErrInvalidConfig, "CreateSRQ: max_sge %d out of range 1..32", a.MaxSGE)
	}
	if a.Limit < 0 || a.Limit > a.MaxWR {
		return nil, errorf(ErrInvalidConfig, "CreateSRQ: srq_limit %d out of range 0..%d", a.Limit, a.MaxWR)
	}
	s := &SRQ{dev: d, pd: pd, maxSGE: a.MaxSGE, rq: make([]recvWQE, a.MaxWR), limit: a.Limit}
	for i := range s.rq {
		s.rq[i].sges = make([]memreg.SGE, 0, a.MaxSGE)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isClosed() {
		return nil, ErrClosed
	}
	if err := pd.Acquire(); err != nil {
		return nil, fmt.Errorf("transport: CreateSRQ: pd: %w", err)
	}
	d.srqs[s] = struct{}{}
	return s, nil
}

// PD returns the protection domain the SRQ was created in.
func (s *SRQ) PD() *memreg.PD { return s.pd }

// PostRecv posts receive WRs to the SRQ, checked as QP.PostRecv checks
// them; the first refused one stops posting and is named in a *WRError.
func (s *SRQ) PostRecv(wrs ...RecvWR) error {
	if s.dev.isClosed() {
		return errorf(ErrClosed, "SRQ.PostRecv")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return errorf(ErrDestroyed, "SRQ.PostRecv")
	}
	for i := range wrs {
		wr := &wrs[i]
		bad := func(field, msg string, kind, err error) error {
			return &WRError{Op: "SRQ.PostRecv", Index: i, WRID: wr.WRID, Field: field, Msg: msg, Kind: kind, Err: err}
		}
		if s.end-s.head >= uint64(len(s.rq)) {
			return bad("", fmt.Sprintf("%d WRs outstanding (max_wr)", len(s.rq)), ErrQueueFull, nil)
		}
		if len(wr.SGEs) > s.maxSGE {
			return bad("num_sge", fmt.Sprintf("%d SGEs > max_sge %d", len(wr.SGEs), s.maxSGE), ErrInvalidWR, nil)
		}
		var total uint64
		for j := range wr.SGEs {
			n, err := s.pd.CheckSGEs(wr.SGEs[j:j+1], memreg.AccessLocalWrite)
			if err != nil {
				return bad(sgeField(s.pd, j, wr.SGEs[j], memreg.AccessLocalWrite, err), fmt.Sprintf("lkey %#x", wr.SGEs[j].LKey), ErrInvalidWR, err)
			}
			total += n
		}
		r := &s.rq[s.end%uint64(len(s.rq))]
		r.wrid = wr.WRID
		r.sges = copySGEs(r.sges, wr.SGEs)
		r.ref = nil // checked element by element: no memreg.Ref
		r.length = total
		s.end++
	}
	return nil
}

// take moves the oldest WR into dst (whose sges has room for maxSGE); it
// reports false when the SRQ is empty. Crossing below the armed limit
// raises EventSRQLimitReached and disarms it.
func (s *SRQ) take(dst *recvWQE) bool {
	s.mu.Lock()
	if s.head == s.end {
		s.mu.Unlock()
		return false
	}
	r := &s.rq[s.head%uint64(len(s.rq))]
	dst.wrid, dst.length = r.wrid, r.length
	dst.sges = append(dst.sges[:0], r.sges...)
	s.head++
	fire := s.limit > 0 && int(s.end-s.head) < s.limit
	if fire {
		s.limit = 0
	}
	s.mu.Unlock()
	if fire {
		s.dev.raise(AsyncEvent{Type: EventSRQLimitReached, SRQ: s})
	}
	return true
}

// Modify sets (re-arms) the SRQ limit, as ibv_modify_srq with
// IBV_SRQ_LIMIT; 0 disarms it.
func (s *SRQ) Modify(limit int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return errorf(ErrDestroyed, "SRQ.Modify")
	}
	if limit < 0 || limit > len(s.rq) {
		return errorf(ErrInvalidAttr, "SRQ.Modify: srq_limit %d out of range 0..%d", limit, len(s.rq))
	}
	s.limit = limit
	return nil
}

// Query returns the SRQ's attributes; Limit is 0 once the limit event has
// fired.
func (s *SRQ) Query() SRQAttr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SRQAttr{MaxWR: len(s.rq), MaxSGE: s.maxSGE, Limit: s.limit}
}

// Len returns the number of receive WRs posted and not yet taken.
func (s *SRQ) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.end - s.head)
}

// Destroy removes the SRQ. It fails with ErrBusy while QPs are attached.
// Its posted WRs are dropped without completions, as verbs does; PostRecv
// and Modify then fail with ErrDestroyed. On a closed device (whose Close
// released the SRQ) it returns ErrClosed.
func (s *SRQ) Destroy() error {
	d := s.dev
	d.mu.Lock()
	switch {
	case d.isClosed():
		d.mu.Unlock()
		return errorf(ErrClosed, "SRQ.Destroy")
	case s.destroyed:
		d.mu.Unlock()
		return errorf(ErrDestroyed, "SRQ.Destroy")
	case s.users > 0:
		n := s.users
		d.mu.Unlock()
		return errorf(ErrBusy, "SRQ.Destroy: %d QPs are attached", n)
	}
	s.destroyed = true
	delete(d.srqs, s)
	d.mu.Unlock()
	s.mu.Lock()
	s.dead = true
	for ; s.head != s.end; s.head++ { // dropped: nothing keeps their SGEs
		r := &s.rq[s.head%uint64(len(s.rq))]
		r.sges = r.sges[:0]
	}
	s.mu.Unlock()
	s.pd.Release()
	return nil
}

// nextRecv returns the receive WQE the next message lands in: the head of
// the QP's receive queue or, with an SRQ, the WQE taken from it (taking
// one if the QP holds none). nil means there is none (RNR). Repeated calls
// return the same WQE until consumeRecv.
func (qp *QP) nextRecv() *recvWQE {
	if qp.srq == nil {
		if qp.rqHead == qp.rqEnd {
			return nil
		}
		return qp.rqAt(qp.rqHead)
	}
	if !qp.resp.srqHeld {
		if !qp.srq.take(&qp.resp.srqWQE) {
			return nil
		}
		qp.resp.srqHeld = true
	}
	return &qp.resp.srqWQE
}

// consumeRecv retires the WQE nextRecv returned.
func (qp *QP) consumeRecv() {
	if qp.srq == nil {
		qp.rqHead++
	} else {
		qp.resp.srqHeld = false
	}
}
