package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// Options configure one side of a connection. The zero value of every
// field selects a default.
type Options struct {
	// QP, if set, is the caller's RC QP (in RESET or INIT) to connect; the
	// caller keeps it (Close moves it to ERR, never destroys it). Else the
	// connection creates one, with PD, SendCQ and RecvCQ if given (else
	// its own), and destroys what it created when it closes.
	QP             *transport.QP
	PD             *memreg.PD
	SendCQ, RecvCQ *transport.CQ
	// CQDepth, MaxSendWR, MaxRecvWR and MaxSGE size what the connection
	// creates (defaults 256, 64, 64, 1).
	CQDepth, MaxSendWR, MaxRecvWR, MaxSGE int
	// Prepare, if set, is called with the QP in INIT before the connection
	// request or reply goes out: the moment to post receives, as rping
	// and perftest do before rdma_connect and rdma_accept.
	Prepare func(qp *transport.QP) error
	// SRQ, if set, is the shared receive queue the QP the connection
	// creates takes its receives from (a server's connections sharing
	// one, with one RecvCQ): the QP is made in the SRQ's PD (PD must be
	// it or nil) and gets no receive queue of its own. Not with QP.
	SRQ *transport.SRQ
	// Access are the remote rights the QP grants the peer. The default
	// (zero) is Linux's CM's: remote write, plus remote read and atomics
	// when the connection has responder resources (it always has here:
	// ResponderResources is at least 1).
	Access memreg.Access
	// NoRemoteAccess grants the peer no remote rights at all (zero Access
	// means the default, so it cannot say so). Access must then be zero.
	NoRemoteAccess bool
	// PathMTU is the path MTU. The active side asks for it in the REQ
	// (default 1024, or what Linux's rdma_cm picks on a smaller
	// interface: IBoEPathMTU of the MTU of the interface holding the
	// device's address, 512 below 1120 bytes). The passive side takes the REQ's, as Linux's CM
	// does, since the REP cannot tell the active side a smaller one and
	// both QPs must use the same; a nonzero PathMTU at Accept (or in the
	// ListenOptions) is the largest it accepts: a REQ asking for more is
	// rejected (invalid path MTU, errors.Is ErrRejected on both sides).
	PathMTU transport.MTU
	// ResponderResources and InitiatorDepth are the READ/atomic limits
	// (max_dest_rd_atomic and max_rd_atomic; default 16 each); each side
	// ends up with the smaller of its own and what the peer serves.
	ResponderResources, InitiatorDepth uint8
	// Retry is the QP's retry configuration (default transport.DefaultRetry).
	// An Accept's QP takes the REQ's local ACK timeout, retry and RNR
	// retry counts instead, unless OwnACKTimeout is set. RNRRetry is the
	// peer's: it goes in the REQ or REP, and a Dial's QP retries RNR NAKs
	// as often as the REP says (the listener's Retry.RNRRetry), as with
	// Linux's CM; to bound a Dial's RNR retries, set it on the listener.
	Retry *transport.Retry
	// OwnACKTimeout makes an Accept's QP use Retry.Timeout as its local
	// ACK timeout rather than the REQ's, as rdma_set_option
	// (RDMA_OPTION_ID_ACK_TIMEOUT) on a passive rdma_cm ID does in Linux
	// (rdma_init_qp_attr overrides the CM's value; ucmatose -a on a
	// server). A Dial always uses Retry.Timeout.
	OwnACKTimeout bool
	// PrivateData is sent to the peer with the request (at most 56 bytes
	// behind rdma_cm's header) or the reply (at most 196 bytes).
	PrivateData []byte
	// ResponseTimeout is how long to wait for each CM answer before
	// sending again (default 1 s, advertised as the CM timeout exponent
	// at or above it: 18, 1.07 s; a Dial's REQ waits the advertised time,
	// as Linux's ib_send_cm_req); MaxRetries how often (default 15, as
	// Linux; an Accept's REP goes as often as the REQ's Max CM Retries
	// says instead, as Linux's cm_req_handler). A peer
	// that answers with an MRA (its application is still deciding) gets
	// more time once, as Linux's CM gives it: from then on each wait is
	// ResponseTimeout plus the MRA's service timeout, the latter at most
	// MRAWaitFactor × ResponseTimeout; the retry count runs on, and
	// further MRAs change nothing. An Accept's REP waits for its RTU at
	// least as long as the REQ says its requester takes to answer (its
	// local CM response timeout, as Linux's CM; Linux's rdma_cm asks for
	// 4.3 s), at most MRAWaitFactor × ResponseTimeout, before it goes
	// again. So a Dial (and an Accept's wait for
	// the RTU) ends, ErrTimeout at the latest, within
	// (MaxRetries+1) × (1+MRAWaitFactor) × ResponseTimeout (144 s with
	// the defaults; 17.2 s for a Dial without an MRA) whatever the peer sends —
	// sooner if its context ends.
	ResponseTimeout time.Duration
	MaxRetries      int
	// TrafficClass is the IP traffic class of the MADs and the QP. On
	// the passive side (Accept, ListenOptions) zero takes the REQ's
	// primary path traffic class, as Linux's CM does, so that a
	// requester's DSCP holds both ways; a nonzero one overrides it.
	TrafficClass uint8
	// LocalPort is the active side's rdma_cm port in the request's header
	// (default: a random ephemeral port, as the kernel picks one).
	LocalPort uint16
	// SelectiveRepeat offers (Dial) or accepts (Accept) selective repeat
	// through ECE (ece.go): the QP runs it only if both sides set it. A
	// peer that does not answer (rxe, hardware) gets go-back-N.
	SelectiveRepeat bool
	// KeepAlive is how long an established connection may stay silent
	// (no packet from the peer) before it sends the peer a keep-alive
	// probe: a zero-length RDMA WRITE, which any verbs peer's QP answers
	// by itself (transport.QP.Probe). Zero selects DefaultKeepAlive (15
	// s); a negative value turns keep-alive off. KeepAliveTimeout is how
	// long a probe may go unanswered before the connection is declared
	// dead (default DefaultKeepAliveTimeout, 10 s); the QP's own retry
	// count usually declares a dead peer sooner (Retry: about 0.5 s at
	// the default timeout 14 and retry count 7). A dead idle peer ends
	// the connection (Done, Err matching ErrKeepAlive) at most
	// 2×KeepAlive + KeepAliveTimeout after it died.
	KeepAlive, KeepAliveTimeout time.Duration
}

// check reports options that contradict each other, values the CM
// messages or the QP cannot carry (a path MTU code, retry counts), or whose
// PrivateData is longer than maxPD, what the message it goes in carries
// (the REQ's 56 bytes behind rdma_cm's header for Dial, the REP's 196 for
// Accept and Listen).
func (o *Options) check(op string, maxPD int) error {
	if o == nil {
		return nil
	}
	if o.NoRemoteAccess && o.Access != 0 {
		return fmt.Errorf("rdmacm: %s: Options.NoRemoteAccess with Access %v", op, o.Access)
	}
	if o.SRQ != nil && o.QP != nil {
		return fmt.Errorf("rdmacm: %s: Options.SRQ with Options.QP (the QP has its receive queue already)", op)
	}
	if o.SRQ != nil && o.PD != nil && o.PD != o.SRQ.PD() {
		return fmt.Errorf("rdmacm: %s: Options.SRQ is in another PD than Options.PD", op)
	}
	if len(o.PrivateData) > maxPD {
		return fmt.Errorf("rdmacm: %s: Options.PrivateData: %d bytes of private data, at most %d", op, len(o.PrivateData), maxPD)
	}
	// What the CM messages carry in a few bits is checked here, before
	// anything is sent: a REQ with a path MTU code the peer cannot take
	// went unanswered until the Dial's deadline.
	if o.PathMTU != 0 && !o.PathMTU.Valid() {
		return fmt.Errorf("rdmacm: %s: Options.PathMTU %d is not an MTU code (MTU256..MTU4096)", op, o.PathMTU)
	}
	if r := o.Retry; r != nil {
		switch {
		case r.Timeout > 31:
			return fmt.Errorf("rdmacm: %s: Options.Retry.Timeout %d > 31", op, r.Timeout)
		case r.RetryCnt > 7:
			return fmt.Errorf("rdmacm: %s: Options.Retry.RetryCnt %d > 7", op, r.RetryCnt)
		case r.RNRRetry > 7:
			return fmt.Errorf("rdmacm: %s: Options.Retry.RNRRetry %d > 7", op, r.RNRRetry)
		case r.MinRNRTimer > 31:
			return fmt.Errorf("rdmacm: %s: Options.Retry.MinRNRTimer %d > 31", op, r.MinRNRTimer)
		}
	}
	return nil
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.CQDepth <= 0 {
		r.CQDepth = 256
	}
	if r.MaxSendWR <= 0 {
		r.MaxSendWR = 64
	}
	if r.MaxRecvWR <= 0 {
		r.MaxRecvWR = 64
	}
	if r.MaxSGE <= 0 {
		r.MaxSGE = 1
	}
	if r.PathMTU == 0 {
		r.PathMTU = transport.MTU1024
	}
	if r.ResponderResources == 0 {
		r.ResponderResources = 16
	}
	if r.Access == 0 && !r.NoRemoteAccess {
		// As cm_init_qp_init_attr (drivers/infiniband/core/cm.c).
		r.Access = memreg.AccessRemoteWrite
		if r.ResponderResources > 0 {
			r.Access |= memreg.AccessRemoteRead | memreg.AccessRemoteAtomic
		}
	}
	if r.InitiatorDepth == 0 {
		r.InitiatorDepth = 16
	}
	if r.Retry == nil {
		rt := transport.DefaultRetry
		r.Retry = &rt
	}
	if r.ResponseTimeout <= 0 {
		r.ResponseTimeout = time.Second
	}
	if r.MaxRetries <= 0 {
		r.MaxRetries = 15
	}
	if r.KeepAlive == 0 {
		r.KeepAlive = DefaultKeepAlive
	}
	if r.KeepAliveTimeout <= 0 {
		r.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	return r
}

// MRAWaitFactor bounds the extra wait an MRA buys: at most this many
// response timeouts (Options.ResponseTimeout) on top of each one, however
// long the MRA's service timeout asks for (up to 2.4 hours).
const MRAWaitFactor = 8

// timeoutExp returns the CM timeout exponent (4.096 µs × 2^e) nearest above d.
func timeoutExp(d time.Duration) uint8 {
	for e := uint8(0); e < 31; e++ {
		if cm.Timeout(e) >= d {
			return e
		}
	}
	return 31
}

type connState uint8

const (
	stREQSent connState = iota + 1
	stREQRcvd
	stREPSent
	stEstablished
	stDREQSent
	stTimeWait
	stClosed
)

func (s connState) String() string {
	return [...]string{"", "REQ_SENT", "REQ_RCVD", "REP_SENT", "ESTABLISHED", "DREQ_SENT", "TIMEWAIT", "CLOSED"}[s]
}

// Conn is an RC connection made through the CM: a connected QP and what
// the peer sent with its request or reply.
type Conn struct {
	m      *Manager
	active bool
	opts   Options
	qp     *transport.QP
	owned  []func() error // destroys what the connection created, in order (under relMu once handed out)
	relMu  sync.Mutex     // serializes release: Close may be called from several goroutines at once
	params transport.ConnParams

	localID, remoteID uint32
	tid               uint64
	peer              netip.Addr
	localPort         uint16
	remotePort        uint16
	peerData          []byte
	listener          *Listener
	req               cm.REQFields // passive: the request
	localECE          ECE          // what our REQ or REP carries
	remoteECE         ECE          // what the peer's REQ or REP carried

	// Under m.mu:
	state   connState
	out     [transport.MADSize]byte // the last MAD sent, sent again on timeout
	retries int
	max     int
	timer   transport.Timer
	// mraWait is zero until the peer's MRA asks for more time to answer
	// the message out (REQ or REP); then it is the wait between its
	// sends for the rest of that message's retries (onMRA).
	mraWait time.Duration
	// peerWait is how long the requester said it takes to answer a
	// REP (the REQ's local CM response timeout; passive side), at most
	// MRAWaitFactor response timeouts: the REP waits that long for its
	// RTU before it goes again, as Linux's cm_req_handler times it.
	peerWait time.Duration
	// acceptTimer gives up on a request the application never answers.
	acceptTimer transport.Timer
	err         error
	estab       chan struct{} // closed when established, or failed before it
	// wasEstab is set when the connection reaches ESTABLISHED and stays
	// set when it ends: a connection the peer established, used and
	// disconnected before the waiter in waitEstablished ran is still
	// handed out (Accept, Dial), ended, as accept(2) hands out a socket
	// whose peer has closed already.
	wasEstab bool
	done     chan struct{} // closed when the connection has ended
	ended    bool
	life     life // teardown cause, stale handling, indexes (life.go)
	// journaled: the connection has its record in the manager's
	// journal (replay.go), from ESTABLISHED until it ends.
	journaled bool
	// Keep-alive (keepalive.go).
	kaTimer   transport.Timer
	kaHeard   uint64 // the QP's Activity at the last tick
	kaProbing bool   // a probe went out and nothing was heard since
	kaSince   time.Time
}

// QP returns the connection's QP.
func (c *Conn) QP() *transport.QP { return c.qp }

// SendCQ and RecvCQ return the QP's completion queues.
func (c *Conn) SendCQ() *transport.CQ { return c.opts.SendCQ }

// RecvCQ returns the QP's receive completion queue.
func (c *Conn) RecvCQ() *transport.CQ { return c.opts.RecvCQ }

// PD returns the QP's protection domain.
func (c *Conn) PD() *memreg.PD { return c.opts.PD }

// PeerPrivateData returns the user part of the private data the peer sent
// with its request (on the passive side) or reply (on the active side):
// the whole field, zero-padded, as rdma_cm delivers it.
func (c *Conn) PeerPrivateData() []byte { return c.peerData }

// LocalAddr and RemoteAddr return the connection's IP endpoints (the
// ports are rdma_cm's).
func (c *Conn) LocalAddr() netip.AddrPort { return netip.AddrPortFrom(c.m.dev.Addr(), c.localPort) }

// RemoteAddr returns the peer's address and rdma_cm port.
func (c *Conn) RemoteAddr() netip.AddrPort { return netip.AddrPortFrom(c.peer, c.remotePort) }

// Done returns a channel closed when the connection has ended: the peer
// disconnected, Close ran, the device closed, the QP failed (a work
// request's retries ran out, a remote access or operational error, ...)
// or the peer answered no keep-alive probe. Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended: nil while it is up; ErrClosed
// after a local Close or a closed device (then also
// transport.ErrClosed); ErrDisconnected (which matches ErrClosed) after
// the peer's DREQ; ErrQPFailed wrapping the QP's error (a
// *transport.WCError: errors.As, then Status) when the QP failed;
// ErrKeepAlive when the peer stopped answering keep-alive probes.
func (c *Conn) Err() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.err
}

func newConn(m *Manager, active bool, o Options) *Conn {
	return &Conn{m: m, active: active, opts: o, max: o.MaxRetries, estab: make(chan struct{}), done: make(chan struct{})}
}

// setupQP creates the QP (and what it needs) unless the caller gave one,
// and takes it to INIT.
func (c *Conn) setupQP() error {
	o := &c.opts
	dev := c.m.dev
	if o.QP != nil {
		c.setQP(o.QP)
		if o.QP.State() == transport.QPSReset {
			if err := o.QP.Init(o.Access); err != nil {
				return err
			}
		}
		o.PD = o.QP.PD()
		return nil
	}
	if o.PD == nil && o.SRQ != nil {
		o.PD = o.SRQ.PD()
	}
	if o.PD == nil {
		pd, err := dev.AllocPD()
		if err != nil {
			return err
		}
		o.PD = pd
		c.life.ownPD = pd
		c.owned = append(c.owned, func() error {
			if err := pd.Dealloc(); err != nil {
				return fmt.Errorf("rdmacm: the connection's PD (deregister its memory regions first): %w", err)
			}
			return nil
		})
	}
	for _, cq := range []**transport.CQ{&o.SendCQ, &o.RecvCQ} {
		if *cq == nil {
			q, err := dev.CreateCQ(o.CQDepth)
			if err != nil {
				return err
			}
			*cq = q
			c.owned = append(c.owned, func() error { return q.DestroyCause(c.closedCause()) })
		}
	}
	qp, err := dev.CreateQP(o.PD, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: o.SendCQ, RecvCQ: o.RecvCQ,
		MaxSendWR: o.MaxSendWR, MaxRecvWR: o.MaxRecvWR, MaxSGE: o.MaxSGE, SRQ: o.SRQ})
	if err != nil {
		return err
	}
	c.setQP(qp)
	c.owned = append(c.owned, func() error { return qp.DestroyCause(c.closedCause()) })
	return qp.Init(o.Access)
}

// closedCause is what the QP and CQs the connection destroys answer
// their later callers and waiters with (see closedCause).
func (c *Conn) closedCause() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return closedCause(c.err)
}

// setQP records the connection's QP (the manager reads it under its lock).
func (c *Conn) setQP(qp *transport.QP) {
	c.m.mu.Lock()
	c.qp = qp
	c.m.mu.Unlock()
}

// release destroys what the connection created (QP first), or moves the
// caller's QP to ERR. What fails to go (the PD while memory regions are
// registered in it) stays owned, for the next release to try again; the
// errors are joined.
func (c *Conn) release() error {
	c.relMu.Lock()
	defer c.relMu.Unlock()
	return c.releaseLocked()
}

// releaseQP destroys the QP the connection created, giving the device
// its place back, and leaves the rest (its CQs, with the completions it
// received, and its PD) to release. For a connection that ended before
// Accept handed it out (endedUnacceptedLocked).
func (c *Conn) releaseQP() {
	c.relMu.Lock()
	defer c.relMu.Unlock()
	if c.qp != nil && c.opts.QP == nil {
		c.qp.DestroyCause(c.closedCause()) // release's own try then finds it gone (ErrDestroyed)
	}
}

// releaseLocked is release with c.relMu held.
func (c *Conn) releaseLocked() error {
	if c.qp != nil && c.opts.QP != nil {
		c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	}
	var errs []error
	var left []func() error
	for i := len(c.owned) - 1; i >= 0; i-- {
		// ErrDestroyed: the caller destroyed it already, nothing is
		// left. transport.ErrClosed: the device closed, and its Close
		// released the QP and the CQs (a PD still deallocates).
		if err := c.owned[i](); err != nil && !errors.Is(err, transport.ErrDestroyed) && !errors.Is(err, transport.ErrClosed) {
			errs = append(errs, err)
			left = append([]func() error{c.owned[i]}, left...)
		}
	}
	c.owned = left
	return errors.Join(errs...)
}

// Dial connects to the rdma_cm listener at addr (IP address and port in
// the TCP port space, what rdma_connect reaches) and returns the
// established connection. The error is a *RejectError if the peer
// rejected it (errors.Is(err, ErrRefused) when nothing listens there),
// ErrTimeout if the peer never answered, or ctx's error — then the REJ
// (before the reply) or DREQ (after it) the specification asks for has
// been sent. A connection established and ended by the peer before Dial
// returns is returned, ended (Done closed, Err says why), not an error.
// On an error the *Conn is nil.
func (m *Manager) Dial(ctx context.Context, addr netip.AddrPort, opts *Options) (*Conn, error) {
	dev := m.dev
	if err := opts.check("Dial", cm.CMAREQPrivateDataSize); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	if opts == nil || opts.PathMTU == 0 {
		o.PathMTU = defaultPathMTU(dev.Addr())
	}
	// A link-local address's zone names the interface to reach it
	// through, which the device's socket is bound to already; the peer's
	// packets arrive without one.
	peer := addr.Addr().Unmap().WithZone("")
	if !peer.IsValid() || peer.Is4() != dev.Addr().Is4() {
		return nil, fmt.Errorf("rdmacm: Dial: address %v is not in the device's address family (%v)", addr, dev.Addr())
	}
	c := newConn(m, true, o)
	c.peer, c.remotePort = peer, addr.Port()
	c.localPort = o.LocalPort
	if c.localPort == 0 {
		c.localPort = uint16(32768 + random32()%28232) // the kernel's ephemeral range
	}
	if err := c.setupQP(); err != nil {
		c.releaseFailed()
		return nil, fmt.Errorf("rdmacm: Dial: %w", closedAs(err))
	}
	if o.Prepare != nil {
		if err := o.Prepare(c.qp); err != nil {
			c.releaseFailed()
			return nil, fmt.Errorf("rdmacm: Dial: prepare: %w", err)
		}
	}
	// What this side's receive queue expects: the peer sends from it.
	c.params = transport.ConnParams{Peer: peer, TrafficClass: o.TrafficClass, RQPSN: random32() & 0xffffff,
		PathMTU: o.PathMTU, Access: o.Access, MaxRdAtomic: o.InitiatorDepth, MaxDestRdAtomic: o.ResponderResources,
		Retry: o.Retry}
	req := cm.REQFields{
		ServiceID:               cm.ServiceID(cm.PSTCP, addr.Port()),
		LocalCAGUID:             m.guid,
		LocalQPN:                c.qp.QPN(),
		ResponderResources:      o.ResponderResources,
		InitiatorDepth:          o.InitiatorDepth,
		RemoteCMResponseTimeout: timeoutExp(o.ResponseTimeout),
		TransportServiceType:    cm.TransportRC,
		StartingPSN:             c.params.RQPSN,
		LocalCMResponseTimeout:  timeoutExp(o.ResponseTimeout),
		RetryCount:              o.Retry.RetryCnt,
		PKey:                    0xffff,
		PathMTU:                 cm.MTU(o.PathMTU),
		RNRRetryCount:           o.Retry.RNRRetry,
		MaxCMRetries:            uint8(min(o.MaxRetries, 15)),
		Primary: cm.Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: cm.GIDFromAddr(dev.Addr()),
			RemoteGID: cm.GIDFromAddr(peer), TrafficClass: o.TrafficClass, HopLimit: 64,
			LocalACKTimeout: o.Retry.Timeout},
	}
	hdr := cm.CMAHeaderFields{Version: cm.CMAVersion, SrcPort: c.localPort, Src: dev.Addr(), Dst: peer}
	if err := cm.CMAHeader(req.PrivateData[:cm.CMAHeaderSize]).Encode(&hdr); err != nil {
		c.releaseFailed()
		return nil, fmt.Errorf("rdmacm: Dial: %w", err)
	}
	copy(req.PrivateData[cm.CMAHeaderSize:], o.PrivateData)
	if o.SelectiveRepeat {
		c.localECE = ECE{VendorID: VendorID, Options: ECESelectiveRepeat}
		req.VendorID = VendorID
	}

	m.mu.Lock()
	if m.closed || m.leaving.Load() || m.agentGone() {
		m.mu.Unlock()
		c.releaseFailed()
		return nil, m.closeErr
	}
	c.localID = m.newLocalID()
	req.LocalCommID = c.localID
	c.tid = m.agent.NewTID()
	m.conns[c.localID] = c
	c.state = stREQSent
	err := c.sendLocked(&req)
	m.mu.Unlock()
	if err != nil {
		m.mu.Lock()
		c.finishLocked(err)
		m.mu.Unlock()
		c.releaseFailed()
		return nil, fmt.Errorf("rdmacm: Dial: %w", closedAs(err))
	}
	if err := c.waitEstablished(ctx); err != nil {
		return nil, err // released: nothing is left for the caller to close
	}
	return c, nil
}

// testHookEstablished, when a test sets it, runs in waitEstablished
// right after the connection was established or failed, before it looks
// at the state: a test holds the waiter there to stand for a loaded
// machine's scheduling delay.
var testHookEstablished atomic.Pointer[func(*Conn)]

// waitEstablished waits for the connection to be established or to fail;
// on ctx's end it aborts it.
func (c *Conn) waitEstablished(ctx context.Context) error {
	aborted := false
	var ctxErr error // ctx's error when the abort ended a live connection
	select {
	case <-c.estab:
		if h := testHookEstablished.Load(); h != nil {
			(*h)(c)
		}
	case <-ctx.Done():
		aborted = true
		c.m.mu.Lock()
		live := c.err == nil
		c.m.mu.Unlock()
		c.abort(ctx.Err())
		<-c.estab
		c.m.mu.Lock()
		if c.state != stEstablished && c.err == nil {
			c.err = ctx.Err()
		}
		c.m.mu.Unlock()
		if live {
			// The abort ended it (a connection established just
			// before ctx ended is closed by it, which sets its
			// error to ErrClosed): the caller asked for ctx's error.
			ctxErr = ctx.Err()
		}
	}
	c.m.mu.Lock()
	err := c.err
	if ctxErr != nil {
		err = ctxErr
	}
	// Established, or established and ended since (the peer's DREQ, a
	// failed QP, all before this goroutine ran on a loaded machine):
	// the caller gets the connection, its completions in its CQs, and
	// learns of the end from Done and Err. A connection aborted above
	// (ctx ended) is not handed out: the abort disconnected it.
	est := c.state == stEstablished || (c.wasEstab && !aborted)
	c.m.mu.Unlock()
	if est {
		return nil
	}
	c.releaseFailed()
	if err == nil {
		err = ErrClosed
	}
	return err
}

// abort ends a connection that is not established: a REJ before the
// reply (with reason "timeout", as Linux sends when an active side gives
// up), and for a connection established meanwhile a DREQ.
func (c *Conn) abort(why error) {
	m := c.m
	m.mu.Lock()
	switch c.state {
	case stREQSent, stREQRcvd, stREPSent:
		c.sendLocked(c.giveUpREJLocked())
		if c.state == stREQSent {
			m.abandonLocked(c)
		}
		c.finishLocked(why)
		m.mu.Unlock()
	case stEstablished:
		m.mu.Unlock()
		c.Close()
	default:
		m.mu.Unlock()
	}
}

// giveUpREJLocked is the REJ that ends a connection in its handshake from
// this side: reason timeout from the active side (with this node's GUID,
// as Linux sends when it gives up), consumer from the passive side.
func (c *Conn) giveUpREJLocked() *cm.REJFields {
	kind := cm.KindREQ
	if c.state == stREPSent {
		kind = cm.KindREP
	}
	reason := cm.RejTimeout
	if !c.active {
		reason = cm.RejConsumer
	}
	rej := &cm.REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: kind, Reason: reason}
	if reason == cm.RejTimeout {
		rej.RejectedInfoLength = 8
		putGUID(rej.ARI[:], c.m.guid)
	}
	return rej
}

func putGUID(b []byte, g uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(g >> (56 - 8*i))
	}
}

// sendLocked sends msg as this connection's current MAD, to be sent again
// on each response timeout while the state waits for an answer.
func (c *Conn) sendLocked(msg cm.Message) error {
	c.retries = 0
	c.mraWait = 0 // an MRA was for the previous message
	err := c.m.sendMod(c.peer, c.opts.TrafficClass, c.tid, msg, &c.out, c.eceMod(msg))
	c.armLocked(c.retryWaitLocked())
	return err
}

// retryWaitLocked is how long the connection waits for an answer before
// it sends its message again: the response timeout, or longer once the
// peer's MRA asked for it, or, for a REP, when the REQ said the requester
// takes longer to answer (peerWait).
func (c *Conn) retryWaitLocked() time.Duration {
	if c.mraWait > 0 {
		return c.mraWait
	}
	if c.state == stREPSent && c.peerWait > c.opts.ResponseTimeout {
		return c.peerWait
	}
	if c.state == stREQSent {
		return reqWait(&c.opts)
	}
	return c.opts.ResponseTimeout
}

// reqWait is how long a Dial waits before it sends its REQ again: the
// remote CM response timeout its REQ advertises (the exponent at or above
// ResponseTimeout: 18, 1.07 s, for the default 1 s), never less, as
// Linux's ib_send_cm_req waits that plus twice the path's packet life
// time (none on a path rocev2 advertises: RoCE has no SA, and a REQ has no
// field for it).
func reqWait(o *Options) time.Duration {
	return max(o.ResponseTimeout, cm.Timeout(timeoutExp(o.ResponseTimeout)))
}

// resendLocked sends the current MAD again.
func (c *Conn) resendLocked() {
	c.m.st.madsOut.Add(1)
	c.m.agent.Send(c.peer, 1, c.opts.TrafficClass, c.out[:])
}

// armLocked (re)starts the response timer for states that wait.
func (c *Conn) armLocked(d time.Duration) {
	switch c.state {
	case stREQSent, stREPSent, stDREQSent:
	default:
		return
	}
	if c.timer == nil {
		c.timer = c.m.clock.AfterFunc(d, c.onTimer)
	} else {
		c.timer.Reset(d)
	}
}

// onTimer is the response timeout: send again, or give up.
func (c *Conn) onTimer() {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	switch c.state {
	case stREQSent, stREPSent, stDREQSent:
	default:
		return
	}
	if c.retries < c.max {
		c.retries++
		m.st.retransmits.Add(1)
		c.resendLocked()
		c.timer.Reset(c.retryWaitLocked())
		return
	}
	switch c.state {
	case stREQSent, stREPSent:
		kind := cm.KindREQ
		if c.state == stREPSent {
			kind = cm.KindREP
		}
		rej := &cm.REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: kind,
			Reason: cm.RejTimeout, RejectedInfoLength: 8}
		putGUID(rej.ARI[:], m.guid)
		var out [transport.MADSize]byte
		m.send(c.peer, c.opts.TrafficClass, c.tid, rej, &out)
		c.endedBy(CauseTimeout)
		if c.life.rej != nil { // the peer kept calling it stale
			c.finishLocked(c.life.rej)
			return
		}
		op, msg := "Dial", "REQ"
		if !c.active {
			op, msg = "Accept", "REP"
		}
		how := fmt.Sprintf("%v apart, none answered", c.retryWaitLocked())
		if c.mraWait > 0 {
			how = fmt.Sprintf("none answered but by an MRA (the peer asked for more time; the %ss went %v apart after it)", msg, c.mraWait)
		}
		c.finishLocked(fmt.Errorf("rdmacm: %s %v: %w: %d %ss sent, %s", op,
			netip.AddrPortFrom(c.peer, c.remotePort), ErrTimeout, c.retries+1, msg, how))
	case stDREQSent:
		c.endedBy(CauseTimeout)
		c.timeWaitLocked(ErrClosed)
	}
}

// finishLocked ends the connection for good: no more timers, the waiters
// released, the QP in ERR, the maps cleaned.
func (c *Conn) finishLocked(err error) {
	if c.ended {
		return
	}
	c.ended = true
	m := c.m
	if c.state == stEstablished || c.state == stDREQSent { // TimeWait counted it on entry
		m.st.disconnected.Add(1)
	}
	c.endedBy(causeOf(err))
	c.leaveHalfOpenLocked()
	c.endedUnacceptedLocked()
	c.unjournalLocked()
	if c.state == stTimeWait {
		m.timeWait--
	}
	c.unindexQPNLocked()
	c.state = stClosed
	if c.err == nil {
		c.err = err
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.acceptTimer != nil {
		c.acceptTimer.Stop()
	}
	if c.kaTimer != nil {
		c.kaTimer.Stop()
	}
	if m.conns[c.localID] == c {
		delete(m.conns, c.localID)
	}
	if k := (remoteKey{c.peer, c.remoteID}); m.remote[k] == c {
		delete(m.remote, k)
	}
	if c.qp != nil {
		c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	}
	select {
	case <-c.estab:
	default:
		close(c.estab)
	}
	select {
	case <-c.done: // closed by timeWaitLocked
	default:
		close(c.done)
	}
}

// timeWaitLocked ends an established connection: the QP goes to ERR now
// (flushing its work requests), Done closes, and the connection stays
// known for one response timeout to answer a duplicate DREQ.
func (c *Conn) timeWaitLocked(err error) {
	if c.state == stTimeWait || c.ended {
		return
	}
	c.endedBy(causeOf(err))
	c.leaveHalfOpenLocked()
	c.endedUnacceptedLocked()
	c.unjournalLocked()
	c.state = stTimeWait
	c.m.timeWait++
	// Ended for the application now, as Stats.Ended counts it (it was
	// counted at the end of the TimeWait, up to 2 s later).
	c.m.st.disconnected.Add(1)
	if c.err == nil {
		c.err = err
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.kaTimer != nil {
		c.kaTimer.Stop()
	}
	select {
	case <-c.estab:
	default:
		close(c.estab)
	}
	if c.qp != nil {
		c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	}
	select {
	case <-c.done:
	default:
		close(c.done)
	}
	c.m.clock.AfterFunc(timeWaitFor(&c.opts), func() {
		c.m.mu.Lock()
		defer c.m.mu.Unlock()
		if c.ended {
			return
		}
		c.ended = true
		c.m.timeWait--
		c.unindexQPNLocked()
		c.state = stClosed
		if c.timer != nil {
			c.timer.Stop()
		}
		if c.m.conns[c.localID] == c {
			delete(c.m.conns, c.localID)
		}
		if k := (remoteKey{c.peer, c.remoteID}); c.m.remote[k] == c {
			delete(c.m.remote, k)
		}
	})
}

// Close disconnects: a DREQ to the peer, then a bounded wait for its DREP
// (at most three response timeouts), the QP to ERR (its outstanding work
// requests complete with WCWRFlushErr) and what the connection created
// destroyed. Closing a connection the peer has ended only releases it;
// after its device closed (whose Close released the QP and CQs) it
// deallocates the PD it created and returns nil.
//
// A PD the connection created (Options.PD nil) is deallocated too, which
// fails while memory regions are registered in it (those of Prepare,
// say): Close then returns that error (matching memreg.ErrBusy) and leaves
// the PD allocated. Deregister them and call Close again to free it.
func (c *Conn) Close() error {
	m := c.m
	m.mu.Lock()
	switch c.state {
	case stEstablished:
		// What the QP has queued for the wire leaves before the DREQ.
		// The device hands a received batch's completions to the
		// application before it sends the ACKs the batch queued; a DREQ
		// sent in answer to such a completion would otherwise overtake
		// the ACK of the message just received, and the peer, which
		// moves its QP to ERR on the DREQ, would flush that message's
		// send as failed (seen with perftest -R between two rocev2d: the
		// last SEND of the exchange completed with WCWRFlushErr). The QP
		// itself stays up until the DREP: a request the peer sent before
		// it saw the DREQ is still answered (moving it to ERR first, as
		// rdma_disconnect does, left rping's client in the VM with an
		// unanswered SEND and, now and then, a failed run).
		c.qp.SendQueued()
		c.endedBy(CauseLocalClose)
		dreq := &cm.DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.params.DestQPN}
		c.state = stDREQSent
		c.max = min(c.opts.MaxRetries, 2)
		c.sendLocked(dreq)
	case stREQSent, stREQRcvd, stREPSent:
		m.mu.Unlock()
		c.abort(ErrClosed)
		m.mu.Lock()
	}
	m.mu.Unlock()
	<-c.done
	m.mu.Lock()
	if c.err == nil {
		c.err = ErrClosed
	}
	m.mu.Unlock()
	return c.release()
}

// establishPassiveLocked establishes the passive connection on the RTU
// (or the first packet on its QP, which stands for it); the QP is in RTS
// since the REP.
func (c *Conn) establishPassiveLocked() {
	if c.m.leaving.Load() { // its REJ went with the farewell
		c.finishLocked(c.m.closeErr)
		return
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	c.leaveHalfOpenLocked()
	c.state = stEstablished
	c.wasEstab = true
	c.m.st.established.Add(1)
	c.journalLocked()
	c.startLivenessLocked()
	close(c.estab)
	if c.life.owed { // answered by Accept's workers: to its queue
		c.listener.readyLocked(c)
	}
}
