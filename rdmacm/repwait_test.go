package rdmacm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
)

// TestREPWaitsRequesterResponseTime: the REP goes again only after the
// time the REQ says its requester takes to answer (its local CM response
// timeout: 20, 4.3 s, from Linux's rdma_cm), as Linux's cm_req_handler
// times it — capped at MRAWaitFactor response timeouts for a REQ that
// asks for hours (31). Before, the REP went again every ResponseTimeout
// (1 s): cmtime -c 3000 from the VM had rocev2d's server resend 1723
// REPs to a peer that had said it needs 4.3 s.
func TestREPWaitsRequesterResponseTime(t *testing.T) {
	const rt = time.Second
	for _, tc := range []struct {
		local uint8
		want  time.Duration // when the second REP goes
	}{{20, cm.Timeout(20)}, {31, MRAWaitFactor * rt}, {10, rt}} {
		clk := transport.NewManualClock(time.Unix(1_000_000, 0))
		out := make(chan sentMAD, 64)
		db := peerlessDev(t, clk, out)
		mb, err := managerFor(db)
		if err != nil {
			t.Fatal(err)
		}
		l, err := Listen(db, 7730, &ListenOptions{Options: Options{ResponseTimeout: rt, MaxRetries: 15}, HalfOpenTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		peer := netip.MustParseAddr("198.51.100.30")
		req := forgedREQ(7730, peer, addrA, 0x7730, 0x630)
		req.LocalCMResponseTimeout, req.RemoteCMResponseTimeout = tc.local, 20
		injectFrom(t, mb, peer, req)
		r, err := l.Next(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go r.Accept(ctx, nil) // waits for an RTU that never comes
		var reps []time.Duration
		wait := func() {
			select {
			case s := <-out:
				if _, ok := s.msg.(*cm.REPFields); ok {
					reps = append(reps, s.at)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no REP")
			}
		}
		wait()
		mb.mu.Lock() // the REP's timer is armed under the lock
		mb.mu.Unlock()
		step := rt / 8
		for i := 0; len(reps) < 2 && i < 200; i++ { // 25 s of clock at most
			clk.Advance(step)
			for len(out) > 0 {
				wait()
			}
		}
		cancel()
		l.Close()
		if len(reps) < 2 {
			t.Fatalf("local CM response timeout %d: no second REP", tc.local)
		}
		if d := reps[1] - reps[0]; d < tc.want || d > tc.want+step {
			t.Errorf("local CM response timeout %d: the REP went again after %v, want %v", tc.local, d, tc.want)
		}
	}
}

// TestREPRetriesFromREQ: the passive side sends its REP as often as the
// REQ's Max CM Retries says (here 2: three REPs, then a REJ "timeout"),
// not the listener's MaxRetries (15), as Linux's cm_req_handler takes
// max_cm_retries from the REQ and cm_alloc_msg uses it for the REP.
// Before, the REP went 16 times to a requester that had said it would
// take 3.
func TestREPRetriesFromREQ(t *testing.T) {
	const rt = time.Second
	clk := transport.NewManualClock(time.Unix(1_000_000, 0))
	out := make(chan sentMAD, 64)
	db := peerlessDev(t, clk, out)
	mb, err := managerFor(db)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(db, 7731, &ListenOptions{Options: Options{ResponseTimeout: rt, MaxRetries: 15}, HalfOpenTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	peer := netip.MustParseAddr("198.51.100.31")
	req := forgedREQ(7731, peer, addrA, 0x7731, 0x631)
	req.LocalCMResponseTimeout, req.MaxCMRetries = 10, 2
	injectFrom(t, mb, peer, req)
	r, err := l.Next(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Accept(ctx, nil) // waits for an RTU that never comes
	reps, rej := 0, false
	handle := func(s sentMAD) {
		switch f := s.msg.(type) {
		case *cm.REPFields:
			reps++
		case *cm.REJFields:
			if f.Reason == cm.RejTimeout && f.MessageRejected == cm.KindREP {
				rej = true
			}
		}
	}
	select {
	case s := <-out:
		handle(s)
	case <-time.After(10 * time.Second):
		t.Fatal("no REP")
	}
	mb.mu.Lock() // the REP's timer is armed under the lock
	mb.mu.Unlock()
	for i := 0; !rej && i < 200; i++ { // 50 s of clock at most
		clk.Advance(rt / 4)
		for len(out) > 0 {
			handle(<-out)
		}
	}
	if !rej || reps != 3 {
		t.Errorf("%d REPs sent, gave up: %v; want 3 REPs (Max CM Retries 2), then a REJ", reps, rej)
	}
}
