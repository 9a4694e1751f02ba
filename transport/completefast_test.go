package transport

import (
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
)

// TestAckNothingToSendIsProgress: the completer skips requester.progress
// after a response only when the send queue has nothing left to send
// (then progress would only mark the pacer idle). With a window of 4 PSNs
// and a manual clock (no ACK timer ever fires), 64 unsignaled WRITEs and
// a signaled one complete only if every ACK that frees window room lets
// the requester send again: skipped then, the queue stalls for good.
func TestAckNothingToSendIsProgress(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{clock: manual(), window: 4, small: -1})
	_, smr := a.buffer(t, 64, 0)
	_, dmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	wr := SendWR{Opcode: WRWrite, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	for i := range 65 {
		w := wr
		w.WRID = uint64(i)
		if i == 64 {
			w.Flags = SendSignaled
		}
		if err := a.qp.PostSend(w); err != nil {
			t.Fatal(err)
		}
	}
	wc := waitWC(t, a.scq, 1, 10*time.Second)
	if wc[0].WRID != 64 || wc[0].Status != WCSuccess {
		t.Fatalf("completion %+v, want WRID 64 success", wc[0])
	}
	if c := a.dev.Counters(); c.CompleterRetryErr != 0 {
		t.Fatalf("%d go-back-N retries: the window stalled", c.CompleterRetryErr)
	}
}
