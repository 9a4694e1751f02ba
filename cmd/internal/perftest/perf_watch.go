package perftest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/gorocev2/rocev2/transport"
)

// perfPeerGrace is how long a side's data phase may go on without a
// packet sent or received once the peer has ended its own — it sent its
// next out-of-band message, or closed the connection — before the side
// gives up (a variable so tests can shorten it). A data phase that
// neither moves nor ends (receives that never come, a write awaited at
// the wrong place) waits for a peer that runs another test, -n, -s or -D,
// or that failed.
var perfPeerGrace = 5 * time.Second

// oobWatchConn is the TCP connection of a perftest exchange, which can be
// watched while the data phase runs and nothing is due on it: a byte from
// the peer then says the peer has ended its data phase, an end of file
// that the peer is gone. What the watch reads is handed to the exchange
// before anything else.
type oobWatchConn struct {
	net.Conn
	pending []byte // read by watch, not yet by Read
	// endless: the data phase runs until interrupted (--run_infinitely),
	// so a peer that closes the connection has ended the run.
	endless bool
}

// Read reads what watch read first, then from the connection.
func (c *oobWatchConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// watch returns a context derived from ctx for a data phase, which is
// cancelled, with the reason as its cause, once the peer has ended its own
// and moved (a count of this side's packets) has stood still for
// perfPeerGrace. stop ends the watch and must be called before the
// exchange reads again; no Read may run meanwhile.
func (c *oobWatchConn) watch(ctx context.Context, moved func() uint64) (wctx context.Context, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	quit := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		var b [1]byte
		n, err := c.Conn.Read(b[:])
		if n > 0 {
			c.pending = append(c.pending, b[:n]...)
		}
		var reason string
		switch {
		case n > 0:
			reason = "the peer ended its data phase and waits for this side, where nothing has moved for %v: " +
				"do both sides run the same test with the same -n, -s and -D?"
		case errors.Is(err, os.ErrDeadlineExceeded):
			return // stopped
		default:
			reason = "the peer closed the out-of-band connection, and nothing has moved on this side for %v since: " +
				"it failed (its own output says why), or it ended a run with another -n or -s"
			if c.endless {
				reason = "the peer closed the out-of-band connection (it was interrupted, or it failed and its own output says why), " +
					"and nothing has moved on this side for %v since"
			}
		}
		last := moved()
		t := time.NewTicker(perfPeerGrace)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-wctx.Done():
				return
			case <-t.C:
				if m := moved(); m != last {
					last = m // still running: a slower direction of -b, say
					continue
				}
				cancel(fmt.Errorf(reason, perfPeerGrace))
				return
			}
		}
	}()
	return wctx, func() {
		close(quit)
		c.Conn.SetReadDeadline(aLongTimeAgo)
		<-exited
		c.Conn.SetReadDeadline(time.Time{})
		cancel(nil)
	}
}

// watchRNR returns a context derived from ctx for the data phase of a
// SEND test on dev, which is cancelled when the peer has answered SENDs
// with RNR NAKs (no receive posted) and none has completed for
// perfPeerGrace: a peer that runs a WRITE, READ or atomic test posts no
// receives, and with rnr_retry 7 (infinite, as perftest's) the SENDs
// would be retried for ever. stop ends the watch.
func watchRNR(ctx context.Context, dev *transport.Device, test fmt.Stringer) (wctx context.Context, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(perfPeerGrace / 5)
		defer t.Stop()
		c0, since := dev.Counters(), time.Now()
		for {
			select {
			case <-done:
				return
			case <-wctx.Done():
				return
			case now := <-t.C:
				c := dev.Counters()
				if c.RDMASends != c0.RDMASends || c.RcvdRNRErr == c0.RcvdRNRErr {
					c0, since = c, now // progress, or no RNR NAK: a new window
					continue
				}
				if now.Sub(since) >= perfPeerGrace {
					cancel(fmt.Errorf("for %v the peer has answered SENDs with RNR NAKs (%d), none completed: it posts no receives — "+
						"does it run a WRITE, READ or atomic test against this %v? both sides need the same test",
						perfPeerGrace, c.RcvdRNRErr-c0.RcvdRNRErr, test))
					return
				}
			}
		}
	}()
	return wctx, func() {
		close(done)
		<-exited
		cancel(nil)
	}
}

// aLongTimeAgo is a deadline in the past, which interrupts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)
