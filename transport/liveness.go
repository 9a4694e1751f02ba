package transport

import (
	"context"
	"fmt"
)

// Liveness: how a QP tells its owner that it failed, how a connection
// manager proves an idle peer alive, and how a poster waits for room.

// ProbeWRID is the wr_id of the keep-alive probes Probe posts. A probe
// never produces a completion; the *WCError that Err returns after a
// probe failed (retry exceeded: the peer is gone) carries it.
const ProbeWRID uint64 = 0xffff_ffff_ffff_fffe

// Failed returns a channel that is closed when the QP enters the error
// state: by itself (a work request failed — retry or RNR retry exceeded, a
// remote access or operational error, a local error —, its responder sent
// a fatal NAK, its CQ overflowed), through Modify or Destroy, or because
// the device closed. Err then says why. A QP taken back to RESET gets a
// new channel (call Failed again).
func (qp *QP) Failed() <-chan struct{} {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.failCh
}

// Err returns why the QP is in the error state, nil while it is not (or
// when the application moved it there with Modify): the *WCError of the
// work request that failed (errors.As, then its Status: WCRetryExcErr
// means the peer stopped answering — WRID ProbeWRID if that was a
// keep-alive probe —, WCRemAccessErr, WCRemOpErr, ...), the NAK its
// responder sent, ErrCQOverflow, ErrClosed after Device.Close, or
// ErrDestroyed (and the cause given to DestroyCause).
func (qp *QP) Err() error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if !qp.failed {
		return nil
	}
	return qp.failErr
}

// markFailed closes failCh once the QP is in ERR. Under qp.mu.
func (qp *QP) markFailed() {
	if qp.failed || qp.failCh == nil {
		return
	}
	qp.failed = true
	close(qp.failCh)
}

// Activity returns the number of packets the QP has accepted from its
// peer (requests, responses, ACKs and NAKs alike). A connection manager
// that sees it unchanged over an interval knows the peer was silent.
func (qp *QP) Activity() uint64 {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.heard
}

// Probe posts a keep-alive probe on an RC QP in RTS: a zero-length RDMA
// WRITE, which any verbs peer executes without its application's help —
// IBTA C9-88: a zero-length RDMA operation checks no R_Key or address;
// Linux rxe's check_rkey skips it too — as long as the peer's QP grants
// remote write, which Linux's CM always sets on the QPs it connects. Its
// ACK proves the peer alive (Activity moves); a dead peer makes it fail
// like any request once the QP's retry count is spent: the QP moves to
// ERR, Failed is closed and Err returns a *WCError with WRID ProbeWRID.
// The probe produces no completion, does not count against max_send_wr
// and is sent behind what the send queue holds. While one is
// outstanding, Probe does nothing. It returns an error matching
// ErrInvalidState when the QP is not in RTS (ErrClosed, ErrDestroyed
// when it is gone).
func (qp *QP) Probe() error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if err := qp.postable("Probe"); err != nil {
		return err
	}
	if qp.init.Type != QPTypeRC {
		return fmt.Errorf("transport: Probe qp %#x: %v QP (only RC QPs are probed): %w", qp.qpn, qp.init.Type, ErrInvalidConfig)
	}
	if st := qp.attr.State; st != QPSRTS {
		return fmt.Errorf("transport: Probe qp %#x: state %v: %w", qp.qpn, st, ErrInvalidState)
	}
	if qp.probes > 0 {
		return nil
	}
	qp.sqRoom()
	w := qp.sqAt(qp.sqEnd)
	*w = sendWQE{wr: SendWR{WRID: ProbeWRID, Opcode: WRWrite}, sges: w.sges[:0], probe: true}
	qp.sqEnd++
	qp.probes++
	inc(&qp.dev.ctr.KeepAliveProbes)
	qp.afterPost()
	return nil
}

// afterPost sends what a post queued and settles the QP. Under qp.mu.
func (qp *QP) afterPost() {
	if qp.attr.State == QPSErr {
		qp.toError()
	} else {
		qp.tmr.inPost = true
		qp.req.progress()
		qp.tmr.inPost = false
	}
	qp.settle()
	qp.flushOut()
	if qp.tmr.armDue {
		qp.tmr.armDue = false
		if qp.attr.State != QPSErr && !qp.armRetransFast() {
			qp.armRetrans()
		}
	}
}

// sqFree returns how many more work requests the send queue takes.
// Under qp.mu.
func (qp *QP) sqFree() int {
	return qp.init.MaxSendWR - int(qp.sqEnd-qp.sqHead) + qp.probes
}

// roomFreed wakes every PostSendContext and WaitSendRoom waiter: a send
// WQE left the queue, or the QP can no longer be posted to. Each looks
// again under qp.mu; those that find no room sleep again. Under qp.mu.
func (qp *QP) roomFreed() {
	if qp.roomSig != nil {
		close(qp.roomSig)
		qp.roomSig = nil
	}
}

// WaitSendRoom blocks until the send queue has room for at least one work
// request, or ctx ends (it returns ctx's error), or the QP can no longer
// be posted to (the error PostSend would return). Room comes back as the
// peer acknowledges requests, which the device's receive goroutine
// handles; the waiter sleeps meanwhile (no polling, no spinning). In ERR
// the queue drains at once (its WRs are flushed).
func (qp *QP) WaitSendRoom(ctx context.Context) error {
	qp.mu.Lock()
	for {
		if err := qp.postable("WaitSendRoom"); err != nil {
			qp.mu.Unlock()
			return err
		}
		if qp.sqFree() > 0 || qp.attr.State == QPSErr {
			qp.mu.Unlock()
			return nil
		}
		if qp.init.MaxSendWR == 0 {
			qp.mu.Unlock()
			return &WRError{Op: "WaitSendRoom", QPN: qp.qpn, Msg: "the QP has no send queue (max_send_wr 0)", Kind: ErrQueueFull}
		}
		if err := qp.sleepForRoom(ctx); err != nil {
			return err
		}
	}
}

// sleepForRoom waits (qp.mu held on entry and, unless it returns an
// error, on return) for roomFreed's signal.
func (qp *QP) sleepForRoom(ctx context.Context) error {
	if qp.roomSig == nil {
		qp.roomSig = make(chan struct{})
	}
	sig := qp.roomSig
	qp.roomWait++
	qp.mu.Unlock()
	d := qp.dev
	// Asleep here, this goroutine receives nothing: let the receive
	// goroutine drive the link (see rxDriver.sleepers).
	d.rx.sleepers.Add(1)
	var err error
	select {
	case <-sig:
	case <-ctx.Done():
		err = ctx.Err()
	case <-d.done:
		err = fmt.Errorf("transport: qp %#x: %w", qp.qpn, ErrClosed)
	}
	d.rx.sleepers.Add(-1)
	qp.mu.Lock()
	qp.roomWait--
	if qp.roomWait == 0 && qp.roomSig != nil {
		qp.roomSig = nil // nobody left to wake: the next waiter makes a new one
	}
	if err != nil {
		qp.mu.Unlock()
	}
	return err
}

// PostSendContext posts wrs like PostSend, but waits for send-queue room
// instead of failing with ErrQueueFull: as many WRs as fit are posted,
// and the call sleeps until acknowledgements make room for the rest (see
// WaitSendRoom). It returns when every WR is posted, or with a *WRError
// naming the first WR not posted: an invalid one (ErrInvalidWR), or, when
// ctx ended first, one matching both ErrQueueFull and ctx's error.
func (qp *QP) PostSendContext(ctx context.Context, wrs ...SendWR) error {
	i := 0
	qp.mu.Lock()
	for {
		if err := qp.postable("PostSendContext"); err != nil {
			qp.mu.Unlock()
			return err
		}
		st := qp.attr.State
		if st != QPSRTS && st != QPSSQD && st != QPSErr {
			qp.mu.Unlock()
			return fmt.Errorf("transport: PostSendContext qp %#x: state %v: %w", qp.qpn, st, ErrInvalidState)
		}
		if qp.init.MaxSendWR == 0 && i < len(wrs) {
			// No send queue: room never comes (postOne says so).
			err := qp.postOne(i, &wrs[i])
			qp.mu.Unlock()
			if we, ok := err.(*WRError); ok {
				we.Op = "PostSendContext"
			}
			return err
		}
		// In ERR too, at most the room there is: afterPost flushes what
		// was posted, and the rest goes in the next turn of the loop.
		k := min(qp.sqFree(), len(wrs)-i)
		var err error
		for j := i; j < i+k; j++ {
			if err = qp.postOne(j, &wrs[j]); err != nil {
				break
			}
		}
		if k > 0 {
			qp.afterPost()
		}
		if err != nil {
			qp.mu.Unlock()
			if we, ok := err.(*WRError); ok {
				we.Op = "PostSendContext"
			}
			return err
		}
		i += k
		if i == len(wrs) {
			qp.mu.Unlock()
			return nil
		}
		if k > 0 && qp.sqFree() > 0 {
			continue // room came back while posting (ERR flushes at once)
		}
		if err := qp.sleepForRoom(ctx); err != nil {
			return &WRError{Op: "PostSendContext", QPN: qp.qpn, Index: i, WRID: wrs[i].WRID,
				Msg: fmt.Sprintf("%d WRs outstanding (max_send_wr)", qp.init.MaxSendWR), Kind: ErrQueueFull, Err: err}
		}
	}
}

// DestroyCause destroys the QP like Destroy; later calls on it, and
// Err, return an error that matches both ErrDestroyed and cause — a
// connection manager passes its own ErrClosed, so that whoever still
// uses the QP of a closed connection learns it in the manager's words.
func (qp *QP) DestroyCause(cause error) error {
	qp.mu.Lock()
	if !qp.destroyed && cause != nil {
		qp.destroyCause = cause
		if !qp.failed {
			qp.failErr = qp.destroyedErr()
		}
	}
	qp.mu.Unlock()
	return qp.Destroy()
}

// destroyedErr is the error calls on a destroyed QP return. Under qp.mu.
func (qp *QP) destroyedErr() error {
	if qp.destroyCause != nil {
		return fmt.Errorf("%w (%w)", ErrDestroyed, qp.destroyCause)
	}
	return ErrDestroyed
}

// Resources counts the objects a device holds now.
type Resources struct {
	QPs          int // QPs the application created (QP1, the GSI, is not counted)
	CQs          int
	SRQs         int
	CompChannels int
}

// Resources returns how many QPs, CQs, SRQs and completion channels the
// device holds: a long-running program watches them to see that nothing
// leaks (rocev2d soak does). A closed device holds none (Close released
// them all).
func (d *Device) Resources() Resources {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.qps)
	if _, ok := d.qps[1]; ok {
		n--
	}
	return Resources{QPs: n, CQs: len(d.cqs), SRQs: len(d.srqs), CompChannels: len(d.chans)}
}
