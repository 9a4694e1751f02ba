package transport

import (
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestPollEmptyTakesNoLock: CQ.Poll of an empty CQ returns at once
// without the CQ's mutex (a polling loop's usual call, every round of a
// ping-pong on its send CQ), and polls a stored completion as before.
func TestPollEmptyTakesNoLock(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{retry: 7})
	cq := a.scq
	wcs := make([]WC, 4)
	cq.mu.Lock()
	got := make(chan int, 1)
	go func() { got <- cq.Poll(wcs) }()
	select {
	case n := <-got:
		if n != 0 {
			t.Fatalf("Poll of an empty CQ = %d", n)
		}
	case <-time.After(5 * time.Second):
		cq.mu.Unlock()
		t.Fatal("Poll of an empty CQ waited for the CQ's mutex")
	}
	cq.mu.Unlock()
	if !cq.push(&WC{WRID: 7}, false) {
		t.Fatal("push failed")
	}
	if n := cq.Poll(wcs); n != 1 || wcs[0].WRID != 7 {
		t.Fatalf("Poll = %d %+v, want the stored completion", n, wcs[0])
	}
	if n := cq.Poll(wcs); n != 0 {
		t.Fatalf("Poll after draining = %d", n)
	}
}

// TestSignalOnlyToSleepers: storing a completion while nobody waits sends
// nothing on the CQ's notify channel (a channel operation per completion
// for nobody), and a waiter that comes later — or that sleeps already —
// still gets every completion. Many rounds with the store and the wait
// racing.
func TestSignalOnlyToSleepers(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{retry: 7})
	cq := a.scq
	cq.push(&WC{WRID: 1}, false)
	if len(cq.notify) != 0 {
		t.Fatal("a completion with nobody waiting left a wake-up on notify")
	}
	wcs := make([]WC, 1)
	if n := cq.Poll(wcs); n != 1 {
		t.Fatalf("Poll = %d", n)
	}
	const rounds = 2000
	done := make(chan error, 1)
	go func() {
		for i := 0; i < rounds; i++ {
			w := waitWC(t, cq, 1, 10*time.Second)
			if w[0].WRID != uint64(i) {
				done <- errorf(ErrInvalidArgument, "round %d got wrid %d", i, w[0].WRID)
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < rounds; i++ {
		for cq.full.Load() { // one at a time: the waiter takes each
			time.Sleep(time.Microsecond)
		}
		if i%3 == 0 {
			time.Sleep(time.Duration(i%7) * time.Microsecond)
		}
		cq.push(&WC{WRID: uint64(i)}, false)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestHotQPTimerStaysArmed: a QP whose messages follow each other within
// a timeout keeps its ACK timer queued while idle (no timer queue
// operation per message); the timer's expiry on an idle QP does nothing
// but make the QP cancel on idle from then on (the device's queue empties
// with the QP idle), and a QP busy again soon goes back to keeping it.
// A lost request is still resent a timeout after it was sent, whichever
// way the timer was kept.
func TestHotQPTimerStaysArmed(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	a, b, n := newPair(t, pairOpts{retry: 7, timeout: 14, clock: clk})
	to := AckTimeout(14)
	_, lmr := a.buffer(t, 64, 0)
	_, rmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	write := func(id uint64) { t.Helper(); timerWrite(t, a, lmr, rmr, id, true) }
	pending := func() int { return a.dev.tq.pending() }
	for i := range 20 {
		write(uint64(i))
		if p := pending(); p != 1 {
			t.Fatalf("message %d: %d timers queued with the QP idle, want 1 (kept armed)", i, p)
		}
		clk.Advance(to / 10)
	}
	// Idle for longer than a timeout: the expiry finds nothing, counts
	// nothing, and the queue is empty.
	clk.Advance(2 * to)
	if p := pending(); p != 0 {
		t.Fatalf("%d timers queued after an idle timeout, want 0", p)
	}
	if c := a.dev.Counters(); c.LocalAckTimeout != 0 || c.CompleterRetryErr != 0 {
		t.Fatalf("expiry on an idle QP counted: timeouts %d retries %d", c.LocalAckTimeout, c.CompleterRetryErr)
	}
	// Cold now: the next message cancels its timer when acknowledged...
	write(100)
	if p := pending(); p != 0 {
		t.Fatalf("cold QP: %d timers queued while idle, want 0", p)
	}
	// ...and one soon after it makes the QP hot again.
	clk.Advance(to / 10)
	write(101)
	if p := pending(); p != 1 {
		t.Fatalf("hot again: %d timers queued while idle, want 1", p)
	}
	// A lost request on the hot QP (its timer queued since an earlier
	// message) is resent one timeout after it was posted, not earlier.
	clk.Advance(to / 2)
	n.SetFaults(memnet.Faults{Loss: 1})
	if err := a.qp.PostSend(SendWR{WRID: 200, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(lmr, 0, 64),
		RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(to * 9 / 10)
	if c := a.dev.Counters(); c.LocalAckTimeout != 0 {
		t.Fatalf("resent %v after the post, before its timeout %v", to*9/10, to)
	}
	n.SetFaults(memnet.Faults{})
	clk.Advance(to / 5)
	if c := a.dev.Counters(); c.LocalAckTimeout != 1 {
		t.Fatalf("%d timeouts a timeout after the lost request, want 1", c.LocalAckTimeout)
	}
	if w := waitWC(t, a.scq, 1, 10*time.Second); w[0].Status != WCSuccess || w[0].WRID != 200 {
		t.Fatalf("resent WRITE: %+v", w[0])
	}
}

// TestManualClockNeverBack: an Advance that ran a timer function while
// another Advance moved the clock further does not set it back to its
// own end (TestLateTimerSpendsNoRetry advances from two goroutines so).
func TestManualClockNeverBack(t *testing.T) {
	c := NewManualClock(time.Unix(0, 0))
	in, block, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	c.AfterFunc(time.Second, func() { close(in); <-block })
	go func() { c.Advance(time.Second); close(done) }()
	<-in
	c.Advance(10 * time.Second)
	close(block)
	<-done
	if got := c.Now(); !got.Equal(time.Unix(11, 0)) {
		t.Fatalf("clock at %v after Advance(1s) and, meanwhile, Advance(10s); want %v", got, time.Unix(11, 0))
	}
}

// TestLazyPushTimer: on the wall clock's ACK timer (lazyPush), a message
// on a QP whose timer is armed reads no clock: it marks the timer pushed,
// and the expiry that finds the mark waits a timeout from then. A lost
// request is then resent no earlier than a timeout after its post and no
// later than 1.25 (the timer checks every quarter timeout); messages that keep coming never let the timer resend;
// and an idle QP's timer still ends (cold) as with exact pushes.
func TestLazyPushTimer(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	clk.lazyPush = true
	a, b, n := newPair(t, pairOpts{retry: 7, timeout: 14, clock: clk})
	if !a.dev.lazyPush {
		t.Fatal("device on a lazyPush clock does not push lazily")
	}
	to := AckTimeout(14)
	_, lmr := a.buffer(t, 64, 0)
	_, rmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	post := func(id uint64) { t.Helper(); timerWrite(t, a, lmr, rmr, id, false) }
	write := func(id uint64) { t.Helper(); timerWrite(t, a, lmr, rmr, id, true) }
	// A busy QP for five timeouts: many expiries find the timer pushed,
	// none resends.
	for i := range 50 {
		write(uint64(i))
		clk.Advance(to / 10)
	}
	if c := a.dev.Counters(); c.LocalAckTimeout != 0 {
		t.Fatalf("a busy QP timed out %d times", c.LocalAckTimeout)
	}
	if p := a.dev.tq.pending(); p != 1 {
		t.Fatalf("%d timers queued on a busy QP, want 1", p)
	}
	// A lost request: resent within [to, to + to/retransSlackDiv] of its post.
	n.SetFaults(memnet.Faults{Loss: 1})
	post(200)
	step := to / 20
	var waited time.Duration
	for a.dev.Counters().LocalAckTimeout == 0 {
		if waited > 3*to {
			t.Fatalf("lost request not resent %v after its post (timeout %v)", waited, to)
		}
		clk.Advance(step)
		waited += step
	}
	if waited < to || waited > to+to/retransSlackDiv+step {
		t.Fatalf("lost request resent %v after its post, want between %v and %v", waited, to, to+to/retransSlackDiv)
	}
	n.SetFaults(memnet.Faults{})
	clk.Advance(to + step) // the resend was lost too (the faults were on): once more
	if w := waitWC(t, a.scq, 1, 10*time.Second); w[0].Status != WCSuccess || w[0].WRID != 200 {
		t.Fatalf("resent WRITE: %+v", w[0])
	}
	// Idle for three timeouts: the timer ends.
	a.qp.mu.Lock()
	a.qp.mu.Unlock()
	clk.Advance(3 * to)
	if p := a.dev.tq.pending(); p != 0 {
		t.Fatalf("%d timers queued after an idle QP's timeouts, want 0", p)
	}
}

// timerWrite posts a signaled 64-byte WRITE with id from lmr to rmr on a's
// QP; with wait it waits for its successful completion and for the end of
// the ACK's input that stored it (the QP's lock taken once).
func timerWrite(t *testing.T, a *side, lmr, rmr *memreg.MR, id uint64, wait bool) {
	t.Helper()
	if err := a.qp.PostSend(SendWR{WRID: id, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(lmr, 0, 64),
		RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if !wait {
		return
	}
	if w := waitWC(t, a.scq, 1, 10*time.Second); w[0].Status != WCSuccess {
		t.Fatalf("WRITE %d: %v", id, w[0].Status)
	}
	a.qp.mu.Lock()
	a.qp.mu.Unlock()
}
