package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// lateCtx is a context whose Done waits until ready is closed and then
// reports it ended (Canceled): Dial looks at it only once the connection
// is established, so both of its select cases are ready at once.
type lateCtx struct {
	context.Context
	ready <-chan struct{}
	done  chan struct{}
}

func (c *lateCtx) Done() <-chan struct{} {
	<-c.ready
	return c.done
}

func (c *lateCtx) Err() error {
	select {
	case <-c.ready:
		return context.Canceled
	default:
		return nil
	}
}

// TestDialCtxEndsAsEstablished: a Dial whose context ends just as the
// connection is established either returns the connection or fails with
// the context's error, as its doc says — it returned ErrClosed ("rdmacm:
// closed") when the abort closed the connection just established
// (probe lib26/rpc, mode 3, about one cancelled Dial in 200).
func TestDialCtxEndsAsEstablished(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, err := Listen(db, 7174, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := ctxT(t, 20*time.Second)
	aborted := 0
	for i := 0; i < 24; i++ {
		accepted := make(chan struct{})
		go func() {
			if c, err := l.Accept(ctx); err == nil {
				close(accepted)
				<-c.Done()
				c.Close()
			}
		}()
		done := make(chan struct{})
		close(done)
		lc := &lateCtx{Context: context.Background(), ready: accepted, done: done}
		c, err := Dial(lc, da, netip.AddrPortFrom(addrB, 7174), &fast)
		if err == nil {
			c.Close()
			continue
		}
		aborted++
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Dial %d: %v, want a connection or context.Canceled", i, err)
		}
	}
	t.Logf("%d of 24 Dials aborted", aborted)
}
