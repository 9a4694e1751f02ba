package rdmacm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestEndedTwiceInAcceptQueue (review25): a connection established and waiting in
// Accept's queue ends (keep-alive: lostLocked, DREQ sent); the peer's DREP
// (timeWaitLocked) is handled before the goroutine endedUnacceptedLocked
// started to destroy its QP has given its place back. The second call
// finds it still owed and replied and releases it whole (releaseFailed):
// its CQs are destroyed while it waits for Accept, which then hands out a
// connection whose CQs are gone. It must keep them for Accept.
func TestEndedTwiceInAcceptQueue(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	db := newDev(t, n, addrB, nil)
	l, err := Listen(db, 7399, &ListenOptions{Options: fast, Backlog: 8, HalfOpenTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Accept(ctx) // starts the workers
	p := newForgedPeer(t, db, netip.AddrFrom4([4]byte{198, 51, 100, 9}), 7399)
	p.req(t, 1)
	var c *Conn
	for deadline := time.Now().Add(5 * time.Second); c == nil && time.Now().Before(deadline); {
		p.answerREPs(t)
		p.mb.mu.Lock()
		for k, x := range p.mb.remote {
			if k.addr == p.src && x.state == stEstablished {
				c = x
			}
		}
		p.mb.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
	if c == nil {
		t.Fatal("not established")
	}
	before := db.Resources()
	m := p.mb
	m.mu.Lock()
	if !c.life.ready || !c.life.owed {
		m.mu.Unlock()
		t.Fatalf("not in the accept queue: %+v", c.life)
	}
	c.lostLocked(ErrKeepAlive)  // keep-alive gave up: DREQ sent, QP to go
	c.timeWaitLocked(ErrClosed) // the peer's DREP, before that goroutine ran
	m.mu.Unlock()
	// The release under way ends by giving the place back (after the
	// QP's destruction).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		owed := c.life.owed
		m.mu.Unlock()
		if !owed && db.Resources().QPs < before.QPs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ended connection's release did not end: place held %v, %+v", owed, db.Resources())
		}
	}
	after := db.Resources()
	t.Logf("before %+v after %+v", before, after)
	if after.QPs != before.QPs-1 {
		t.Errorf("QPs %d -> %d, want one destroyed", before.QPs, after.QPs)
	}
	if after.CQs != before.CQs {
		t.Errorf("CQs %d -> %d while the ended connection waits for Accept (its completions are to be kept)", before.CQs, after.CQs)
	}
	got, err := l.Accept(ctxT(t, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got != c {
		t.Fatal("another connection")
	}
	got.Close()
}
