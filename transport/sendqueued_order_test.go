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
	a, b, _ := newPair(t, pairOpts{retry: 7})
	_, amr := a.buffer(t, 64, 0)
	_, bmr := b.buffer(t, 64, 0)
	if err := b.qp.PostRecv(RecvWR{SGEs: sge(bmr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	var hit atomic.Bool
	early := make(chan string, 1)
	hook := func(d *Device) {
		if d != b.dev || hit.Swap(true) {
			return
		}
		// The ACK is taken out of b.qp and not sent yet.
		done := make(chan struct{})
		go func() { b.qp.SendQueued(); close(done) }()
		select {
		case <-done:
			early <- "SendQueued returned while the batch's ACK was taken out of the QP but not sent"
		case <-time.After(50 * time.Millisecond):
			early <- ""
		}
	}
	testHookRespTaken.Store(&hook)
	defer testHookRespTaken.Store(nil)
	if err := a.qp.PostSend(SendWR{Opcode: WRSend, Flags: SendSignaled, SGEs: sge(amr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, b.rcq, 1, 10*time.Second)
	select {
	case msg := <-early:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the receiving device never sent a batch's responses")
	}
	// The ACK reached the sender: its SEND completes successfully.
	if w := waitWC(t, a.scq, 1, 10*time.Second); w[0].Status != WCSuccess {
		t.Fatalf("SEND: %v", w[0].Status)
	}
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
	a, b, _ := newPair(t, pairOpts{retry: 7})
	_, amr := a.buffer(t, 64, 0)
	_, bmr := b.buffer(t, 64, 0)
	if err := b.qp.PostRecv(RecvWR{SGEs: sge(bmr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	var hit atomic.Bool
	closed := make(chan struct{})
	early := make(chan string, 1)
	hook := func(d *Device) {
		if d != b.dev || hit.Swap(true) {
			return
		}
		// The ACK is taken out of b.qp and not sent yet.
		go func() { b.dev.Close(); close(closed) }()
		select {
		case <-closed:
			early <- "Close returned while the batch's ACK was taken out of the QP but not sent"
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
	<-closed
	// The ACK reached the sender before b's link closed: a's SEND
	// completes successfully.
	if w := waitWC(t, a.scq, 1, 10*time.Second); w[0].Status != WCSuccess {
		t.Fatalf("SEND: %v", w[0].Status)
	}
}
