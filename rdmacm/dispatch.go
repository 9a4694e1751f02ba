package rdmacm

// The manager's message handling, in one place: loop takes the device's CM
// MADs off its GSI agent (answers first, then requests fairly per
// source), dispatch decodes each, handle routes it by kind to its handler
// (onREQ .. onSIDRREP, below), and errLoop ends the connections whose CM
// messages the network bounced. The state each handler changes lives in
// Manager (manager.go), Conn (conn.go), Listener (listen.go) and the SIDR
// waits (sidr.go).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
)

// loop handles CM MADs until the device closes: every waiting answer
// first, then the newest requests, one per source in turn (requests queue
// apart, transport.MADAgent.SeparateRequests): a flood of requests neither
// starves the answers that complete handshakes and teardowns nor, from
// one address, another address's requests.
func (m *Manager) loop() {
	a := m.agent
	var answers, reqs []transport.MAD
	for {
		answers, reqs = answers[:0], reqs[:0]
	drain:
		for len(answers) < 4*loopBatch {
			select {
			case mad := <-a.C():
				answers = append(answers, mad)
			default:
				break drain
			}
		}
		reqs = a.TakeRequests(reqs, loopBatch)
		if len(answers) == 0 && len(reqs) == 0 {
			select {
			case mad := <-a.C():
				answers = append(answers, mad)
			case <-a.RequestsReady():
				continue
			case <-a.Done():
				m.shutdown()
				return
			}
		}
		for i := range answers {
			m.dispatch(&answers[i])
		}
		for i := range reqs {
			m.dispatch(&reqs[i])
		}
	}
}

// dispatch decodes and handles one MAD.
func (m *Manager) dispatch(mad *transport.MAD) {
	m.st.madsIn.Add(1)
	h, msg, err := cm.Decode(mad.Data[:])
	if err != nil {
		m.st.malformed.Add(1)
		return
	}
	m.handle(mad, &h, msg)
}

func (m *Manager) handle(mad *transport.MAD, h *cm.HeaderFields, msg cm.Message) {
	if m.leaving.Load() {
		// The peers were told goodbye (farewell): nothing new starts
		// or completes a handshake — it would end without a word.
		switch msg.(type) {
		case *cm.REQFields, *cm.REPFields, *cm.RTUFields, *cm.MRAFields, *cm.SIDRREQFields:
			return
		}
	}
	switch f := msg.(type) {
	case *cm.REQFields:
		m.onREQ(mad, h, f)
	case *cm.MRAFields:
		m.onMRA(mad, f)
	case *cm.REJFields:
		m.onREJ(mad, f)
	case *cm.REPFields:
		m.onREP(mad, h, f)
	case *cm.RTUFields:
		m.onRTU(f)
	case *cm.DREQFields:
		m.onDREQ(mad, h, f)
	case *cm.DREPFields:
		m.onDREP(f)
	case *cm.SIDRREQFields:
		m.onSIDRREQ(mad, h, f)
	case *cm.SIDRREPFields:
		m.onSIDRREP(f)
	default:
		m.st.unknown.Add(1)
	}
}

// onREQ: a connection request (passive side).
func (m *Manager) onREQ(mad *transport.MAD, h *cm.HeaderFields, f *cm.REQFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := remoteKey{mad.Src, f.LocalCommID}
	if m.gaveUp[key] {
		delete(m.gaveUp, key)
		m.st.unknown.Add(1)
		return
	}
	if c := m.remote[key]; c != nil {
		m.st.duplicates.Add(1)
		c.life.retried = true
		switch c.state {
		case stREQRcvd:
			if l := c.listener; l != nil && l.waitsForPlaceLocked(c) {
				// Waiting for a place in Accept's queue: no MRA, so
				// that the requester's retries run on (it fails at
				// their end, not hung by MRA after MRA), as Linux's
				// listener drops a REQ its backlog has no room for
				// "to allow future retries".
				return
			}
			// The application has not answered yet: ask for patience,
			// in the repeated REQ's own traffic class: Linux answers a
			// duplicate REQ (cm_dup_req_handler) with a response MAD
			// whose address comes from the packet received
			// (cm_alloc_response_msg, ib_init_ah_attr_from_wc: the
			// GRH's traffic class), not from the REQ's path.
			mra := &cm.MRAFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageMRAed: cm.KindREQ,
				ServiceTimeout: timeoutExp(c.opts.ResponseTimeout) + 2}
			var out [transport.MADSize]byte
			m.send(c.peer, mad.TOS, c.tid, mra, &out)
		case stREPSent:
			c.resendLocked() // the REP was lost
		}
		return
	}
	// A REQ from the QP of a connection still known (up, half-open, or
	// in TimeWait): the peer lost that connection (it restarted, or lost
	// its CM state). Reject the REQ as stale and tear the old connection
	// down, as cm.c does; the requester's next attempt connects.
	if old := m.byQPN[qpnKey{mad.Src, f.LocalQPN}]; old != nil {
		m.st.rejStale.Add(1)
		m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejStaleConn)
		old.replaceLocked()
		return
	}
	ps, port, ok := cm.SplitServiceID(f.ServiceID)
	l := m.listeners[f.ServiceID]
	if !ok || ps != cm.PSTCP || l == nil || l.closed {
		m.st.rejNoListener.Add(1)
		m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejInvalidServiceID)
		return
	}
	hdr, err := cm.ParseCMAHeader(f.PrivateData[:])
	if err != nil || hdr.Src.Unmap() != mad.Src {
		m.st.malformed.Add(1)
		m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejConsumer)
		return
	}
	if f.TransportServiceType != cm.TransportRC {
		m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejInvalidTransportType)
		return
	}
	if !f.PathMTU.Valid() {
		m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejInvalidMTU)
		return
	}
	for len(l.half) >= l.opts.Backlog {
		if !l.shedLocked(mad.Src, key) {
			return // dropped: its requester sends it again
		}
	}
	c := newConn(m, false, l.opts.Options.withDefaults())
	if c.opts.TrafficClass == 0 {
		// The MADs before Accept (an MRA, a REJ) go with the
		// requester's traffic class, as Linux's CM answers with the
		// REQ's (cm_init_av_for_response).
		c.opts.TrafficClass = f.Primary.TrafficClass
	}
	c.listener = l
	c.localID = m.newLocalID()
	c.remoteID = f.LocalCommID
	c.tid = h.TransactionID
	c.peer = mad.Src
	c.localPort = port
	c.remotePort = hdr.SrcPort
	c.req = *f
	c.remoteECE = ECE{VendorID: f.VendorID, Options: h.AttributeModifier}
	c.params.DestQPN = f.LocalQPN
	c.peerData = append([]byte(nil), f.PrivateData[cm.CMAHeaderSize:]...)
	c.state = stREQRcvd
	m.conns[c.localID] = c
	m.remote[key] = c
	c.indexQPNLocked()
	c.life.half, c.life.queued, c.life.arrived = true, true, m.clock.Now()
	if m.shedIDs[key] {
		// Sent again after we shed it unanswered: a requester that
		// is there. It goes first, and is not shed again.
		delete(m.shedIDs, key)
		c.life.retried = true
	}
	l.half = append(l.half, c)
	l.perSrc[c.peer]++
	l.queue = append(l.queue, c)
	select {
	case l.wake <- struct{}{}:
	default:
	}
	// The listener's bound on the half-open request, whatever the REQ
	// asks; an application that never answers is also given up when the
	// requester would have (its retries of its response timeout).
	wait := min(l.opts.HalfOpenTimeout, cm.Timeout(f.RemoteCMResponseTimeout)*time.Duration(1+f.MaxCMRetries))
	c.acceptTimer = m.clock.AfterFunc(wait, func() { c.halfOpenExpired(l.opts.HalfOpenTimeout) })
}

// onMRA: the peer received our REQ (or REP) and needs more time to
// answer it. As Linux's cm_mra_handler, the first MRA of the message
// counts (REQ_SENT to MRA_REQ_RCVD): the message goes out again after the
// response timeout plus the MRA's service timeout — here at most
// MRAWaitFactor response timeouts — from now on, and its retry count runs
// on (ib_modify_mad changes the timeout, not the retries left); later
// MRAs are duplicates. Before, every MRA reset the retry count and bought
// up to 2.4 hours: a peer that answered each REQ with an MRA kept Dial
// waiting for ever. An MRA must come from the peer, name the message
// waiting for an answer, and for a REP also the peer's ID.
func (m *Manager) onMRA(mad *transport.MAD, f *cm.MRAFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.conns[f.RemoteCommID]
	if c == nil || c.peer != mad.Src ||
		!(c.state == stREQSent && c.active && f.MessageMRAed == cm.KindREQ ||
			c.state == stREPSent && !c.active && f.MessageMRAed == cm.KindREP && f.LocalCommID == c.remoteID) {
		m.st.unknown.Add(1)
		return
	}
	if c.mraWait > 0 {
		m.st.duplicates.Add(1)
		return
	}
	rt := c.opts.ResponseTimeout
	c.mraWait = rt + min(cm.Timeout(f.ServiceTimeout), MRAWaitFactor*rt)
	c.armLocked(c.mraWait)
}

// onREJ: the peer rejected a request or reply. The connection it names
// is found as Linux's CM finds it (cm_acquire_rejected_id): a REJ
// "timeout" by the sender's own ID (a requester that gave up before it
// knew ours; Linux's CM looks it up by that ID and the CA GUID in the ARI
// whatever the "message rejected" field says — Linux's requester sends
// "other" there, ours "REQ" — here from the address it dialed from, and
// only while the request is half-open), a REJ of a REQ by our ID alone
// (the peer had none to give), and any other by both IDs; the source
// address must be the peer's in every case. So a REJ that knows one ID
// cannot end an established connection. No REJ makes a Dial try again
// but "stale connection" (staleRetryLocked): Linux's CM ends the attempt
// on every other reason, and a REJ "timeout" of our REQ names no
// connection a requester has (cm_acquire_rejected_id finds none before
// the REP), so it is dropped there too.
func (m *Manager) onREJ(mad *transport.MAD, f *cm.REJFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st.rejRecv[reasonSlot(f.Reason)].Add(1)
	var c *Conn
	if f.Reason == cm.RejTimeout {
		if k := m.remote[remoteKey{mad.Src, f.LocalCommID}]; k != nil && (k.state == stREQRcvd || k.state == stREPSent) {
			c = k
		}
	}
	switch {
	case c != nil:
	case f.MessageRejected == cm.KindREQ && f.Reason != cm.RejTimeout:
		if k := m.conns[f.RemoteCommID]; k != nil && k.active && k.state == stREQSent && k.peer == mad.Src {
			c = k
		}
	case f.MessageRejected == cm.KindREQ: // a timeout: by the sender's ID only (above)
	default:
		if k := m.conns[f.RemoteCommID]; k != nil && k.remoteID == f.LocalCommID && k.peer == mad.Src {
			c = k
		}
	}
	if c == nil {
		k := m.conns[f.RemoteCommID]
		// A REJ "timeout" of our REQ from its peer (a listener's
		// half-open bound): dropped as Linux drops it, not a spoof.
		ofOurREQ := f.Reason == cm.RejTimeout && k != nil && k.active && k.state == stREQSent && k.peer == mad.Src
		if k != nil && !ofOurREQ {
			m.st.spoofDropped.Add(1) // one ID right, the other or the address wrong
		}
		if f.Reason == cm.RejTimeout && f.MessageRejected != cm.KindREP && !ofOurREQ {
			// Its REQ may be waiting still (requests are handled after
			// answers): it is not to be served.
			if len(m.gaveUp) >= 256 {
				clear(m.gaveUp)
			}
			m.gaveUp[remoteKey{mad.Src, f.LocalCommID}] = true
		}
		m.st.unknown.Add(1)
		return
	}
	rej := &RejectError{Reason: f.Reason, PrivateData: append([]byte(nil), f.PrivateData[:]...)}
	switch c.state {
	case stREQSent:
		if f.Reason == cm.RejStaleConn && c.staleRetryLocked(rej) {
			return
		}
		c.endedBy(CausePeerReject)
		c.finishLocked(rej)
	case stREQRcvd, stREPSent:
		c.endedBy(CausePeerReject)
		c.finishLocked(rej)
	case stEstablished, stDREQSent:
		c.endedBy(CausePeerReject)
		c.timeWaitLocked(&RejectError{Reason: f.Reason})
	default:
		m.st.unknown.Add(1)
	}
}

// onREP: the passive side accepted (active side).
func (m *Manager) onREP(mad *transport.MAD, h *cm.HeaderFields, f *cm.REPFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.conns[f.RemoteCommID]
	if c == nil && m.answerAbandonedLocked(mad, h, f) {
		return
	}
	if c == nil || !c.active || c.peer != mad.Src {
		m.st.unknown.Add(1)
		return
	}
	switch c.state {
	case stREQSent:
	case stEstablished:
		if f.LocalCommID == c.remoteID {
			m.st.duplicates.Add(1)
			c.resendLocked() // the RTU was lost
		}
		return
	default:
		m.st.unknown.Add(1)
		return
	}
	c.remoteID = f.LocalCommID
	c.params.DestQPN = f.LocalQPN
	c.indexQPNLocked()
	c.params.SQPSN = f.StartingPSN
	c.params.MaxRdAtomic = max(1, min(c.params.MaxRdAtomic, f.ResponderResources))
	rt := *c.opts.Retry
	rt.RNRRetry = f.RNRRetryCount
	c.params.Retry = &rt
	c.peerData = append([]byte(nil), f.PrivateData[:]...)
	c.remoteECE = ECE{VendorID: f.VendorID, Options: h.AttributeModifier}
	c.params.SelectiveRepeat = c.opts.SelectiveRepeat && c.remoteECE.offersSR()
	if err := c.qp.Connect(c.params); err != nil {
		rej := &cm.REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: cm.KindREP, Reason: cm.RejConsumer}
		var out [transport.MADSize]byte
		m.send(c.peer, c.opts.TrafficClass, c.tid, rej, &out)
		c.finishLocked(fmt.Errorf("rdmacm: connecting the QP: %w", err))
		return
	}
	rtu := &cm.RTUFields{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	c.state = stEstablished
	c.wasEstab = true
	c.sendLocked(rtu)
	if c.timer != nil {
		c.timer.Stop()
	}
	m.st.established.Add(1)
	c.journalLocked()
	c.startLivenessLocked()
	close(c.estab)
}

// onRTU: the active side is ready (passive side).
func (m *Manager) onRTU(f *cm.RTUFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.conns[f.RemoteCommID]
	if c == nil || c.active || c.remoteID != f.LocalCommID {
		m.st.unknown.Add(1)
		return
	}
	if c.state != stREPSent {
		m.st.duplicates.Add(1)
		return
	}
	c.establishPassiveLocked()
}

// onDREQ: the peer disconnects. A DREQ for no known connection is
// answered with a DREP too, as Linux does, so the peer stops resending.
func (m *Manager) onDREQ(mad *transport.MAD, h *cm.HeaderFields, f *cm.DREQFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.conns[f.RemoteCommID]
	if c == nil || c.remoteID != f.LocalCommID || c.peer != mad.Src {
		m.st.unknown.Add(1)
		m.st.strayDREQ.Add(1)
		var out [transport.MADSize]byte
		m.send(mad.Src, mad.TOS, h.TransactionID, &cm.DREPFields{LocalCommID: f.RemoteCommID, RemoteCommID: f.LocalCommID}, &out)
		return
	}
	switch c.state {
	case stEstablished, stDREQSent, stREPSent, stTimeWait:
	default:
		m.st.unknown.Add(1)
		return
	}
	if c.state == stTimeWait {
		m.st.duplicates.Add(1)
	}
	if c.state == stEstablished && c.qp != nil && c.err == nil {
		// The QP failed already (its watcher has not run yet): that is
		// what ended the connection; the DREQ is the peer's view of it.
		if cause := c.qp.Err(); cause != nil && !errors.Is(cause, transport.ErrClosed) {
			c.err = fmt.Errorf("%w (peer %v): %w", ErrQPFailed, c.peer, cause)
			m.st.qpFailed.Add(1)
			c.endedBy(CauseQPFailed)
		}
	}
	c.endedBy(CausePeerDisconnect)
	drep := &cm.DREPFields{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	hd := cm.NewHeader(0, c.tid)
	cm.Encode(c.out[:], &hd, drep)
	c.resendLocked()
	c.timeWaitLocked(ErrDisconnected)
}

// onDREP: the peer confirmed our DREQ.
func (m *Manager) onDREP(f *cm.DREPFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.conns[f.RemoteCommID]
	if c == nil && m.onDeadDREPLocked(f) {
		return
	}
	if c == nil || c.state != stDREQSent {
		m.st.unknown.Add(1)
		return
	}
	c.timeWaitLocked(ErrClosed)
}

func (m *Manager) onSIDRREQ(mad *transport.MAD, h *cm.HeaderFields, f *cm.SIDRREQFields) {
	m.mu.Lock()
	l := m.udl[f.ServiceID]
	m.mu.Unlock()
	rep := &cm.SIDRREPFields{RequestID: f.RequestID, ServiceID: f.ServiceID}
	_, err := cm.ParseCMAHeader(f.PrivateData[:])
	switch {
	case l == nil:
		m.st.rejNoListener.Add(1)
		rep.Status = cm.SIDRUnsupported
	case err != nil:
		m.st.malformed.Add(1)
		rep.Status = cm.SIDRReject
	default:
		rep.QPN, rep.QKey = l.qpn, l.qkey
		copy(rep.PrivateData[:], l.data)
	}
	var out [transport.MADSize]byte
	m.send(mad.Src, mad.TOS, h.TransactionID, rep, &out)
}

func (m *Manager) onSIDRREP(f *cm.SIDRREPFields) {
	m.mu.Lock()
	w := m.sidr[f.RequestID]
	m.mu.Unlock()
	if w == nil {
		m.st.unknown.Add(1)
		return
	}
	if f.Status != cm.SIDRSuccess {
		w.done(sidrResult{err: &RejectError{SIDRStatus: f.Status, PrivateData: append([]byte(nil), f.PrivateData[:]...)}})
		return
	}
	w.done(sidrResult{peer: UDPeer{QPN: f.QPN, QKey: f.QKey, PrivateData: append([]byte(nil), f.PrivateData[:]...)}})
}

// rejectUnknown answers a REQ that creates no state with a REJ.
func (m *Manager) rejectUnknown(mad *transport.MAD, h *cm.HeaderFields, remoteID uint32, kind cm.MsgKind, reason cm.RejectReason) {
	rej := &cm.REJFields{RemoteCommID: remoteID, MessageRejected: kind, Reason: reason}
	var out [transport.MADSize]byte
	m.send(mad.Src, mad.TOS, h.TransactionID, rej, &out)
}

// errLoop ends the connections whose CM messages the network bounced.
func (m *Manager) errLoop() {
	for {
		select {
		case e := <-m.agent.Unreachable():
			m.onUnreachable(e.Dst, e.Payload, e)
		case <-m.stop:
			return
		}
	}
}

// onUnreachable: a REQ (or REP, or SIDR_REQ) of ours came back as an
// ICMP error: the connection (or ResolveUD) waiting for its answer fails
// now, with an error naming the address, instead of resending for
// MaxRetries response timeouts.
// dst and payload are the bounced datagram's destination and quoted UDP
// payload, icmp the error (a *udp.ICMPError).
//
// The bounced message names its connection by its own communication ID
// (LocalCommID, the first word of every CM message this side sends): the
// transaction ID alone does not. A passive connection's transaction ID is
// the requester's, and every fresh process numbers its first one alike —
// so a DREQ to a killed client (dropped by the client address's sharing
// group, which answers with an ICMP port unreachable) came back with the
// transaction ID of the restarted client's request, and failed that
// half-open connection (TestRpingKillRestart, 1 run in 40). Only the
// bounce of the message the connection waits an answer to — its REQ, or
// its REP — ends it.
func (m *Manager) onUnreachable(dst netip.Addr, payload []byte, icmp error) {
	if len(payload) < transport.MADOffset+cm.HeaderSize+4 {
		return
	}
	mad := payload[transport.MADOffset:]
	tid := binary.BigEndian.Uint64(mad[8:])
	attr := cm.AttrID(binary.BigEndian.Uint16(mad[16:]))
	local := binary.BigEndian.Uint32(mad[cm.HeaderSize:])
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st.unreachable.Add(1)
	if attr == cm.AttrSIDRREQ {
		// A ResolveUD's request (its first word is the request ID
		// ResolveUD waits under) fails the same way.
		if w := m.sidr[local]; w != nil && w.to.Addr() == dst && w.tid == tid {
			w.done(sidrResult{err: fmt.Errorf("rdmacm: ResolveUD %v: %w: %w", w.to, ErrUnreachable, icmp)})
		}
		return
	}
	c := m.conns[local]
	if c == nil || c.peer != dst || c.tid != tid {
		return
	}
	op := "Dial"
	switch {
	case c.state == stREQSent && attr == cm.AttrREQ:
	case c.state == stREPSent && attr == cm.AttrREP:
		op = "Accept"
	default:
		return
	}
	c.finishLocked(fmt.Errorf("rdmacm: %s %v: %w: %w", op, netip.AddrPortFrom(c.peer, c.remotePort), ErrUnreachable, icmp))
}
