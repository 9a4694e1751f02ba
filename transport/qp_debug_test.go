package transport

import "fmt"

// debugState describes the QP's protocol state (for test failure messages).
func (qp *QP) debugState() string {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	s := fmt.Sprintf("qpn %#x %v req.psn %v maxPSN %v curPkt %d rdOut %d comp.psn %v retryCnt %d retryPending %v rnrWait %v sq[%d,%d,%d) resp.psn %v msn %d nakSent %v op %d",
		qp.qpn, qp.attr.State, qp.req.psn, qp.req.maxPSN, qp.req.curPkt, qp.req.rdOut, qp.comp.psn, qp.comp.retryCnt, qp.comp.retryPending, qp.tmr.rnrWait,
		qp.sqHead, qp.sqCur, qp.sqEnd, qp.resp.psn, qp.resp.msn, qp.resp.nakSent, qp.resp.op)
	for i := qp.sqHead; i != qp.sqEnd && i < qp.sqHead+4; i++ {
		w := qp.sqAt(i)
		s += fmt.Sprintf("\n  wqe %d: %v len %d first %v npkts %d done %v status %v", w.wr.WRID, w.wr.Opcode, w.length, w.firstPSN, w.npkts, w.done, w.status)
	}
	for _, x := range qp.resp.res {
		if x.valid {
			s += fmt.Sprintf("\n  res atomic=%v [%v,%v] len %d", x.atomic, x.firstPSN, x.lastPSN, x.length)
		}
	}
	return s
}
