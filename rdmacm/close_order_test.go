package rdmacm

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestCloseAfterReceive: the receiver of a SEND closes the connection as
// soon as its completion arrives (the end of perftest -R's exchange). The
// sender's SEND must still complete successfully: the DREQ must not
// overtake the ACK of the message the receiver has just seen (the device
// wakes completion waiters before it sends what the batch queued), since
// the sender moves its QP to ERR on the DREQ and would flush the SEND.
func TestCloseAfterReceive(t *testing.T) {
	for i := 0; i < 30; i++ {
		n := memnet.NewMemNetwork(memnet.Faults{})
		da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
		rbuf := make([]byte, 64)
		var rmr *memreg.MR
		lo := ListenOptions{Options: fast}
		l, err := Listen(db, 7000, &lo)
		if err != nil {
			t.Fatal(err)
		}
		acc := make(chan *Conn, 1)
		go func() {
			c, err := l.Accept(ctxT(t, 5*time.Second))
			if err != nil {
				t.Error(err)
			}
			acc <- c
		}()
		o := fast
		o.Prepare = prepareRecv(&rmr, rbuf)
		ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7000), &o)
		if err != nil {
			t.Fatal(err)
		}
		cb := <-acc
		if cb == nil {
			t.FailNow()
		}
		l.Close()
		sbuf := make([]byte, 64)
		smr, _ := cb.PD().RegisterMR(sbuf, memreg.AccessLocalWrite)
		if err := cb.QP().PostSend(transport.SendWR{WRID: 2, Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{smr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		var wc [1]transport.WC
		if _, err := ca.RecvCQ().Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Err() != nil {
			t.Fatalf("receive: %v %v", err, wc[0].Err())
		}
		closed := make(chan struct{})
		go func() { ca.Close(); close(closed) }()
		if _, err := cb.SendCQ().Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Err() != nil {
			t.Fatalf("run %d: the sender's SEND, received by the peer before it disconnected: %v %v (sender's connection: %v; sender %+v; receiver %+v)",
				i, err, wc[0].Err(), cb.Err(), StatsOf(db), StatsOf(da))
		}
		<-closed
		cb.Close()
		smr.Deregister()
		rmr.Deregister()
	}
}

// TestConcurrentClose: Close called from several goroutines at once (and
// again after) releases the connection once, without a panic or a race; a
// second Close reports the closed connection like the first.
func TestConcurrentClose(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	lo := ListenOptions{Options: fast}
	l, err := Listen(db, 7001, &lo)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for round := range 20 {
		acc := make(chan *Conn, 1)
		go func() {
			c, err := l.Accept(ctxT(t, 5*time.Second))
			if err != nil {
				t.Error(err)
			}
			acc <- c
		}()
		o := fast
		ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7001), &o)
		if err != nil {
			t.Fatal(err)
		}
		cb := <-acc
		if cb == nil {
			t.FailNow()
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for k := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[k] = ca.Close() }()
		}
		wg.Wait()
		for k, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Close %d: %v", round, k, err)
			}
		}
		if err := cb.Close(); err != nil {
			t.Fatalf("round %d: the peer's Close: %v", round, err)
		}
		if r := da.Resources(); r.QPs != 0 || r.CQs != 0 {
			t.Fatalf("round %d: %+v left on the dialing device", round, r)
		}
	}
}
