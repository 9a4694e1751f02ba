package transport

import "time"

// timers is the QP's timer state: the local ACK (retransmission) deadline
// and the RNR back-off. Both run in the device's timerQueue (timerq.go),
// through the QP's entries tq[timerRetrans] and tq[timerRNR], as does the
// DCQCN pacing timer (tq[timerPace], cc.go). The ACK
// timer is re-armed lazily: progress only marks it pushed, without a
// clock reading, and its expiry (every quarter timeout while armed,
// checkIn) then moves the deadline a timeout past its own reading.
type timers struct {
	deadline   time.Time
	timerArmed bool
	rnrWait    bool // an RNR NAK stopped the requester until the RNR timer fires
	// inPost is set while PostSend runs: the requester's armRetrans
	// waits (armDue) until PostSend has handed its packets to the link,
	// so that reading the clock and queueing the timer do not delay the
	// request (a ping-pong's answer) on its way out.
	inPost, armDue bool
	// pushed records progress since the timer was armed (armRetrans on
	// an armed timer): the expiry then moves deadline a timeout past its
	// own reading of the clock instead of resending.
	pushed bool
	// coldIdle makes armRetrans cancel the ACK timer when the QP goes
	// idle. A QP that goes idle and busy again within a timeout (a
	// ping-pong, a stream of small messages) leaves it armed instead: its
	// next message only pushes the deadline out, and the timer queue's
	// lock and heap are not touched per message. The timer's first
	// expiry that finds nothing outstanding sets coldIdle (the QP stays
	// idle for long: with thousands of QPs taking turns, an expiry per
	// message would cost more than the cancel); an arm within half a
	// timeout of the cancel (idleAt) clears it.
	coldIdle bool
	idleAt   time.Time
}

// initTimers prepares the QP's timer entries.
func (qp *QP) initTimers() {
	for k := range qp.tq {
		qp.tq[k].init(qp, timerKind(k))
	}
}

// onTimer handles an expiry of the QP's timer k. Called with qp.mu held,
// once the device's queue confirmed the expiry still stands.
func (qp *QP) onTimer(k timerKind) {
	switch k {
	case timerRetrans:
		qp.onRetransTimer()
	case timerRNR:
		qp.onRNRTimer()
	case timerPace:
		qp.onPaceTimer()
	}
}

// fireTimer is the device timer queue's callback: it runs the expiry of e
// under its QP's lock unless the QP re-armed or cancelled e since it was
// found due.
func (d *Device) fireTimer(e *timerEntry) {
	qp := e.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if d.tq.take(e) {
		qp.onTimer(e.kind)
		d.sched.account(qp)
	}
}

// stopTimersLocked cancels the QP's timers and clears their state.
func (qp *QP) stopTimersLocked() {
	for k := range qp.tq {
		qp.dev.tq.cancel(&qp.tq[k])
	}
	qp.tmr = timers{}
	qp.dev.sched.forget(qp)
	qp.dropSpare()
	qp.cc.paceArmed = false
}

// startRNRWait stops the requester for d (an RNR NAK's timer); onRNRTimer
// resumes it.
func (qp *QP) startRNRWait(d time.Duration) {
	qp.tmr.rnrWait = true
	qp.dev.tq.arm(&qp.tq[timerRNR], qp.dev.clock.Now(), d)
}

// armRetrans pushes the local ACK deadline out by one timeout and arms
// the timer if needed. Once nothing is outstanding it cancels the timer:
// a QP that went idle leaves the device's queue instead of expiring there
// a timeout later for nothing (with thousands of QPs taking turns, that
// would be one expiry per message).
//
// A QP that goes idle and busy again quickly keeps its timer armed while
// idle (timers.coldIdle); its expiry then finds nothing outstanding and
// ends there.
func (qp *QP) armRetrans() {
	if qp.timeout == 0 || !qp.comp.outstanding() {
		if qp.tmr.timerArmed && (qp.tmr.coldIdle || qp.timeout == 0) {
			qp.tmr.timerArmed = false
			qp.dev.tq.cancel(&qp.tq[timerRetrans])
			qp.tmr.idleAt = qp.now()
			qp.dropSpare()
		}
		return
	}
	if qp.tmr.timerArmed && qp.dev.lazyPush {
		// Armed: note the progress and read no clock (one reading per
		// message was ~4 % of a polled ping-pong's CPU). The expiry
		// reads the clock and, finding pushed, waits a whole timeout from
		// then (pushDeadline).
		qp.tmr.pushed = true
		return
	}
	now := qp.now()
	to := qp.retransTimeout()
	if !qp.tmr.timerArmed && qp.tmr.coldIdle && now.Sub(qp.tmr.idleAt) < qp.timeout/2 {
		qp.tmr.coldIdle = false // busy again soon after the cancel
	}
	// Never earlier than a deadline already set: a batch's clock reading
	// may be older than a PostSend's on another goroutine.
	if d := now.Add(to); !qp.tmr.timerArmed || d.After(qp.tmr.deadline) {
		qp.tmr.deadline = d
	}
	if !qp.tmr.timerArmed {
		qp.tmr.pushed = false
		qp.tmr.timerArmed = true
		qp.dev.tq.arm(&qp.tq[timerRetrans], now, qp.checkIn(to))
	}
}

// retransSlackDiv divides the ACK timeout into the lazily pushed timer's
// check interval (checkIn): a push is seen at most timeout/retransSlackDiv
// after it happened, so a request or ACK lost after the last progress is
// found between one timeout and 1 + 1/retransSlackDiv timeouts after it,
// for retransSlackDiv expiries per timeout while the timer is armed (one
// did before, and a loss then waited up to two timeouts).
const retransSlackDiv = 4

// checkIn returns how long after now the ACK timer's entry is to fire,
// d before its deadline. With exact pushes (no lazyPush) that is the
// deadline itself: every push moved it. With lazy pushes the entry fires
// at least every timeout/retransSlackDiv, so that the expiry that finds a
// push (pushDeadline) reads the clock at most that long after it.
func (qp *QP) checkIn(d time.Duration) time.Duration {
	if qp.dev.lazyPush {
		if c := qp.retransTimeout() / retransSlackDiv; c > 0 && d > c {
			return c
		}
	}
	return d
}

// retransTimeout is the local ACK timeout the timer waits: the QP's, or
// selective repeat's estimate (srRTO).
func (qp *QP) retransTimeout() time.Duration {
	if qp.sr != nil {
		return qp.srRTO()
	}
	return qp.timeout
}

// pushDeadline re-arms the ACK timer at an expiry before its deadline.
// After armRetrans noted progress (pushed), the deadline first moves to a
// whole timeout from now. On lazy pushes the entry fires every
// timeout/retransSlackDiv (checkIn) until the deadline, so the expiry
// that sees a push comes at most that long after it: a request or ACK
// lost after the last progress waits at least one timeout and at most
// 1 + 1/retransSlackDiv (1.25) before it counts as lost; a timer pushed
// per message with a clock reading each time waits exactly one.
func (qp *QP) pushDeadline(now time.Time) {
	if qp.tmr.pushed {
		qp.tmr.pushed = false
		if d := now.Add(qp.retransTimeout()); d.After(qp.tmr.deadline) {
			qp.tmr.deadline = d
		}
	}
	qp.tmr.timerArmed = true
	qp.dev.tq.arm(&qp.tq[timerRetrans], now, qp.checkIn(qp.tmr.deadline.Sub(now)))
}

// onRetransTimer is the local ACK timeout. Called with qp.mu held.
func (qp *QP) onRetransTimer() {
	qp.tmr.timerArmed = false
	if !qp.comp.outstanding() && !qp.destroyed && qp.timeout != 0 {
		// Idle. The entry fires at the deadline it was queued with, which
		// later messages only pushed out (deadline): if one came within
		// the last timeout, the QP is busy now and then — keep the
		// timer until the deadline. Idle for a whole timeout: cancel on
		// idle from now on (armRetrans).
		if now := qp.dev.clock.Now(); (qp.tmr.pushed || now.Before(qp.tmr.deadline)) && !qp.tmr.coldIdle {
			qp.pushDeadline(now)
			return
		}
		qp.tmr.pushed = false
		qp.tmr.coldIdle = true
		qp.dropSpare()
		return
	}
	st := qp.attr.State
	if qp.destroyed || (st != QPSRTS && st != QPSSQD) || qp.timeout == 0 || !qp.comp.outstanding() || qp.tmr.rnrWait {
		return
	}
	now := qp.dev.clock.Now()
	if qp.tmr.pushed || now.Before(qp.tmr.deadline) {
		qp.pushDeadline(now)
		return
	}
	if qp.sr == nil && qp.comp.excuseBusy() {
		// The rest of a READ's old response flight kept arriving: the
		// peer is busy, not silent. Wait a timeout more for the answer
		// to the re-request, without spending a retry or resending.
		inc(&qp.dev.ctr.AckTimeoutBusy)
		if qp.trace != nil {
			qp.trace("timeout comp.psn %v excused: stale READ responses arrived", qp.comp.oldestUnacked())
		}
		qp.tmr.pushed = true
		qp.pushDeadline(now)
		return
	}
	if qp.behind(now) && qp.comp.lateRun < maxLateRun {
		// This process was behind: the peer's ACK may be waiting unread
		// (in the socket, or in a batch not handled yet). That is no
		// silence of the peer: resend, but do not spend a retry on it
		// (ack_timeout_late tells it apart from local_ack_timeout_err).
		inc(&qp.dev.ctr.AckTimeoutLate)
		qp.comp.lateRun++
		if qp.sr == nil {
			qp.comp.retryCnt++ // retry takes it back
		} else {
			qp.sr.late = true // srTimeout spends no retry on it
		}
	} else {
		inc(&qp.dev.ctr.LocalAckTimeout)
	}
	if qp.trace != nil {
		qp.trace("timeout comp.psn %v", qp.comp.oldestUnacked())
	}
	if qp.sr != nil {
		qp.srTimeout()
	} else {
		qp.comp.retry()
	}
	qp.settle()
	qp.flushOut()
}

// maxLateRun bounds the expiries in a row that spend no retry (behind):
// a process that is always behind still finds a dead peer, later.
const maxLateRun = 16

// behind reports, at an ACK timer expiry at now, that this process was
// behind on its input, so the expiry says nothing about the peer: the
// timer itself ran more than a whole timeout late (the process was not
// scheduled), or the device's receive side has been inside one batch for
// longer than a timeout (descheduled in the middle of it; the ACK may be
// in that batch or queued behind it), or datagrams wait unread in the
// link's socket (udp.BacklogLink: the receive goroutine was not
// scheduled to read them) — or one of the last two holds for another
// device of this process (the peer may be in it: tests, a loopback
// soak). Wall clock only (and a ManualClock with lateTimers, for the
// first, third and fourth tests, on this device).
func (qp *QP) behind(now time.Time) bool {
	wall := false
	switch c := qp.dev.clock.(type) {
	case RealClock:
		wall = true
	case *ManualClock:
		if !c.lateTimers {
			return false
		}
	default:
		return false
	}
	if now.Sub(qp.tmr.deadline) > qp.timeout {
		return true
	}
	// The receive goroutine stuck in a batch (a wall-clock reading), or
	// datagrams unread in the socket: it was not scheduled to read them
	// (the ACK may be among them). Then the same for the process's other
	// devices: the peer may be one of them.
	return qp.dev.inputBehind(qp.timeout) || (wall && qp.dev.othersBehind(qp.timeout))
}

// onRNRTimer ends an RNR back-off: the requester resends from the NAKed
// PSN. Called with qp.mu held.
func (qp *QP) onRNRTimer() {
	if !qp.tmr.rnrWait {
		return
	}
	qp.tmr.rnrWait = false
	qp.req.progress()
	qp.settle()
	qp.flushOut()
}

// now returns the time for the QP's timers: the clock, or inside a
// received batch the batch's one reading of it (Device.rxNow), so that
// the ACK deadline pushed out by every READ response or ACK costs one
// clock reading per batch. A deadline is then early by at most the time
// the batch took before the packet (microseconds, against ACK timeouts of
// milliseconds; nothing changes for a ManualClock not advanced during a
// batch). Called with qp.mu held.
func (qp *QP) now() time.Time {
	if !qp.rxIn {
		return qp.dev.now()
	}
	c := &qp.dev.rxNow
	if !c.ok {
		c.t, c.ok = qp.dev.now(), true
	}
	return c.t
}
