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

// TestZeroCopyRequesterDeregister: the application deregisters the
// region of its own outstanding WRITE (the user's error in verbs) while
// the WRITE's packets, built as views of it (zero-copy), are partly in a
// Send and partly still queued. Deregister waits for the Send under way;
// the packets not yet sent are dropped (zero_copy_dropped), never sent
// from memory the application owns again; the WRITE completes with an
// error once its resend cannot gather (no crash, no hang), and the
// responder's region never holds a byte written after Deregister.
func TestZeroCopyRequesterDeregister(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{mtu: MTU1024, timeout: 8, retry: 2}
	o.defaults()
	al := newGatedZCLink(t, n, addrA, func(op bth.Opcode) bool { return op == bth.RCWriteFirst })
	a := newSideOn(t, al, &o)
	b := newSide(t, n, addrB, &o)
	if !a.dev.zc {
		t.Fatal("the requester's device does not send zero-copy")
	}
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	const size = 256 << 10
	src, smr := a.buffer(t, size, 0)
	dst, dmr := b.buffer(t, size, memreg.AccessRemoteWrite)
	for i := range src {
		src[i] = 0xaa
	}
	before := a.dev.Counters()
	posted := make(chan error, 1)
	go func() { // the gated Send may be PostSend's own
		posted <- a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, size),
			RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()})
	}()
	select {
	case <-al.blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("no WRITE packet was sent")
	}
	deregistered := make(chan error, 1)
	go func() {
		err := smr.Deregister()
		for i := range src {
			src[i] = 0x55 // the memory is the application's again
		}
		deregistered <- err
	}()
	var derr error
	select {
	case derr = <-deregistered:
		t.Errorf("Deregister returned (%v) while a Send was still to read its memory", derr)
		close(al.release)
	case <-time.After(50 * time.Millisecond):
		close(al.release)
		derr = <-deregistered
	}
	if derr != nil {
		t.Fatal(derr)
	}
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.scq, 1, 20*time.Second)[0]
	if wc.WRID != 1 || wc.Status == WCSuccess {
		t.Errorf("WRITE from a region deregistered under it: %+v, want an error completion", wc)
	}
	after := a.dev.Counters()
	t.Logf("completion %v; zero_copy_dropped +%d", wc.Status, after.ZeroCopyDropped-before.ZeroCopyDropped)
	if k := bytes.Count(dst, []byte{0x55}); k > 0 {
		t.Fatalf("the responder got %d bytes written after Deregister returned", k)
	}
}

// TestZeroCopyReadTakenThenDeregister: the responder's application
// deregisters the region a peer's READ is reading while the zero-copy
// responses built from it are between the QP and the link (taken out by
// the end of the received batch, not sent yet: testHookRespTaken). The
// responses are dropped at the send (zero_copy_dropped), never read from
// memory the application owns again; the requester's READ, resent, fails
// with the rkey's remote access error, as if the region had gone just
// before the READ arrived. The memory overwritten after Deregister
// returned never reaches the requester.
func TestZeroCopyReadTakenThenDeregister(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{mtu: MTU4096, timeout: 8, retry: 3}
	o.defaults()
	a := newSide(t, n, addrA, &o)
	bl := newGatedZCLink(t, n, addrB, nil)
	b := newSideOn(t, bl, &o)
	if !b.dev.zc {
		t.Fatal("the responder's link is not zero-copy")
	}
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	const size = 8 << 10
	dst, dmr := a.buffer(t, size, 0)
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	for i := range src {
		src[i] = 0xaa
	}
	var hit atomic.Bool
	hook := func(d *Device) {
		if d != b.dev || hit.Load() {
			return
		}
		for _, up := range d.rxResp.pkts {
			if bth.Opcode(up.Buf[0]).Info().Kind == bth.KindReadResponse && up.Hold != nil {
				hit.Store(true)
			}
		}
		if !hit.Load() {
			return
		}
		done := make(chan error, 1)
		go func() {
			err := smr.Deregister()
			for i := range src {
				src[i] = 0x55 // the memory is the application's again
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Deregister did not return while a batch's responses were taken")
		}
	}
	testHookRespTaken.Store(&hook)
	defer testHookRespTaken.Store(nil)

	before := b.dev.Counters()
	if err := a.qp.PostSend(SendWR{WRID: 3, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size),
		RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.scq, 1, 20*time.Second)[0]
	testHookRespTaken.Store(nil)
	if !hit.Load() {
		t.Fatal("the hook never saw the READ's zero-copy responses taken")
	}
	dropped := b.dev.Counters().ZeroCopyDropped - before.ZeroCopyDropped
	if k := bytes.Count(dst, []byte{0x55}); k > 0 {
		t.Fatalf("the READ (%v) delivered %d bytes written after Deregister returned", wc.Status, k)
	}
	if wc.Status != WCRemAccessErr || dropped == 0 {
		t.Fatalf("READ %v, responder zero_copy_dropped +%d; want remote access error, > 0", wc.Status, dropped)
	}
}
