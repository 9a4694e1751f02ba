package rdmacm

import (
	"errors"
	"fmt"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
)

// Why an established connection ended. Conn.Err wraps one of them (and
// the cause: the QP's error, a *transport.WCError, with errors.As).
var (
	// ErrDisconnected: the peer disconnected (a DREQ arrived). It also
	// matches ErrClosed.
	ErrDisconnected error = &kindOf{"rdmacm: disconnected by the peer", []error{ErrClosed}}
	// ErrQPFailed: the connection's QP moved to the error state: a work
	// request failed (retry or RNR retry exceeded — the peer stopped
	// answering —, a remote access or operational error, a local error),
	// its responder refused a request, or its CQ overflowed.
	ErrQPFailed = errors.New("rdmacm: the connection's QP failed")
	// ErrKeepAlive: the peer answered no keep-alive probe within
	// Options.KeepAliveTimeout.
	ErrKeepAlive = errors.New("rdmacm: keep-alive: the peer did not answer")
)

// kindOf is a sentinel error that also matches a wider one.
type kindOf struct {
	msg  string
	also []error
}

func (e *kindOf) Error() string { return e.msg }

// Unwrap lets errors.Is and errors.As look at the wider errors.
func (e *kindOf) Unwrap() []error { return e.also }

// errDeviceClosed is what rdmacm's calls and waiters see once the device
// closed: rdmacm's ErrClosed and the transport's.
var errDeviceClosed error = &kindOf{"rdmacm: closed: the device is closed", []error{ErrClosed, transport.ErrClosed}}

// closedAs returns errDeviceClosed for err when err says the device is
// closed (transport.ErrClosed) but not yet in rdmacm's words: a call that
// races Device.Close fails in the transport before the manager has seen
// the device close, and must say so in both vocabularies, as the calls
// after it do.
func closedAs(err error) error {
	if errors.Is(err, transport.ErrClosed) && !errors.Is(err, ErrClosed) {
		return errDeviceClosed
	}
	return err
}

// errManagerClosed is what they see once Manager.Close closed their
// manager (the device stays open): ErrClosed.
var errManagerClosed error = &kindOf{"rdmacm: closed: the connection manager is closed", []error{ErrClosed}}

// closedCause is what the objects a closed connection destroyed (its QP
// and CQs) answer their callers and waiters with, besides
// transport.ErrDestroyed: ErrClosed, and why the connection ended.
func closedCause(why error) error {
	if why == nil || why == ErrClosed {
		return ErrClosed
	}
	if errors.Is(why, ErrClosed) {
		return why
	}
	return fmt.Errorf("%w: %w", ErrClosed, why)
}

// Keep-alive defaults (Options.KeepAlive, Options.KeepAliveTimeout).
const (
	DefaultKeepAlive        = 15 * time.Second
	DefaultKeepAliveTimeout = 10 * time.Second
)

// startLivenessLocked begins watching an established connection: the
// QP's failure ends it (watchQP), and the keep-alive timer proves an idle
// peer alive. Called with m.mu held, once, when the connection is
// established.
func (c *Conn) startLivenessLocked() {
	if c.qp == nil {
		return
	}
	go c.watchQP(c.qp.Failed())
	if c.opts.KeepAlive > 0 {
		c.kaHeard = c.qp.Activity()
		c.kaTimer = c.m.clock.AfterFunc(c.opts.KeepAlive, c.keepAliveTick)
	}
}

// watchQP ends the connection when its QP fails.
func (c *Conn) watchQP(failed <-chan struct{}) {
	select {
	case <-failed:
	case <-c.done:
		return
	}
	cause := c.qp.Err()
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.state != stEstablished {
		return // closing already
	}
	var err error
	var we *transport.WCError
	switch {
	case errors.Is(cause, transport.ErrClosed):
		// The device is closing; the manager's shutdown ends every
		// connection in those words.
		err = errDeviceClosed
	case errors.As(cause, &we) && we.WRID == transport.ProbeWRID:
		err = fmt.Errorf("%w: probe of %v: %w", ErrKeepAlive, c.peer, cause)
		m.st.keepAliveFailed.Add(1)
	case cause == nil:
		err = fmt.Errorf("%w: moved to the error state by its owner", ErrQPFailed)
		m.st.qpFailed.Add(1)
	default:
		err = fmt.Errorf("%w (peer %v): %w", ErrQPFailed, c.peer, cause)
		m.st.qpFailed.Add(1)
	}
	c.lostLocked(err)
}

// keepAliveTick runs every KeepAlive while the connection is established:
// a peer heard from since the last tick is alive; a silent one is sent a
// probe (transport.QP.Probe); a probe unanswered for KeepAliveTimeout
// ends the connection. (A dead peer usually fails the probe sooner: the
// QP's retry count runs out, and watchQP ends the connection.)
func (c *Conn) keepAliveTick() {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.state != stEstablished || c.ended {
		return
	}
	now := m.clock.Now()
	if h := c.qp.Activity(); h != c.kaHeard {
		c.kaHeard, c.kaProbing = h, false
		c.kaTimer.Reset(c.opts.KeepAlive)
		return
	}
	if !c.kaProbing {
		if err := c.qp.Probe(); err != nil {
			return // the QP failed or is going: watchQP reports it
		}
		m.st.keepAliveProbes.Add(1)
		c.kaProbing, c.kaSince = true, now
		c.kaTimer.Reset(min(c.opts.KeepAlive, c.opts.KeepAliveTimeout))
		return
	}
	if left := c.opts.KeepAliveTimeout - now.Sub(c.kaSince); left > 0 {
		c.kaTimer.Reset(left)
		return
	}
	m.st.keepAliveFailed.Add(1)
	c.lostLocked(fmt.Errorf("%w: no packet from %v for %v after a probe", ErrKeepAlive, c.peer, now.Sub(c.kaSince)))
}

// lostLocked ends an established connection that failed (err says why):
// the QP to ERR, Done closed now, and a DREQ to the peer (sent again as
// Close's is), in case it is alive and only its QP or our path failed.
func (c *Conn) lostLocked(err error) {
	if c.state != stEstablished {
		return
	}
	if c.err == nil {
		c.err = err
	}
	c.endedBy(causeOf(err))
	if c.kaTimer != nil {
		c.kaTimer.Stop()
	}
	c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	dreq := &cm.DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.params.DestQPN}
	c.state = stDREQSent
	c.max = min(c.opts.MaxRetries, 2)
	c.sendLocked(dreq)
	c.endedUnacceptedLocked()
	select {
	case <-c.done:
	default:
		close(c.done)
	}
}
