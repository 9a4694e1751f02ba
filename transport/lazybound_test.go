package transport

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestLazyTimerLostRequestBound: on the wall clock's lazily pushed ACK
// timer (lazyPush), a request lost right after the timer was armed or
// checked is resent within a timeout plus retransSlack (a quarter of it)
// of its post, at every phase of the timer's period. Before, the expiry
// that found the push waited a whole timeout from its own reading, so a
// request posted just after the timer was armed was resent nearly two
// timeouts after its post (1.99 timeouts at the first phase).
func TestLazyTimerLostRequestBound(t *testing.T) {
	clk := manual()
	clk.lazyPush = true
	a, b, n := newPair(t, pairOpts{retry: 7, timeout: 14, clock: clk})
	to := AckTimeout(14)
	slack := to / retransSlackDiv
	_, lmr := a.buffer(t, 64, 0)
	_, rmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	// The tap records when each WRITE PSN from A leaves (the clock's
	// reading at its Link.Send), first and last time.
	var mu sync.Mutex
	sent := map[bth.PSN][]time.Time{}
	n.SetTap(func(src, _ netip.Addr, _ uint16, _ uint8, p []byte) {
		if src != addrA {
			return
		}
		h := bth.BTH(p)
		if op := h.Opcode(); op != bth.RCWriteOnly {
			return
		}
		mu.Lock()
		sent[h.PSN()] = append(sent[h.PSN()], clk.Now())
		mu.Unlock()
	})
	id := uint64(0)
	for _, phase := range []time.Duration{to / 100, to / 3, to * 6 / 10, to * 99 / 100} {
		// A fresh timer: the QP idle for three timeouts (its timer
		// cancelled on idle: coldIdle), one WRITE (armed, cancelled at
		// its ACK), and another within half a timeout: busy again soon,
		// it arms the timer at t0 with a clock reading and its ACK
		// leaves it armed (warm) until t0 + to.
		clk.Advance(3 * to)
		for range 2 {
			id++
			timerWrite(t, a, lmr, rmr, id, true)
		}
		a.qp.mu.Lock()
		warm := a.qp.tmr.timerArmed && !a.qp.tmr.coldIdle
		a.qp.mu.Unlock()
		if !warm {
			t.Fatalf("phase %v: the ACK timer is not armed and warm after two WRITEs", phase)
		}
		clk.Advance(phase)
		// The lost WRITE, posted phase after t0: a lazy push.
		n.SetFaults(memnet.Faults{Loss: 1})
		psn := a.qp.req.nextPSN()
		id++
		timerWrite(t, a, lmr, rmr, id, false)
		n.SetFaults(memnet.Faults{})
		step := to / 128
		var waited time.Duration
		for {
			mu.Lock()
			k := len(sent[psn])
			mu.Unlock()
			if k >= 2 {
				break
			}
			if waited > 3*to {
				t.Fatalf("phase %v: lost WRITE not resent %v after its post (timeout %v)", phase, waited, to)
			}
			clk.Advance(step)
			waited += step
		}
		mu.Lock()
		ts := sent[psn]
		mu.Unlock()
		got := ts[1].Sub(ts[0])
		if got < to || got > to+slack {
			t.Fatalf("phase %v: lost WRITE resent %v after its post, want between %v and %v (timeout + a quarter)",
				phase, got, to, to+slack)
		}
		t.Logf("phase %.2f timeouts: resent after %.3f timeouts", float64(phase)/float64(to), float64(got)/float64(to))
		if w := waitWC(t, a.scq, 1, 10*time.Second); w[0].Status != WCSuccess || w[0].WRID != id {
			t.Fatalf("resent WRITE: %+v", w[0])
		}
	}
}
