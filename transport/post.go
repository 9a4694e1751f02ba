package transport

import (
	"fmt"

	"github.com/gorocev2/rocev2/memreg"
)

// PostSend queues send work requests. Each WR is validated (opcode, SGE
// count, local keys and rights, atomic alignment); the first invalid WR
// stops posting and the error names it and its field. WRs before it stay
// posted. A full send queue returns ErrQueueFull. The QP must be in RTS or
// SQD, or in ERR (then the WRs complete with WCWRFlushErr).
func (qp *QP) PostSend(wrs ...SendWR) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	st := qp.attr.State
	if st != QPSRTS && st != QPSSQD && st != QPSErr {
		return fmt.Errorf("transport: PostSend qp %#x: state %v: %w", qp.qpn, st, ErrInvalidState)
	}
	var err error
	for i := range wrs {
		if err = qp.postOne(i, &wrs[i]); err != nil {
			break
		}
	}
	if qp.attr.State == QPSErr {
		qp.toError()
	} else {
		qp.reqProgress()
	}
	qp.flushOut()
	return err
}

func (qp *QP) postOne(i int, wr *SendWR) error {
	if qp.sqEnd-qp.sqHead >= uint64(len(qp.sq)) {
		return fmt.Errorf("transport: PostSend wr %d: %d WRs outstanding: %w", i, len(qp.sq), ErrQueueFull)
	}
	if len(wr.SGEs) > qp.init.MaxSGE {
		return fmt.Errorf("transport: PostSend wr %d: %d SGEs > max_sge %d: %w", i, len(wr.SGEs), qp.init.MaxSGE, ErrInvalidWR)
	}
	var acc memreg.Access
	switch wr.Opcode {
	case WRSend, WRSendImm, WRSendInv, WRWrite, WRWriteImm:
	case WRRead, WRCompareSwap, WRFetchAdd:
		acc = memreg.AccessLocalWrite
	default:
		return fmt.Errorf("transport: PostSend wr %d: opcode %v: %w", i, wr.Opcode, ErrInvalidWR)
	}
	var total uint64
	for j := range wr.SGEs {
		n, err := qp.pd.CheckSGEs(wr.SGEs[j:j+1], acc)
		if err != nil {
			return fmt.Errorf("transport: PostSend wr %d: sge[%d].lkey %#x: %w", i, j, wr.SGEs[j].LKey, err)
		}
		total += n
	}
	if total > 1<<31 {
		return fmt.Errorf("transport: PostSend wr %d: length %d > 2^31: %w", i, total, ErrInvalidWR)
	}
	if wr.Opcode == WRCompareSwap || wr.Opcode == WRFetchAdd {
		if total != 8 {
			return fmt.Errorf("transport: PostSend wr %d: atomic sge length %d, want 8: %w", i, total, ErrInvalidWR)
		}
		if wr.RemoteAddr&7 != 0 {
			return fmt.Errorf("transport: PostSend wr %d: remote_addr %#x not 8-byte aligned: %w", i, wr.RemoteAddr, ErrInvalidWR)
		}
	}
	w := &qp.sq[qp.sqEnd%uint64(len(qp.sq))]
	sges := append(w.sges[:0], wr.SGEs...)
	// Field by field, so that the caller's SGE slice is not retained
	// (and does not escape).
	*w = sendWQE{wr: SendWR{WRID: wr.WRID, Opcode: wr.Opcode, SGEs: sges, Flags: wr.Flags, Imm: wr.Imm,
		InvRKey: wr.InvRKey, RemoteAddr: wr.RemoteAddr, RKey: wr.RKey, CompareAdd: wr.CompareAdd, Swap: wr.Swap},
		sges: sges, length: uint32(total)}
	if wr.Opcode == WRRead {
		w.rsl = qp.pd.ScatterList(sges)
	}
	w.signaled = qp.init.SigAll || wr.Flags&SendSignaled != 0
	qp.sqEnd++
	return nil
}

// PostRecv queues receive work requests. The QP must not be in RESET.
// SGEs are checked for local write access; the first invalid WR stops
// posting and the error names it.
func (qp *QP) PostRecv(wrs ...RecvWR) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.attr.State == QPSReset {
		return fmt.Errorf("transport: PostRecv qp %#x: state %v: %w", qp.qpn, qp.attr.State, ErrInvalidState)
	}
	for i := range wrs {
		wr := &wrs[i]
		if qp.rqEnd-qp.rqHead >= uint64(len(qp.rq)) {
			return fmt.Errorf("transport: PostRecv wr %d: %d WRs outstanding: %w", i, len(qp.rq), ErrQueueFull)
		}
		if len(wr.SGEs) > qp.init.MaxSGE {
			return fmt.Errorf("transport: PostRecv wr %d: %d SGEs > max_sge %d: %w", i, len(wr.SGEs), qp.init.MaxSGE, ErrInvalidWR)
		}
		var total uint64
		for j := range wr.SGEs {
			n, err := qp.pd.CheckSGEs(wr.SGEs[j:j+1], memreg.AccessLocalWrite)
			if err != nil {
				return fmt.Errorf("transport: PostRecv wr %d: sge[%d].lkey %#x: %w", i, j, wr.SGEs[j].LKey, err)
			}
			total += n
		}
		r := &qp.rq[qp.rqEnd%uint64(len(qp.rq))]
		r.wrid = wr.WRID
		r.sges = append(r.sges[:0], wr.SGEs...)
		r.length = total
		qp.rqEnd++
		if qp.attr.State == QPSErr {
			qp.toError()
		}
	}
	return nil
}
