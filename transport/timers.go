package transport

// armRetrans pushes the local ACK deadline out by one timeout and arms
// the timer if needed.
func (qp *QP) armRetrans() {
	if qp.timeout == 0 || !qp.outstanding() {
		return
	}
	qp.comp.deadline = qp.dev.clock.Now().Add(qp.timeout)
	if !qp.comp.timerArmed {
		qp.comp.timerArmed = true
		qp.retransTimer.Reset(qp.timeout)
	}
}

// onRetransTimer is the local ACK timeout.
func (qp *QP) onRetransTimer() {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	qp.comp.timerArmed = false
	st := qp.attr.State
	if qp.destroyed || (st != QPSRTS && st != QPSSQD) || qp.timeout == 0 || !qp.outstanding() || qp.comp.rnrWait {
		return
	}
	now := qp.dev.clock.Now()
	if now.Before(qp.comp.deadline) {
		qp.comp.timerArmed = true
		qp.retransTimer.Reset(qp.comp.deadline.Sub(now))
		return
	}
	inc(&qp.dev.ctr.LocalAckTimeout)
	if qp.trace != nil {
		qp.trace("timeout comp.psn %v", qp.comp.psn)
	}
	qp.retry()
	qp.settle()
	qp.flushOut()
}

// onRNRTimer ends an RNR back-off: the requester resends from the NAKed PSN.
func (qp *QP) onRNRTimer() {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if !qp.comp.rnrWait {
		return
	}
	qp.comp.rnrWait = false
	qp.reqProgress()
	qp.settle()
	qp.flushOut()
}
