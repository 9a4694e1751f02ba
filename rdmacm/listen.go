package rdmacm

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
)

// ListenOptions configure a Listener.
type ListenOptions struct {
	// Options are used by Accept for every connection it accepts.
	Options
	// Backlog bounds the connection requests the listener holds that are
	// not established yet, waiting for Accept or for the peer's RTU
	// (default 128). A request beyond it is rejected (no resources), so a
	// REQ flood costs bounded memory.
	Backlog int
}

// Listener accepts rdma_cm connections on one port of the TCP port space
// (what rdma_listen does).
type Listener struct {
	m        *manager
	port     uint16
	svc      uint64
	opts     ListenOptions
	reqs     chan *Request
	closedCh chan struct{}

	halfOpen int   // under m.mu
	closed   bool  // under m.mu
	closeErr error // what Next returns once closed (set before closedCh closes)
}

// Request is a connection request waiting for the application: accept
// it with Accept or refuse it with Reject.
type Request struct {
	c *Conn
	l *Listener
}

// PrivateData returns the user part of the request's private data (behind
// rdma_cm's header), zero-padded.
func (r *Request) PrivateData() []byte { return r.c.peerData }

// RemoteAddr returns the requester's IP address and rdma_cm port.
func (r *Request) RemoteAddr() netip.AddrPort { return r.c.RemoteAddr() }

// Listen starts accepting connection requests for port on dev.
func Listen(dev *transport.Device, port uint16, opts *ListenOptions) (*Listener, error) {
	if opts != nil {
		if err := opts.Options.check("Listen"); err != nil {
			return nil, err
		}
	}
	m, err := managerFor(dev)
	if err != nil {
		return nil, err
	}
	var o ListenOptions
	if opts != nil {
		o = *opts
	}
	if o.Backlog <= 0 {
		o.Backlog = 128
	}
	l := &Listener{m: m, port: port, svc: cm.ServiceID(cm.PSTCP, port), opts: o,
		reqs: make(chan *Request, o.Backlog), closedCh: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errDeviceClosed
	}
	if _, busy := m.listeners[l.svc]; busy {
		return nil, fmt.Errorf("rdmacm: Listen on port %d: %w", port, ErrInUse)
	}
	m.listeners[l.svc] = l
	return l, nil
}

// Addr returns the address and port the listener accepts on.
func (l *Listener) Addr() netip.AddrPort { return netip.AddrPortFrom(l.m.dev.Addr(), l.port) }

// Next returns the next connection request.
func (l *Listener) Next(ctx context.Context) (*Request, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.closedCh:
		if l.closeErr != nil {
			return nil, l.closeErr
		}
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept waits for the next connection request, accepts it with the
// listener's options and returns the connection once established.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	for {
		r, err := l.Next(ctx)
		if err != nil {
			return nil, err
		}
		o := l.opts.Options
		c, err := r.Accept(ctx, &o)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		// That peer went away (or its QP could not be set up): wait for
		// the next one, as accept(2) does.
	}
}

// Close stops listening; requests not yet accepted are rejected.
func (l *Listener) Close() error {
	m := l.m
	m.mu.Lock()
	l.closeLocked()
	m.mu.Unlock()
	for {
		select {
		case r := <-l.reqs:
			r.Reject(nil)
		default:
			return nil
		}
	}
}

func (l *Listener) closeLocked() {
	if l.closed {
		return
	}
	l.closed = true
	if l.m.listeners[l.svc] == l {
		delete(l.m.listeners, l.svc)
	}
	close(l.closedCh)
}

// Accept accepts the request with opts: the QP goes to RTR, the REP goes
// out, and Accept returns once the requester's RTU (or its first packet)
// arrives. On ctx's end the request is rejected.
func (r *Request) Accept(ctx context.Context, opts *Options) (*Conn, error) {
	c := r.c
	m := c.m
	if err := opts.check("Accept"); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	var bound transport.MTU // an explicit PathMTU; zero: take the REQ's
	if opts != nil {
		bound = opts.PathMTU
	}
	if len(o.PrivateData) > cm.REPPrivateDataSize {
		return nil, fmt.Errorf("rdmacm: Accept: %d bytes of private data, at most %d", len(o.PrivateData), cm.REPPrivateDataSize)
	}
	m.mu.Lock()
	if c.state != stREQRcvd {
		err := c.err
		m.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	c.opts = o
	c.max = o.MaxRetries
	m.mu.Unlock()

	fail := func(err error) (*Conn, error) {
		r.Reject(nil)
		c.release()
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	// The path MTU is the REQ's, as Linux's CM sets it on the passive
	// side (cm.c takes the path, MTU included, from the REQ): the REP
	// has no MTU field, so the active side keeps the one it asked for,
	// and both QPs must segment and check packets by the same MTU (a
	// first or middle packet carries exactly one MTU; READ responses
	// take ceil(length/MTU) PSNs). A smaller MTU here would break every
	// message longer than it. A passive side whose explicit PathMTU is
	// below the REQ's rejects it (invalid path MTU), as a Linux device
	// whose port cannot carry the REQ's MTU fails the accept.
	q := &c.req
	mtu := transport.MTU(q.PathMTU)
	if bound != 0 && mtu > bound {
		r.reject(cm.RejInvalidMTU, nil)
		c.release()
		return nil, fmt.Errorf("rdmacm: Accept: the request's path MTU %d exceeds Options.PathMTU %d: %w",
			mtu.Bytes(), bound.Bytes(), &RejectError{Reason: cm.RejInvalidMTU})
	}
	if err := c.setupQP(); err != nil {
		return fail(err)
	}
	if o.Prepare != nil {
		if err := o.Prepare(c.qp); err != nil {
			return fail(fmt.Errorf("prepare: %w", err))
		}
	}
	rt := *o.Retry
	rt.RetryCnt = q.RetryCount
	rt.RNRRetry = q.RNRRetryCount
	if q.Primary.LocalACKTimeout != 0 {
		rt.Timeout = q.Primary.LocalACKTimeout
	}
	params := transport.ConnParams{Peer: c.peer, TrafficClass: o.TrafficClass, DestQPN: q.LocalQPN,
		RQPSN: random32() & 0xffffff, SQPSN: q.StartingPSN, PathMTU: mtu, Access: o.Access,
		MaxRdAtomic:     max(1, min(o.InitiatorDepth, q.ResponderResources)),
		MaxDestRdAtomic: max(1, min(o.ResponderResources, q.InitiatorDepth)), Retry: &rt,
		SelectiveRepeat: o.SelectiveRepeat && c.remoteECE.offersSR()}
	m.mu.Lock()
	c.params = params
	m.mu.Unlock()
	if err := c.qp.ReadyToReceive(params); err != nil {
		return fail(err)
	}
	rep := &cm.REPFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, LocalQPN: c.qp.QPN(),
		StartingPSN: params.RQPSN, ResponderResources: params.MaxDestRdAtomic, InitiatorDepth: params.MaxRdAtomic,
		TargetACKDelay: 15, RNRRetryCount: o.Retry.RNRRetry, LocalCAGUID: m.guid}
	copy(rep.PrivateData[:], o.PrivateData)
	if params.SelectiveRepeat { // the ECE answer: only to a REQ that offered it
		rep.VendorID = VendorID
		m.mu.Lock()
		c.localECE = ECE{VendorID: VendorID, Options: ECESelectiveRepeat}
		m.mu.Unlock()
	}
	m.mu.Lock()
	if c.state != stREQRcvd { // rejected or timed out meanwhile
		err := c.err
		m.mu.Unlock()
		c.release()
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	c.state = stREPSent
	err := c.sendLocked(rep)
	m.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	// The first packet on the QP in RTR stands for a lost RTU.
	go func() {
		select {
		case <-c.qp.CommEstablished():
			m.mu.Lock()
			if c.state == stREPSent {
				c.establishPassiveLocked()
			}
			m.mu.Unlock()
		case <-c.estab:
		}
	}()
	if err := c.waitEstablished(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Reject refuses the request (REJ, consumer reject) with the given
// private data (at most 148 bytes).
func (r *Request) Reject(privateData []byte) error {
	return r.reject(cm.RejConsumer, privateData)
}

// reject answers the request with a REJ of reason.
func (r *Request) reject(reason cm.RejectReason, privateData []byte) error {
	c := r.c
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.state != stREQRcvd && c.state != stREPSent {
		return fmt.Errorf("rdmacm: Reject: connection is %v", c.state)
	}
	kind := cm.KindREQ
	rej := &cm.REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: kind, Reason: reason}
	copy(rej.PrivateData[:], privateData)
	c.sendLocked(rej)
	c.finishLocked(&RejectError{Reason: reason})
	return nil
}

// onREQ: a connection request (passive side).
func (m *manager) onREQ(mad *transport.MAD, h *cm.HeaderFields, f *cm.REQFields) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := remoteKey{mad.Src, f.LocalCommID}
	if c := m.remote[key]; c != nil {
		m.st.duplicates.Add(1)
		switch c.state {
		case stREQRcvd:
			// The application has not answered yet: ask for patience.
			mra := &cm.MRAFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageMRAed: cm.KindREQ,
				ServiceTimeout: timeoutExp(c.opts.ResponseTimeout) + 2}
			var out [transport.MADSize]byte
			m.send(c.peer, c.opts.TrafficClass, c.tid, mra, &out)
		case stREPSent:
			c.resendLocked() // the REP was lost
		}
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
	for _, c := range m.conns {
		// A REQ from the QP of a connection that is still up: the peer
		// lost it (rebooted, or the CM state); reject it as stale.
		if !c.active && c.peer == mad.Src && c.params.DestQPN == f.LocalQPN && c.state == stEstablished {
			m.st.rejStale.Add(1)
			m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejStaleConn)
			return
		}
	}
	if l.halfOpen >= l.opts.Backlog {
		m.st.rejBacklog.Add(1)
		m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejNoResources)
		return
	}
	c := newConn(m, false, l.opts.Options.withDefaults())
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
	select {
	case l.reqs <- &Request{c: c, l: l}:
	default: // requests that ended unanswered still fill the queue
		delete(m.conns, c.localID)
		delete(m.remote, key)
		m.st.rejBacklog.Add(1)
		m.rejectUnknown(mad, h, f.LocalCommID, cm.KindREQ, cm.RejNoResources)
		return
	}
	l.halfOpen++
	// An application that never answers: give up when the requester
	// would have (its retries of its response timeout).
	c.acceptTimer = m.clock.AfterFunc(cm.Timeout(f.RemoteCMResponseTimeout)*time.Duration(1+f.MaxCMRetries), func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if c.state == stREQRcvd {
			rej := &cm.REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: cm.KindREQ, Reason: cm.RejTimeout}
			var out [transport.MADSize]byte
			m.send(c.peer, c.opts.TrafficClass, c.tid, rej, &out)
			c.finishLocked(ErrTimeout)
		}
	})
}
