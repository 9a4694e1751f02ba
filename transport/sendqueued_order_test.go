package transport

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestSendQueuedWaitsForTakenResponses: QP.SendQueued returns only once
// the responses a received batch took out of the QP (to send them with
// other QPs', coalesce.go) are on the link. Between the take and the send
// they were in neither, and SendQueued found nothing to send: a connection
// manager's DREQ, sent right after it, overtook the ACK of the message the
// application had just seen complete, and the peer flushed that message's
// send as failed (rdmacm TestCloseAfterReceive, about 1 run in 3 under
// -race on a loaded machine). The test holds the batch owner between the
// take and the send and calls SendQueued there.
func TestSendQueuedWaitsForTakenResponses(t *testing.T) {
	holdTakenResponses(t, "SendQueued", func(b *side) { b.qp.SendQueued() })
}

// TestCloseSendsTakenResponses: Device.Close closes the link only once
// the responses a received batch took out of its QPs are on it. Between
// the take and the send they are in neither the QPs (which Close flushes)
// nor the link: closing the link there lost the ACKs of messages the
// application had already seen complete, and the peer, whose sends then
// never completed, retried into a closed port until its retry counter ran
// out (pingpong TestLoopback srq-pingpong -q 255 under -race in a CI-like
// run: 28 ACKs lost at the client's exit). The test holds the batch owner
// between the take and the send and calls Close there.
func TestCloseSendsTakenResponses(t *testing.T) {
	holdTakenResponses(t, "Close", func(b *side) { b.dev.Close() })
}

// holdTakenResponses sends a SEND from a to b and holds b's batch owner
// between taking the ACK out of b's QP and sending it (testHookRespTaken);
// there it runs call (named what) in another goroutine, which must not
// return within 50 ms, and then lets the send go. The ACK must reach a:
// its SEND completes successfully.
func holdTakenResponses(t *testing.T, what string, call func(b *side)) {
	a, b, _ := newPair(t, pairOpts{retry: 7})
	_, amr := a.buffer(t, 64, 0)
	_, bmr := b.buffer(t, 64, 0)
	if err := b.qp.PostRecv(RecvWR{SGEs: sge(bmr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	var hit atomic.Bool
	done := make(chan struct{})
	early := make(chan string, 1)
	hook := func(d *Device) {
		if d != b.dev || hit.Swap(true) {
			return
		}
		// The ACK is taken out of b.qp and not sent yet.
		go func() { call(b); close(done) }()
		select {
		case <-done:
			early <- what + " returned while the batch's ACK was taken out of the QP but not sent"
		case <-time.After(50 * time.Millisecond):
			early <- ""
		}
	}
	testHookRespTaken.Store(&hook)
	defer testHookRespTaken.Store(nil)
	if err := a.qp.PostSend(SendWR{Opcode: WRSend, Flags: SendSignaled, SGEs: sge(amr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-early:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the receiving device never sent a batch's responses")
	}
	<-done
	// The ACK reached the sender: its SEND completes successfully.
	if w := waitWC(t, a.scq, 1, 10*time.Second); w[0].Status != WCSuccess {
		t.Fatalf("SEND: %v", w[0].Status)
	}
}
