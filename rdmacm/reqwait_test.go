package rdmacm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
)

// TestREQWaitsWhatItAdvertises: a Dial sends its REQ again no sooner than
// the remote CM response timeout the REQ advertises (exponent 18: 1.07 s
// for the default ResponseTimeout of 1 s), as Linux's ib_send_cm_req
// times a REQ from the remote CM response timeout it sends (plus twice
// the path's packet life time). Before, the REQ went again after 1 s,
// before the time it had given the peer to answer.
func TestREQWaitsWhatItAdvertises(t *testing.T) {
	for _, rt := range []time.Duration{time.Second, 100 * time.Millisecond} {
		clk := transport.NewManualClock(time.Unix(1_000_000, 0))
		out := make(chan sentMAD, 64)
		da := peerlessDev(t, clk, out)
		ma, err := managerFor(da)
		if err != nil {
			t.Fatal(err)
		}
		o := Options{ResponseTimeout: rt, MaxRetries: 2}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			ma.Dial(ctx, netip.AddrPortFrom(addrB, 7740), &o)
			close(done)
		}()
		var reqs []sentMAD
		select {
		case s := <-out:
			reqs = append(reqs, s)
		case <-time.After(10 * time.Second):
			t.Fatal("no REQ")
		}
		ma.mu.Lock() // Dial sends its REQ and arms its timer under the lock
		ma.mu.Unlock()
		step := rt / 64
		for i := 0; len(reqs) < 2 && i < 1000; i++ {
			clk.Advance(step)
			for len(out) > 0 {
				reqs = append(reqs, <-out)
			}
		}
		cancel()
		<-done
		if len(reqs) < 2 {
			t.Fatalf("ResponseTimeout %v: no second REQ", rt)
		}
		f, ok := reqs[0].msg.(*cm.REQFields)
		if !ok {
			t.Fatalf("first MAD %T, want a REQ", reqs[0].msg)
		}
		adv := cm.Timeout(f.RemoteCMResponseTimeout)
		if adv < rt {
			t.Errorf("ResponseTimeout %v: the REQ advertises %v (exponent %d), less", rt, adv, f.RemoteCMResponseTimeout)
		}
		if d := reqs[1].at - reqs[0].at; d < adv || d > adv+step {
			t.Errorf("ResponseTimeout %v: the REQ went again after %v; it advertises %v (exponent %d)", rt, d, adv, f.RemoteCMResponseTimeout)
		}
	}
}
