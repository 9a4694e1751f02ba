package pingpong

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/transport"
)

// A ping-pong's loop waits for its own send and for the peer's message.
// The real tools wait for ever: a peer that finished earlier (a smaller
// -n), exited, was killed between acknowledging a message and sending its
// own, runs another ping-pong or another -s, or a UC or UD message lost on
// the way, leaves them hanging without a word. rocev2d gives up once
// nothing has arrived on the device for the idle timeout (--idle-timeout)
// and says what the counters show.

// defaultIdle is the idle timeout of a ping-pong without --idle-timeout.
const defaultIdle = 10 * time.Second

// idleTimeout is how long c's loop waits while nothing arrives: the
// --idle-timeout given (0: for ever, as the tools), else defaultIdle, or
// on an RC QP twice the time the peer's retries of one packet may take
// when that is longer (8 transmissions 4.096 µs × 2^T apart with this
// side's --qp-timeout T, taken for the peer's).
func (c *pingpongConfig) idleTimeout() time.Duration {
	if c.idleSet {
		return c.idle
	}
	d := defaultIdle
	if c.kind != ppUD && c.kind != ppUC && c.qpTimeout > 0 {
		retries := 2 * 8 * 4096 * time.Nanosecond << c.qpTimeout
		d = max(d, retries)
	}
	return d
}

// watchIdle returns a context that ends, with an *idleError as its cause,
// once no packet has arrived on dev (its rcvd_pkts counter stands still)
// for idle; stop ends the watch and returns that error if it ended the
// context. idle 0 never ends it.
func watchIdle(ctx context.Context, dev *transport.Device, idle time.Duration, kind ppKind, iters int) (context.Context, func() *idleError) {
	if idle <= 0 {
		return ctx, func() *idleError { return nil }
	}
	wctx, cancel := context.WithCancelCause(ctx)
	var (
		mu    sync.Mutex
		fired *idleError
	)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(max(idle/8, time.Millisecond))
		defer tick.Stop()
		last, since := dev.Counters().RcvdPkts, time.Now()
		for {
			select {
			case <-done:
				return
			case <-wctx.Done():
				return
			case now := <-tick.C:
				ctr := dev.Counters()
				if ctr.RcvdPkts != last {
					last, since = ctr.RcvdPkts, now
					continue
				}
				if now.Sub(since) >= idle {
					e := &idleError{idle: idle, kind: kind, iters: iters, ctr: ctr}
					mu.Lock()
					fired = e
					mu.Unlock()
					cancel(e)
					return
				}
			}
		}
	}()
	return wctx, func() *idleError {
		close(done)
		<-exited
		cancel(nil)
		mu.Lock()
		defer mu.Unlock()
		return fired
	}
}

// idleError is the end of a loop whose peer went quiet: what may have
// happened, and what the device's counters show.
type idleError struct {
	idle  time.Duration
	kind  ppKind
	iters int
	ctr   transport.Counters
}

func (e *idleError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nothing arrived from the peer for %v (--idle-timeout)\n  (the peer has stopped: it ran fewer iterations — both sides need the same -n %d —, "+
		"exited or was killed, or runs another ping-pong or another -s or -m", e.idle, e.iters)
	if e.kind == ppUC || e.kind == ppUD {
		fmt.Fprintf(&b, "; or a message was lost: %s does not retransmit", map[ppKind]string{ppUC: "UC", ppUD: "UD"}[e.kind])
	}
	var seen []string
	add := func(n uint64, format string) {
		if n > 0 {
			seen = append(seen, fmt.Sprintf(format, n))
		}
	}
	c := e.ctr
	add(c.TransportMismatch, "%d packets of another transport (transport_mismatch: the peer runs another of pingpong, uc-, ud-, srq-pingpong)")
	add(c.UDMsgsDropped, "%d datagrams longer than this side's receive buffer (ud_msgs_dropped: the peer's -s is larger)")
	add(c.UDMTUExceeded, "%d datagrams longer than this side's port MTU (ud_mtu_exceeded: the peer's -s or -m is larger)")
	add(c.UCMsgsDropped, "%d UC messages dropped (uc_msgs_dropped: longer than this side's -s, or a packet lost)")
	add(c.SendErr, "%d sends refused by this host (send_err: packets larger than the interface's MTU? a smaller -m fits)")
	add(c.WrongPeer, "%d packets from another address (wrong_peer)")
	add(c.UnknownQP, "%d packets for a QP this side does not have (unknown_qp)")
	if len(seen) > 0 {
		fmt.Fprintf(&b, "; this side's device counted %s", strings.Join(seen, ", "))
	}
	b.WriteString(")")
	return b.String()
}

// wcHint says what a failed completion of a ping-pong usually means, for
// the line after the tool's "failed status ..." (empty when there is
// nothing to add): the tools send -s bytes with path MTU -m, and a peer
// with another -s or -m fails the messages; a peer that has gone stops
// acknowledging.
func wcHint(c *pingpongConfig, wc transport.WC, dev *transport.Device) string {
	switch wc.Status {
	case transport.WCLocLenErr:
		if wc.WRID == ppRecvWRID {
			return fmt.Sprintf("a message from the peer was longer than this side's -s %d: both sides need the same -s", c.size)
		}
	case transport.WCRemInvReqErr:
		return fmt.Sprintf("the peer refused the message: its receive buffer is smaller than this side's -s %d, or it uses another path MTU than -m %d; both sides need the same -s and -m",
			c.size, c.mtu.Bytes())
	case transport.WCRetryExcErr:
		if n := dev.Counters().SendErr; n > 0 {
			h := fmt.Sprintf("this host refused %d of this side's sends (send_err)", n)
			if name, linkMTU, ok := cli.LinkOf(dev.Addr()); ok {
				if m, ok := cli.ActiveMTU(linkMTU); ok && m < c.mtu {
					return h + fmt.Sprintf(": %s has MTU %d, too small for packets of -m %d; -m %d fits (both sides need the same -m)", name, linkMTU, c.mtu.Bytes(), m.Bytes())
				}
			}
			return h + ": packets larger than the interface's MTU? a smaller -m fits (both sides need the same -m)"
		}
		return "the peer stopped acknowledging: it exited or was killed, or the path to it drops the packets"
	case transport.WCRNRRetryExcErr:
		return "the peer had no receive posted (RNR) for too long"
	}
	return ""
}

// wcError is the tool's "failed status" message for wc, naming its QP
// when onQP (srq-pingpong's), followed by wcHint's words.
func wcError(c *pingpongConfig, wc transport.WC, dev *transport.Device, onQP bool) error {
	msg := fmt.Sprintf("failed status %s (%d) for wr_id %d", wc.Status, uint8(wc.Status), wc.WRID)
	if onQP {
		msg += fmt.Sprintf(" on QP 0x%06x", wc.QPN)
	}
	if h := wcHint(c, wc, dev); h != "" {
		msg += "\n  (" + h + ")"
	}
	return fmt.Errorf("%s", msg)
}
