package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
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
	// (default 128). When it is full, a new request sheds a half-open
	// one of the source address that holds the most (the oldest of all
	// when every source holds one): its oldest unanswered one, dropped
	// without a word, else one answered, rejected (no resources). When
	// the new request's own source holds the most and all its other
	// requests are answered, the new request is dropped without a word
	// instead (Stats.BacklogDropped; its requester sends it again), so
	// that a client reconnecting in a loop does not fail its attempt
	// about to complete. A REQ flood costs bounded memory, and a flood
	// from one address cannot push out another's requests.
	//
	// Backlog also bounds Listener.Accept's accept queue: the connections
	// its workers answered (a QP created, the REP sent) or established
	// and Accept has not handed out yet, of which one source address may
	// hold half (rounded up). While the queue is full, or a request's
	// source holds its half, the request waits unanswered — no QP, no
	// REP, and no MRA when the requester sends it again, so that its
	// retries run out and it fails (ErrTimeout) instead of hanging —
	// until Accept makes room, within the bounds above (HalfOpenTimeout ends it
	// with a REJ, timeout), as Linux's rdma_cm creates no QP and sends no
	// REP before rdma_accept. Stats.AcceptQueueFull counts them.
	Backlog int
	// HalfOpenTimeout bounds how long a request may stay half-open —
	// waiting for the application's answer or for the requester's RTU —
	// whatever the REQ's response timeout and retry count ask for
	// (default 10 s); then it is rejected (timeout).
	HalfOpenTimeout time.Duration
}

// Listener accepts rdma_cm connections on one port of the TCP port space
// (what rdma_listen does).
type Listener struct {
	m        *Manager
	port     uint16
	svc      uint64
	opts     ListenOptions
	wake     chan struct{} // a request was queued (capacity 1)
	closedCh chan struct{}

	// Accept's side: from the first Accept on, acceptWorkers goroutines
	// (serve) answer requests while the accept queue has room; the
	// established connections wait in ready for Accept.
	serveOnce sync.Once
	readyWake chan struct{}   // a connection was queued in ready (capacity 1)
	ctx       context.Context // ends with the listener
	cancel    context.CancelFunc

	// Under m.mu:
	queue  []*Conn            // requests not yet handed out by Next (or taken by Accept's workers), in arrival order
	half   []*Conn            // half-open requests, in arrival order (at most Backlog)
	perSrc map[netip.Addr]int // half-open requests by source address
	// The accept queue: owed counts the connections Accept's workers
	// took to answer and Accept has not handed out, not ended (at most
	// Backlog; owedBy by source address, at most srcShare each). ready
	// holds the established ones in order, with those that ended there
	// (dead of them, at most Backlog: their QP destroyed at once, their
	// CQs kept for Accept).
	accepting bool // Accept was called: its workers serve the queue
	owed      int
	owedBy    map[netip.Addr]int
	ready     []*Conn
	dead      int
	closed    bool
	// closeErr is what Next and Accept return once closed (set before
	// closedCh closes; nil: ErrClosed).
	closeErr error
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

// Listen starts accepting connection requests for port on the manager's
// device.
func (m *Manager) Listen(port uint16, opts *ListenOptions) (*Listener, error) {
	if opts != nil {
		if err := opts.Options.check("Listen", cm.REPPrivateDataSize); err != nil {
			return nil, err
		}
	}
	var o ListenOptions
	if opts != nil {
		o = *opts
	}
	if o.Backlog <= 0 {
		o.Backlog = 128
	}
	if o.HalfOpenTimeout <= 0 {
		o.HalfOpenTimeout = 10 * time.Second
	}
	l := &Listener{m: m, port: port, svc: cm.ServiceID(cm.PSTCP, port), opts: o,
		wake: make(chan struct{}, 1), closedCh: make(chan struct{}), readyWake: make(chan struct{}, 1),
		perSrc: map[netip.Addr]int{}, owedBy: map[netip.Addr]int{}}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.leaving.Load() || m.agentGone() {
		l.cancel()
		return nil, m.closeErr
	}
	if _, busy := m.listeners[l.svc]; busy {
		l.cancel()
		return nil, fmt.Errorf("rdmacm: Listen on port %d: %w: the port has a listener", port, ErrInUse)
	}
	if err := m.dev.ClaimService(l.svc); err != nil {
		l.cancel()
		if errors.Is(err, transport.ErrClosed) {
			return nil, closedAs(err) // the device closed under this call
		}
		return nil, fmt.Errorf("rdmacm: Listen on port %d: %w: %v", port, ErrInUse, err)
	}
	m.listeners[l.svc] = l
	return l, nil
}

// Addr returns the address and port the listener accepts on.
func (l *Listener) Addr() netip.AddrPort { return netip.AddrPortFrom(l.m.dev.Addr(), l.port) }

// Next returns the next connection request. Use either Next (and answer
// each request) or Accept on a listener, not both.
func (l *Listener) Next(ctx context.Context) (*Request, error) {
	m := l.m
	for {
		m.mu.Lock()
		if n := len(l.queue); n > 0 {
			c := l.queue[0]
			l.queue[0] = nil
			l.queue = l.queue[1:]
			c.life.queued = false
			if n > 1 {
				select { // another waiter may take the rest
				case l.wake <- struct{}{}:
				default:
				}
			}
			m.mu.Unlock()
			return &Request{c: c, l: l}, nil
		}
		if err := l.waitLocked(ctx, l.wake); err != nil {
			return nil, err
		}
	}
}

// waitLocked waits, m.mu held and let go, for wake (something was queued
// or a place came free), the listener's close or ctx's end; it returns
// the error that ends the caller's wait (closedErr, ctx.Err()), or nil:
// look again. For Next, Accept and the workers' take.
func (l *Listener) waitLocked(ctx context.Context, wake <-chan struct{}) error {
	closed, cerr := l.closed, l.closeErr
	l.m.mu.Unlock()
	if closed {
		return closedErr(cerr)
	}
	select {
	case <-wake:
	case <-l.closedCh: // looked at again by the caller
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// closedErr is what Next, Accept and the workers return once the
// listener is closed: its closeErr, else ErrClosed.
func closedErr(cerr error) error {
	if cerr != nil {
		return cerr
	}
	return ErrClosed
}

// Accept returns the next established connection, accepted with the
// listener's options. The listener accepts requests concurrently from the
// first Accept on (one at a time when the options name a QP of the
// caller's), within the listener's half-open timeout, so requests that
// never complete (a lost or forged peer) do not hold up the others;
// connections established while nobody waits in Accept wait for the next
// call (as accept(2)'s queue). That accept queue is bounded by Backlog,
// and one source address holds at most half of it: beyond, requests wait
// unanswered — no QP is created, no REP sent — until Accept makes room
// (ListenOptions.Backlog), so a peer that connects and never gets
// accepted cannot take the device's QPs.
//
// A connection the peer established and has ended since, before Accept
// handed it out (it wrote and disconnected before the application's
// Accept ran; or keep-alive, its QP or a DREQ ended it while it waited),
// is returned too, as accept(2) returns a socket whose peer has closed:
// its Done is closed, Err says why, and the completions it received are
// in its CQs. Its QP was destroyed when it ended (the device's place for
// it freed without waiting for Accept); Close releases the rest. Of those,
// the listener keeps at most Backlog, releasing the oldest beyond
// (Stats.AcceptQueueEvicted). Use either Next or Accept on a listener,
// not both.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	m := l.m
	l.serveOnce.Do(func() {
		m.mu.Lock()
		l.accepting = true
		m.mu.Unlock()
		go l.serve()
	})
	for {
		m.mu.Lock()
		if h := testHookEstablished.Load(); h != nil && len(l.ready) > 0 {
			// Stands for the scheduling delay between the
			// establishment and this goroutine's look at the queue.
			c := l.ready[0]
			m.mu.Unlock()
			(*h)(c)
			m.mu.Lock()
		}
		if n := len(l.ready); n > 0 {
			c := l.ready[0]
			l.ready[0] = nil
			l.ready = l.ready[1:]
			c.life.ready = false
			if c.life.dead {
				c.life.dead = false
				l.dead--
			}
			c.unoweLocked()
			m.mu.Unlock()
			if n > 1 {
				select { // another Accept may take the rest
				case l.readyWake <- struct{}{}:
				default:
				}
			}
			return c, nil
		}
		if err := l.waitLocked(ctx, l.readyWake); err != nil {
			return nil, err
		}
	}
}

// acceptWorkers is how many requests a listener's Accept sets up (QP,
// REP) at once; the wait for each requester's RTU costs no worker.
const acceptWorkers = 4

// serve answers requests until the listener closes: acceptWorkers
// goroutines take requests (take: while the accept queue has room, the
// source holding the fewest places in it first) and reply; the RTU
// establishes the connection into the accept queue (readyLocked), no
// goroutine of its own waiting for it.
func (l *Listener) serve() {
	if l.opts.QP != nil {
		// The caller's one QP serves one connection at a time: each
		// request is accepted to the end before the next is taken.
		go func() {
			for {
				r, err := l.take(l.ctx)
				if err != nil {
					return
				}
				o := l.opts.Options
				// Established, it waits in the accept queue; failed,
				// Accept has released it.
				r.Accept(l.ctx, &o)
			}
		}()
		return
	}
	for i := 0; i < acceptWorkers; i++ {
		go func() {
			for {
				r, err := l.take(l.ctx)
				if err != nil {
					return
				}
				o := l.opts.Options
				// An error: that peer went away, was shed or timed
				// out, or no reply could be built; reply has rejected
				// and released it then, so it is not left half-open.
				r.reply(&o)
			}
		}()
	}
}

// waitsForPlaceLocked reports whether request c, queued, waits for a
// place in Accept's queue (counted in AcceptQueueFull, or would be now).
func (l *Listener) waitsForPlaceLocked(c *Conn) bool {
	if !l.accepting || !c.life.queued {
		return false
	}
	return c.life.deferred || l.owed >= l.opts.Backlog || l.owedBy[c.peer] >= l.srcShare()
}

// srcShare is how many places of the accept queue one source address
// may hold: half of them, rounded up.
func (l *Listener) srcShare() int { return (l.opts.Backlog + 1) / 2 }

// take waits for a request Accept's workers may answer — one is queued
// and the accept queue has a place for its source — and takes that place
// for it. Of those requests it takes the one whose source holds the
// fewest places, then one sent again (its requester is there), then the
// one whose source holds the fewest half-open requests, then the oldest:
// a flood from one address waits behind everybody else.
func (l *Listener) take(ctx context.Context) (*Request, error) {
	m := l.m
	for {
		m.mu.Lock()
		if i := l.pickLocked(); i >= 0 {
			c := l.queue[i]
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			c.life.queued, c.life.deferred = false, false
			c.life.owed = true
			l.owed++
			l.owedBy[c.peer]++
			more := len(l.queue) > 0 && l.owed < l.opts.Backlog
			m.mu.Unlock()
			if more {
				select { // another worker may take the rest
				case l.wake <- struct{}{}:
				default:
				}
			}
			return &Request{c: c, l: l}, nil
		}
		if err := l.waitLocked(ctx, l.wake); err != nil {
			return nil, err
		}
	}
}

// pickLocked returns the index in l.queue of the request take answers
// next, or -1 if none has a place in the accept queue; each request left
// waiting for one counts once in Stats.AcceptQueueFull.
func (l *Listener) pickLocked() int {
	full := l.owed >= l.opts.Backlog
	share := l.srcShare()
	best := -1
	for i, c := range l.queue {
		if full || l.owedBy[c.peer] >= share {
			if !c.life.deferred {
				c.life.deferred = true
				l.m.st.acceptQFull.Add(1)
			}
			continue
		}
		if best < 0 || l.before(c, l.queue[best]) {
			best = i
		}
	}
	return best
}

// before reports whether request x goes before b (take's order; b is
// the older).
func (l *Listener) before(x, b *Conn) bool {
	if ox, ob := l.owedBy[x.peer], l.owedBy[b.peer]; ox != ob {
		return ox < ob
	}
	if x.life.retried != b.life.retried {
		return x.life.retried
	}
	return l.perSrc[x.peer] < l.perSrc[b.peer]
}

// readyLocked queues a connection Accept's workers answered, just
// established, for Accept; on a closed listener it is disconnected.
func (l *Listener) readyLocked(c *Conn) {
	if l.closed {
		c.unoweLocked()
		go c.Close()
		return
	}
	c.life.ready = true
	l.ready = append(l.ready, c)
	select {
	case l.readyWake <- struct{}{}:
	default:
	}
}

// unoweLocked gives the connection's place in its listener's accept
// queue back (handed out by Accept, or ended), so that a worker may take
// another request.
func (c *Conn) unoweLocked() {
	if !c.life.owed {
		return
	}
	c.life.owed = false
	l := c.listener
	l.owed--
	if l.owedBy[c.peer]--; l.owedBy[c.peer] <= 0 {
		delete(l.owedBy, c.peer)
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// endedUnacceptedLocked runs wherever a connection ends (its Done
// closes). A request that waited for a place in the accept queue counts
// as dropped; a connection Accept's workers answered and Accept has not
// handed out gives its QP to the device at once, instead of when the
// application gets to it, and then its place in the queue: one the RTU
// never established is released whole (nobody else holds it), an
// established one loses its QP and waits in the queue, ended, with its
// CQs (a closed listener's is released whole). The releases run on a
// goroutine of their own, since a QP's destruction takes m.mu; the place
// is given back after, so that the listener's QPs stay within Backlog. A
// connection on the caller's QP (Options.QP) is left to the worker that
// accepts it.
func (c *Conn) endedUnacceptedLocked() {
	l := c.listener
	if l == nil {
		return
	}
	if c.life.deferred {
		c.life.deferred = false
		c.m.st.acceptQDropped.Add(1)
	}
	own := c.opts.QP == nil
	then := func(release func()) {
		go func() {
			release()
			c.m.mu.Lock()
			c.unoweLocked()
			c.m.mu.Unlock()
		}()
	}
	switch {
	case c.life.ready && !c.life.dead:
		c.life.dead = true
		l.dead++
		if l.closed {
			c.unoweLocked()
			l.dropReadyLocked(c, own)
			break
		}
		if own {
			then(c.releaseQP)
		} else {
			c.unoweLocked()
		}
		for i := 0; l.dead > l.opts.Backlog && i < len(l.ready); {
			if x := l.ready[i]; x.life.dead { // the oldest ended one
				c.m.st.acceptQEvicted.Add(1)
				l.dropReadyLocked(x, x.opts.QP == nil)
				continue
			}
			i++
		}
	case c.life.ready:
		// Ended before (dead): a second end (the peer's DREP after
		// the DREQ of a keep-alive failure) while the first's
		// goroutine has not yet given the place back. The connection
		// stays queued with its CQs for Accept (review25: this
		// released it whole, CQs and all).
	case c.life.owed && c.life.replied && own:
		then(c.releaseFailed)
	case c.life.owed && own:
		// A worker is setting it up (reply): its QP may exist already.
		// The worker gives the place back once it has released it
		// (before, the place came free here, and another worker's QP
		// could join this one's: Backlog+acceptWorkers QPs at once).
	default:
		c.unoweLocked()
	}
}

// dropReadyLocked takes an ended connection out of the accept queue and
// releases it, not to be handed out.
func (l *Listener) dropReadyLocked(c *Conn, release bool) {
	for i, x := range l.ready {
		if x == c {
			l.ready = append(l.ready[:i], l.ready[i+1:]...)
			break
		}
	}
	c.life.ready, c.life.dead = false, false
	l.dead--
	if release {
		go c.releaseFailed()
	}
}

// Close stops listening; requests not yet accepted are rejected, and
// connections established but not yet returned by Accept are closed.
func (l *Listener) Close() error {
	m := l.m
	m.mu.Lock()
	l.closeLocked()
	queued := l.queue
	l.queue = nil
	for _, c := range queued {
		c.life.queued = false
	}
	ready := l.ready
	l.ready = nil
	for _, c := range ready {
		c.life.ready = false
		if c.life.dead {
			c.life.dead = false
			l.dead--
		}
		c.unoweLocked()
	}
	m.mu.Unlock()
	l.cancel()
	for _, c := range queued {
		(&Request{c: c, l: l}).Reject(nil)
	}
	for _, c := range ready {
		c.Close()
	}
	return nil
}

func (l *Listener) closeLocked() {
	if l.closed {
		return
	}
	l.closed = true
	if l.m.listeners[l.svc] == l {
		delete(l.m.listeners, l.svc)
		l.m.dev.ReleaseService(l.svc)
	}
	close(l.closedCh)
}

// shedLocked makes room in a full backlog for a new request from src
// (key names it), or reports false: the new request is to be dropped
// instead. The victim is a request of the source address holding the
// most (src counted with the new request), so that a flood from one
// address cannot push out another's requests: its oldest unanswered one
// (dropped without a word, as a full SYN queue drops a SYN: a live
// requester sends its REQ again after its response timeout), else, when
// that source is another than src, its oldest one taken to be answered
// (a QP being set up, or the REP sent and the RTU awaited: rejected, no
// resources, since its requester may think itself connected). When src
// itself holds the most and has no unanswered request to give up, the
// new request is dropped without a word (Stats.BacklogDropped) and
// remembered as shed: its requester sends it again, and the answered
// ones — about to complete, perhaps the same client's previous attempt —
// are not failed for a newer one of theirs, as neither Linux's rdma_cm
// (a REQ beyond the backlog is dropped, cm_destroy_id's -ENOMEM "to allow
// future retries") nor TCP (tcp_conn_request drops the SYN; no SYN_RECV
// request is evicted for it) fails an answered request for a new one.
// When every source holds at most one and src none, the oldest request
// waiting for its RTU goes first, then the oldest unanswered one. A
// request sent again after it was shed is never the victim while
// another of its source can be.
func (l *Listener) shedLocked(src netip.Addr, key remoteKey) bool {
	if len(l.half) == 0 {
		return true
	}
	count := func(a netip.Addr) int {
		n := l.perSrc[a]
		if a == src {
			n++
		}
		return n
	}
	heavy, most := src, count(src)
	for a := range l.perSrc {
		if n := count(a); n > most {
			heavy, most = a, n
		}
	}
	// first returns the oldest request of heavy (of anyone: !match)
	// that is queued (unanswered) or not, sent again or not (any).
	first := func(match, queued, any bool) *Conn {
		for _, c := range l.half {
			if (!match || c.peer == heavy) && c.life.queued == queued && (any || !c.life.retried) {
				return c
			}
		}
		return nil
	}
	m := l.m
	var victim *Conn
	switch {
	case most == 1:
		// Every source holds at most one and src none: the oldest
		// request still waiting for its RTU goes (a requester that is
		// there answers a REP within a round trip), then the oldest
		// unanswered one.
		if victim = first(false, false, false); victim == nil {
			if victim = first(false, true, false); victim == nil {
				victim = l.half[0]
			}
		}
	case heavy == src:
		if victim = first(true, true, false); victim == nil {
			// src's other requests are answered (or sent again):
			// the new one waits for its requester's next try.
			m.st.backlogDropped.Add(1)
			m.rememberShedLocked(key)
			return false
		}
	default:
		// Another source holds more than src would: one of its goes,
		// a request sent again only when it has no other.
		for _, any := range []bool{false, true} {
			if victim = first(true, true, any); victim == nil {
				victim = first(true, false, any)
			}
			if victim != nil {
				break
			}
		}
	}
	m.st.shed.Add(1)
	m.st.rejBacklog.Add(1)
	if victim.life.queued {
		m.rememberShedLocked(remoteKey{victim.peer, victim.remoteID})
	} else {
		kind := cm.KindREQ
		if victim.state == stREPSent {
			kind = cm.KindREP
		}
		rej := &cm.REJFields{LocalCommID: victim.localID, RemoteCommID: victim.remoteID, MessageRejected: kind, Reason: cm.RejNoResources}
		var out [transport.MADSize]byte
		m.send(victim.peer, victim.opts.TrafficClass, victim.tid, rej, &out)
	}
	victim.endedBy(CauseShed)
	victim.finishLocked(errShed)
	return true
}

// rememberShedLocked notes a request dropped unanswered for a full
// backlog: sent again, it proves its requester is there (onREQ).
func (m *Manager) rememberShedLocked(key remoteKey) {
	if len(m.shedIDs) >= 1024 {
		clear(m.shedIDs)
	}
	m.shedIDs[key] = true
}

// Accept accepts the request with opts: the QP goes to RTR, the REP goes
// out, and Accept returns once the requester's RTU (or its first packet)
// arrives — with the connection even if the requester has disconnected
// it since (its Done closed, as Listener.Accept). On ctx's end the
// request is rejected, and so it is when no reply can be built (opts
// contradict each other or carry more private data than the REP's 196
// bytes, the QP cannot be set up): the requester's Dial fails at once
// with a *RejectError (consumer reject) instead of at its deadline.
func (r *Request) Accept(ctx context.Context, opts *Options) (*Conn, error) {
	c, err := r.reply(opts)
	if err != nil {
		return nil, err
	}
	if err := c.waitEstablished(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// reply is Accept up to the REP: the QP set up and in RTS, the REP sent.
// A request one of Accept's workers took (its place in the accept queue
// held) and that fails or ended before its REP gives the place back here,
// once what it created is released.
func (r *Request) reply(opts *Options) (_ *Conn, err error) {
	c := r.c
	m := c.m
	defer func() {
		if err != nil {
			m.mu.Lock()
			if !c.life.replied {
				c.unoweLocked()
			}
			m.mu.Unlock()
		}
	}()
	if err := opts.check("Accept", cm.REPPrivateDataSize); err != nil {
		// No reply can be built with these options: the requester
		// learns so at once (consumer reject, as rdma_accept's failure
		// path sends) rather than at its deadline.
		r.Reject(nil)
		return nil, err
	}
	o := opts.withDefaults()
	if o.TrafficClass == 0 {
		// The requester's traffic class, for the REP and every MAD
		// after it and for the QP, as Linux's CM takes the passive
		// side's path (traffic class included) from the REQ: a client
		// that asks for a DSCP (rdma_set_option TOS; ucmatose -t) gets
		// its answers in that class too.
		o.TrafficClass = c.req.Primary.TrafficClass
	}
	var bound transport.MTU // an explicit PathMTU; zero: take the REQ's
	if opts != nil {
		bound = opts.PathMTU
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
	// The REP goes as often as the REQ's Max CM Retries asks, not the
	// listener's MaxRetries: Linux's cm_req_handler keeps the REQ's
	// value (cm_id_priv->max_cm_retries) and cm_alloc_msg gives it to
	// the REP's MAD send (ib_send_cm_rep).
	c.max = int(c.req.MaxCMRetries)
	m.mu.Unlock()

	fail := func(err error) (*Conn, error) {
		r.Reject(nil)
		c.releaseFailed()
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
		c.releaseFailed()
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
	if q.Primary.LocalACKTimeout != 0 && !o.OwnACKTimeout {
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
	// RTR, then RTS before the REP, as Linux's rdma_accept does
	// (cma_accept_ib): the active side may send as soon as it has the
	// REP, and the application may answer its first message (seen on a
	// receive CQ shared by its connections, or on the QP of Prepare)
	// before the RTU has arrived. Before, the QP stayed in RTR until the
	// RTU and such an answer failed with ErrInvalidState.
	if err := c.qp.Connect(params); err != nil {
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
	if c.state != stREQRcvd || m.leaving.Load() { // rejected, timed out or said goodbye to meanwhile
		if c.err == nil {
			c.finishLocked(m.closeErr)
		}
		err := c.err
		m.mu.Unlock()
		c.releaseFailed()
		return nil, fmt.Errorf("rdmacm: Accept: %w", err)
	}
	c.state = stREPSent
	c.life.replied = true
	// Linux's rdma_cm asks for 4.3 s (CMA_CM_RESPONSE_TIMEOUT 20): a REP
	// sent again after 1 s only added load to a peer busy with many
	// requests (cmtime -c 3000 from the VM: 1723 REPs resent).
	c.peerWait = min(cm.Timeout(q.LocalCMResponseTimeout), MRAWaitFactor*o.ResponseTimeout)
	err = c.sendLocked(rep)
	m.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	// The first packet on the QP stands for a lost RTU.
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
	c.endedBy(CauseLocalClose)
	c.finishLocked(&RejectError{Reason: reason})
	return nil
}

// halfOpenExpired ends a request still half-open at its deadline: one the
// application has not answered, or whose RTU has not come within the
// listener's bound.
func (c *Conn) halfOpenExpired(bound time.Duration) {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	switch c.state {
	case stREQRcvd:
	case stREPSent:
		if left := bound - m.clock.Now().Sub(c.life.arrived); left > 0 {
			// The timer ran on the requester's bound, which applies
			// to the application's answer only: the REP is out, so
			// the listener's bound alone ends the wait for the RTU.
			c.acceptTimer.Reset(left)
			return
		}
	default:
		return
	}
	kind := cm.KindREQ
	if c.state == stREPSent {
		kind = cm.KindREP
	}
	rej := &cm.REJFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: kind, Reason: cm.RejTimeout,
		RejectedInfoLength: 8}
	putGUID(rej.ARI[:], m.guid)
	var out [transport.MADSize]byte
	m.send(c.peer, c.opts.TrafficClass, c.tid, rej, &out)
	c.endedBy(CauseHalfOpenTimeout)
	c.finishLocked(ErrTimeout)
}
