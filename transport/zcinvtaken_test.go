package transport

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestZeroCopyReadTakenThenLocalInv: the responder's LOCAL_INV of a
// window, posted while the zero-copy READ responses its QP built from
// that window are between the QP and the link — taken out by the end of
// the received batch (flushPending, coalesce.go) and not sent yet — must
// not make them be dropped (zero_copy_dropped). flushZeroCopy sends what
// the QP still has queued, but those were no longer in it: the LOCAL_INV
// invalidated the window and the send then left them out, the case of
// TestZeroCopyReadThenLocalInv through the other door (a completion the
// application saw in the batch is delivered before the batch's responses
// are sent, so a LOCAL_INV posted on it comes right there). The test
// posts the LOCAL_INV from the batch owner's hook between the take and
// the send (testHookRespTaken) and waits for PostSend to return there.
func TestZeroCopyReadTakenThenLocalInv(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{mtu: MTU4096, timeout: 8, retry: 3}
	o.defaults()
	a := newSide(t, n, addrA, &o)
	bl := newGatedZCLink(t, n, addrB, nil)
	b := newSideOn(t, bl, &o)
	if !b.dev.zc {
		t.Skip("the responder's link is not zero-copy")
	}
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	const size = 8 << 10 // two responses, one quantum: all in the batch
	dst, dmr := a.buffer(t, size, 0)
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead|memreg.AccessMWBind)
	fill(src, 7)
	mw, err := b.pd.AllocMW(memreg.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	key := mw.RKey()&^0xff | 0x5a
	if err := b.qp.PostSend(SendWR{WRID: 1, Opcode: WRBindMW, Flags: SendSignaled, MW: mw, RKey: key,
		Bind: MWBindInfo{MR: smr, Addr: smr.IOVA(), Length: size, Access: memreg.AccessRemoteRead}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("bind: %v", wc.Status)
	}

	var hit atomic.Bool
	postErr := make(chan error, 1)
	hook := func(d *Device) {
		if d != b.dev || hit.Load() {
			return
		}
		read := false
		for _, up := range d.rxResp.pkts {
			if bth.Opcode(up.Buf[0]).Info().Kind == bth.KindReadResponse && up.Hold != nil {
				read = true
			}
		}
		if !read {
			return
		}
		hit.Store(true)
		// The READ's responses are out of b.qp and not sent. PostSend
		// must not wait for them (this goroutine sends them): it returns
		// either way.
		done := make(chan struct{})
		go func() {
			defer close(done)
			postErr <- b.qp.PostSend(SendWR{WRID: 5, Opcode: WRLocalInv, Flags: SendSignaled, InvRKey: mw.RKey()})
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("PostSend of the LOCAL_INV did not return while a batch's responses were taken")
		}
	}
	testHookRespTaken.Store(&hook)
	defer testHookRespTaken.Store(nil)

	before := b.dev.Counters()
	if err := a.qp.PostSend(SendWR{WRID: 3, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size), RemoteAddr: smr.IOVA(), RKey: mw.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.scq, 1, 10*time.Second)[0]
	testHookRespTaken.Store(nil)
	if !hit.Load() {
		t.Fatal("the hook never saw the READ's zero-copy responses taken")
	}
	if err := <-postErr; err != nil {
		t.Fatal(err)
	}
	dropped := b.dev.Counters().ZeroCopyDropped - before.ZeroCopyDropped
	if wc.Status != WCSuccess || dropped != 0 {
		t.Fatalf("READ %v, responder zero_copy_dropped +%d (want success, 0)", wc.Status, dropped)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("the READ returned other bytes")
	}
	if wc := waitWC(t, b.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != 5 {
		t.Fatalf("LOCAL_INV: %+v", wc)
	}
	if mw.Bound() {
		t.Error("the window is still bound")
	}
}
