package transport

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestReadResponseNotOvertakenByHandlePacket: a request handed to
// Device.HandlePacket (a capture replay, a tool) while a received batch's
// responses for the same QP are on their way to the link — taken out of
// the QP by flushPending (coalesce.go), not sent yet — is answered after
// them. HandlePacket sent its answer right away, under the QP's lock
// only: the ACK of a WRITE at PSN p+8 left before the READ responses of
// PSNs p..p+7, and a requester takes an ACK beyond an outstanding READ
// for that READ's responses lost (it resends the READ). The test holds
// b's batch owner between the take and the send (testHookRespTaken) and
// replays the WRITE there from another goroutine: b's packets to a must
// leave in PSN order.
func TestReadResponseNotOvertakenByHandlePacket(t *testing.T) {
	o := pairOpts{}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newSide(t, n, addrA, &o)
	lb, err := n.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	tap := &readRespLink{Wrap: udp.Wrap{Link: lb}}
	b := newSideOn(t, tap, &o)
	const psn = 0x100
	connect(t, a, b, addrB, psn, 0x20, &o)
	connect(t, b, a, addrA, 0x20, psn, &o)
	tap.dqpn.Store(a.qp.QPN())

	const size = 8 << 10 // 8 responses, one quantum: all in the batch
	_, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	_, dmr := a.buffer(t, size, 0)
	// The WRITE's target is a region of its own: one the READ's
	// responses are sent from (zero-copy) is not written while they are
	// on their way.
	wdst, wmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	// The WRITE that follows the READ (PSN psn+8), with AckReq.
	var f packet.Fields
	f.BTH = bth.Fields{Opcode: bth.RCWriteOnly, PKey: bth.DefaultPKey, DestQP: b.qp.QPN(), PSN: psn + 8, AckReq: true}
	f.RETH = packetRETH(wmr.IOVA(), wmr.RKey(), 16)
	f.Payload = bytes.Repeat([]byte{0xab}, 16)
	wbuf := make([]byte, 256)
	k, err := packet.Build(wbuf, &f)
	if err != nil {
		t.Fatal(err)
	}
	wbuf = wbuf[:k]

	var hit, early atomic.Bool
	replayed := make(chan struct{})
	var replayErr error
	hook := func(d *Device) {
		if d != b.dev || hit.Load() {
			return
		}
		read := false
		for _, up := range d.rxResp.pkts {
			if bth.Opcode(up.Buf[0]).Info().Kind == bth.KindReadResponse {
				read = true
			}
		}
		if !read {
			return
		}
		hit.Store(true)
		// The READ's responses are taken out of b.qp and not sent yet.
		go func() {
			replayErr = b.dev.HandlePacket(wbuf, addrA)
			close(replayed)
		}()
		select {
		case <-replayed:
			early.Store(true)
		case <-time.After(50 * time.Millisecond):
		}
	}
	testHookRespTaken.Store(&hook)
	defer testHookRespTaken.Store(nil)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 10*time.Second); wc[0].Status != WCSuccess {
		t.Fatalf("READ: %+v", wc[0])
	}
	if !hit.Load() {
		t.Fatal("the hook never saw the READ's responses taken")
	}
	select {
	case <-replayed:
		if replayErr != nil {
			t.Fatal(replayErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the replayed WRITE was not handled")
	}
	t.Logf("HandlePacket returned while the responses were taken and not sent: %v", early.Load())
	tap.check(t)
	if !bytes.Equal(wdst[:16], f.Payload) {
		t.Error("the replayed WRITE was not executed")
	}
}
