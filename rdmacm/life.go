package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// ErrStale ends a connection whose peer asked for a new one from the same
// QP (the same address and QPN): the peer lost the old one — it crashed
// and restarted with the same QP numbers (transport.DeviceConfig.FirstQPN
// fixed; by default they start at random), say — so the old one is torn
// down (a DREQ to the peer, the QP to ERR, Done closed), as the IB CM
// asks, and the peer's next attempt connects.
var ErrStale = errors.New("rdmacm: connection replaced: its peer's QP asked to connect again (the peer lost it)")

// errShed ends a half-open connection a listener dropped for a newer
// request when its backlog was full.
var errShed = errors.New("rdmacm: request shed: the listener's backlog was full")

// Cause says what ended a connection, for Stats.Ended.
type Cause uint8

// Causes of a connection's end.
const (
	// CauseLocalClose: Conn.Close, Request.Reject, or a Dial or Accept
	// whose context ended.
	CauseLocalClose Cause = iota + 1
	// CausePeerDisconnect: the peer's DREQ.
	CausePeerDisconnect
	// CausePeerReject: the peer's REJ.
	CausePeerReject
	// CauseStale: the peer asked for a new connection from the same QP
	// (ErrStale).
	CauseStale
	// CauseTimeout: no answer to a REQ, REP or DREQ within the retries.
	CauseTimeout
	// CauseHalfOpenTimeout: a request stayed half-open longer than its
	// listener allows (ListenOptions.HalfOpenTimeout).
	CauseHalfOpenTimeout
	// CauseShed: a half-open request dropped for a newer one when the
	// listener's backlog was full.
	CauseShed
	// CauseDeviceClosed: the device closed.
	CauseDeviceClosed
	// CauseError: the QP could not be set up or connected, or another
	// failure none of the other causes names.
	CauseError
	// CauseQPFailed: the established connection's QP failed
	// (ErrQPFailed).
	CauseQPFailed
	// CauseKeepAlive: the peer answered no keep-alive probe
	// (ErrKeepAlive).
	CauseKeepAlive
	// CauseManagerClosed: Manager.Close.
	CauseManagerClosed
	// CauseUnreachable: the network answered a CM message with an ICMP
	// error (ErrUnreachable): nothing listens on UDP 4791 at the peer's
	// address any more (a requester killed during its handshake, say),
	// or the host is unreachable.
	CauseUnreachable
	numCauses
)

var causeNames = [numCauses]string{"", "local_close", "peer_disconnect", "peer_reject", "stale",
	"timeout", "half_open_timeout", "shed", "device_closed", "error", "qp_failed", "keepalive",
	"manager_closed", "unreachable"}

// String returns the cause's counter name, as "peer_reject".
func (c Cause) String() string {
	if c < numCauses && c > 0 {
		return causeNames[c]
	}
	return "unknown"
}

// life is the part of a Conn this file keeps: what ended it, its place in
// the manager's QPN index and its listener's half-open list, the PD it
// created, and the stale REJ its request met. Under m.mu.
type life struct {
	cause   Cause
	ownPD   *memreg.PD
	indexed bool // in m.byQPN
	half    bool // in listener.half
	queued  bool // in listener.queue (waiting for Next)
	arrived time.Time
	retried bool         // passive side: the requester sent its REQ again (it is there)
	rej     *RejectError // active side: the stale REJ the request met last
	stale   int          // active side: stale REJs met
	// Passive side, Listener.Accept's accept queue (listen.go):
	deferred bool // the request waited for a place in it (Stats.AcceptQueueFull)
	owed     bool // holds a place in it (listener.owed)
	replied  bool // the REP went out
	ready    bool // in listener.ready
	dead     bool // ended in listener.ready (its QP destroyed)
}

// qpnKey names a peer's QP: what a new request must not reuse while a
// connection to it is known (the stale-connection check).
type qpnKey struct {
	addr netip.Addr
	qpn  uint32
}

// maxTimeWait bounds TimeWait whatever the response timeout.
const maxTimeWait = 2 * time.Second

// timeWaitFor is how long an ended connection stays known (to answer a
// duplicate DREQ, and so that its peer's QPN is not taken for a new
// connection at once): the response timeout, at most maxTimeWait.
func timeWaitFor(o *Options) time.Duration { return min(o.ResponseTimeout, maxTimeWait) }

// causeOf names the cause an error stands for, where the code that ended
// the connection did not say.
func causeOf(err error) Cause {
	var rej *RejectError
	switch {
	case errors.As(err, &rej):
		return CausePeerReject
	case errors.Is(err, ErrTimeout):
		return CauseTimeout
	case errors.Is(err, ErrStale):
		return CauseStale
	case errors.Is(err, errShed):
		return CauseShed
	case errors.Is(err, ErrQPFailed):
		return CauseQPFailed
	case errors.Is(err, ErrKeepAlive):
		return CauseKeepAlive
	case errors.Is(err, ErrUnreachable):
		return CauseUnreachable
	case errors.Is(err, errDeviceClosed):
		return CauseDeviceClosed
	case errors.Is(err, errManagerClosed):
		return CauseManagerClosed
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return CauseLocalClose
	}
	return CauseError
}

// endedBy records (and counts) what ended the connection, the first time
// only. Called with m.mu held.
func (c *Conn) endedBy(cause Cause) {
	if c.life.cause != 0 {
		return
	}
	c.life.cause = cause
	c.m.st.ended[cause].Add(1)
}

// indexQPNLocked records the connection under its peer's address and QPN.
func (c *Conn) indexQPNLocked() {
	k := qpnKey{c.peer, c.params.DestQPN}
	if _, busy := c.m.byQPN[k]; !busy {
		c.m.byQPN[k] = c
		c.life.indexed = true
	}
}

// unindexQPNLocked forgets the peer's QPN: a new request from it is no
// longer stale.
func (c *Conn) unindexQPNLocked() {
	if !c.life.indexed {
		return
	}
	c.life.indexed = false
	if k := (qpnKey{c.peer, c.params.DestQPN}); c.m.byQPN[k] == c {
		delete(c.m.byQPN, k)
	}
}

// leaveHalfOpenLocked takes the connection out of its listener's half-open
// list and request queue.
func (c *Conn) leaveHalfOpenLocked() {
	l := c.listener
	if l == nil {
		return
	}
	if c.life.queued {
		c.life.queued = false
		for i, x := range l.queue {
			if x == c {
				l.queue = append(l.queue[:i], l.queue[i+1:]...)
				break
			}
		}
	}
	if !c.life.half {
		return
	}
	c.life.half = false
	for i, x := range l.half {
		if x == c {
			l.half = append(l.half[:i], l.half[i+1:]...)
			break
		}
	}
	if l.perSrc[c.peer]--; l.perSrc[c.peer] <= 0 {
		delete(l.perSrc, c.peer)
	}
}

// staleRetryLocked handles a REJ "stale connection" of our request: the
// peer still knew a connection from our QP and has now torn it down, so
// the request is sent again — once at once, then on the response timer —
// while retries remain. It reports whether the request goes on.
func (c *Conn) staleRetryLocked(rej *RejectError) bool {
	c.life.rej = rej
	c.life.stale++
	if c.retries >= c.max {
		return false
	}
	if c.life.stale == 1 {
		c.retries++
		c.m.st.retransmits.Add(1)
		c.resendLocked()
		c.armLocked(c.retryWaitLocked())
	}
	return true
}

// replaceLocked tears down a connection whose peer asked for a new one
// from the same QP (cm.c's stale-connection case): a half-open one ends
// with a REJ, an established one is disconnected — DREQ to the peer, QP
// to ERR, Done closed — and its peer's QPN is free for the next request
// at once (the peer has shown it lost the old connection).
func (c *Conn) replaceLocked() {
	c.unindexQPNLocked()
	c.endedBy(CauseStale)
	switch c.state {
	case stREQSent, stREQRcvd, stREPSent:
		kind := cm.KindREQ
		if c.state == stREPSent {
			kind = cm.KindREP
		}
		rej := &cm.REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: kind, Reason: cm.RejStaleConn}
		var out [transport.MADSize]byte
		c.m.send(c.peer, c.opts.TrafficClass, c.tid, rej, &out)
		c.finishLocked(ErrStale)
	case stEstablished:
		c.disconnectLocked(ErrStale)
	}
}

// disconnectLocked ends an established connection on the manager's
// initiative: a DREQ to the peer (sent again until its DREP, at most twice
// more, then TimeWait), the QP to ERR and Done closed at once with err.
func (c *Conn) disconnectLocked(err error) {
	if c.state != stEstablished {
		return
	}
	dreq := &cm.DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.params.DestQPN}
	c.state = stDREQSent
	c.max = min(c.opts.MaxRetries, 2)
	c.sendLocked(dreq)
	if c.err == nil {
		c.err = err
	}
	if c.qp != nil {
		c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	}
	c.endedUnacceptedLocked()
	select {
	case <-c.done:
	default:
		close(c.done)
	}
}

// releaseFailed releases what a connection that never reached the
// application created (a failed Dial or Accept). A PD it created that
// still holds memory regions (registered by Prepare) cannot go now; it is
// deallocated when its last region is deregistered, so it does not leak.
func (c *Conn) releaseFailed() {
	c.relMu.Lock()
	defer c.relMu.Unlock()
	c.releaseLocked()
	if pd := c.life.ownPD; pd != nil && len(c.owned) > 0 {
		pd.DeallocWhenIdle()
		c.owned = nil
	}
}

// abandonedDial is a Dial given up before its REP: its REJ (reason
// timeout) went with no remote communication ID, which a passive side on
// a shared address never receives — the address's steering program
// routes CM messages by the communication ID addressed to, and there is
// none. Its REP, when it comes, is answered with a REJ that names it.
type abandonedDial struct {
	peer  netip.Addr
	tos   uint8
	until time.Time
}

// maxAbandoned bounds the abandoned Dials remembered.
const maxAbandoned = 4096

// abandonLocked remembers c, a Dial given up in REQSent, for four of its
// response timeouts (the passive side's REP can come that late). Called
// with m.mu held.
func (m *Manager) abandonLocked(c *Conn) {
	now := m.clock.Now()
	if len(m.abandoned) >= maxAbandoned {
		for id, a := range m.abandoned {
			if now.After(a.until) {
				delete(m.abandoned, id)
			}
		}
		if len(m.abandoned) >= maxAbandoned {
			return
		}
	}
	m.abandoned[c.localID] = abandonedDial{peer: c.peer, tos: c.opts.TrafficClass, until: now.Add(4 * c.opts.ResponseTimeout)}
}

// answerAbandonedLocked answers the REP of an abandoned Dial with a REJ
// (timeout) that names the REP's sender, and reports whether f was one.
// Called with m.mu held.
func (m *Manager) answerAbandonedLocked(mad *transport.MAD, h *cm.HeaderFields, f *cm.REPFields) bool {
	a, ok := m.abandoned[f.RemoteCommID]
	if !ok || a.peer != mad.Src {
		return false
	}
	delete(m.abandoned, f.RemoteCommID)
	if m.clock.Now().After(a.until) {
		return false
	}
	rej := &cm.REJFields{LocalCommID: f.RemoteCommID, RemoteCommID: f.LocalCommID, MessageRejected: cm.KindREP,
		Reason: cm.RejTimeout, RejectedInfoLength: 8}
	putGUID(rej.ARI[:], m.guid)
	var out [transport.MADSize]byte
	m.send(mad.Src, a.tos, h.TransactionID, rej, &out)
	return true
}
