package transport

import "time"

// timers is the QP's timer state: the local ACK (retransmission) deadline
// and the RNR back-off. One Timer each; the ACK timer is re-armed lazily:
// progress only moves the deadline, and an expiry before it re-arms.
type timers struct {
	deadline   time.Time
	timerArmed bool
	rnrWait    bool // an RNR NAK stopped the requester until the RNR timer fires
}

// startRNRWait stops the requester for d (an RNR NAK's timer); onRNRTimer
// resumes it.
func (qp *QP) startRNRWait(d time.Duration) {
	qp.tmr.rnrWait = true
	qp.rnrTimer.Reset(d)
}

// armRetrans pushes the local ACK deadline out by one timeout and arms
// the timer if needed.
func (qp *QP) armRetrans() {
	if qp.timeout == 0 || !qp.outstanding() {
		return
	}
	qp.tmr.deadline = qp.dev.clock.Now().Add(qp.timeout)
	if !qp.tmr.timerArmed {
		qp.tmr.timerArmed = true
		qp.retransTimer.Reset(qp.timeout)
	}
}

// onRetransTimer is the local ACK timeout.
func (qp *QP) onRetransTimer() {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	qp.tmr.timerArmed = false
	st := qp.attr.State
	if qp.destroyed || (st != QPSRTS && st != QPSSQD) || qp.timeout == 0 || !qp.outstanding() || qp.tmr.rnrWait {
		return
	}
	now := qp.dev.clock.Now()
	if now.Before(qp.tmr.deadline) {
		qp.tmr.timerArmed = true
		qp.retransTimer.Reset(qp.tmr.deadline.Sub(now))
		return
	}
	inc(&qp.dev.ctr.LocalAckTimeout)
	if qp.trace != nil {
		qp.trace("timeout comp.psn %v", qp.oldestUnacked())
	}
	qp.retry()
	qp.settle()
	qp.flushOut()
}

// onRNRTimer ends an RNR back-off: the requester resends from the NAKed PSN.
func (qp *QP) onRNRTimer() {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if !qp.tmr.rnrWait {
		return
	}
	qp.tmr.rnrWait = false
	qp.reqProgress()
	qp.settle()
	qp.flushOut()
}
