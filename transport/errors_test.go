package transport

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// eventually polls cond (real time, bounded) — used only to wait for the
// receive goroutines; protocol timers are driven by a ManualClock.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func manual() *ManualClock { return NewManualClock(time.Unix(1_700_000_000, 0)) }

func TestRemoteAccessError(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	src, smr := a.buffer(t, 64, 0)
	_ = src
	_, dmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	// Wrong rkey, then a WR behind it that must be flushed.
	if err := a.qp.PostSend(
		SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey() ^ 0x5500},
		SendWR{WRID: 2, Opcode: WRWrite, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
	); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 2, 5*time.Second)
	if wcs[0].WRID != 1 || wcs[0].Status != WCRemAccessErr || wcs[0].Status.String() != "remote access error" {
		t.Fatalf("first completion %+v", wcs[0])
	}
	if wcs[1].WRID != 2 || wcs[1].Status != WCWRFlushErr {
		t.Fatalf("second completion %+v", wcs[1])
	}
	if a.qp.State() != QPSErr {
		t.Fatalf("requester state %v, want ERR", a.qp.State())
	}
	eventually(t, "responder ERR", func() bool { return b.qp.State() == QPSErr })
	// Out of bounds on a valid key is a remote access error as well.
	a2, b2, _ := newPair(t, pairOpts{})
	_, smr2 := a2.buffer(t, 64, 0)
	_, dmr2 := b2.buffer(t, 64, memreg.AccessRemoteWrite)
	if err := a2.qp.PostSend(SendWR{WRID: 3, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr2, 0, 64), RemoteAddr: dmr2.IOVA() + 1, RKey: dmr2.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a2.scq, 1, 5*time.Second)[0]; wc.Status != WCRemAccessErr {
		t.Fatalf("out of bounds: %+v", wc)
	}
}

// TestReadWithoutRemoteRead: a READ of a region registered without
// REMOTE_READ is an R_Key violation: NAK remote access error (as rxe does);
// a READ on a QP whose access flags lack REMOTE_READ is an invalid request.
func TestReadWithoutRemoteRead(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, lmr := a.buffer(t, 64, 0)
	_, rmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(lmr, 0, 64), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCRemAccessErr || wc.Opcode != WCRDMARead {
		t.Fatalf("region without REMOTE_READ: %+v", wc)
	}

	a, b, _ = newPair(t, pairOpts{access: memreg.AccessRemoteWrite})
	_, lmr = a.buffer(t, 64, 0)
	_, rmr = b.buffer(t, 64, memreg.AccessRemoteRead)
	if err := a.qp.PostSend(SendWR{WRID: 2, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(lmr, 0, 64), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.scq, 1, 5*time.Second)[0]
	if wc.Status != WCRemInvReqErr || wc.Status.String() != "remote invalid request error" {
		t.Fatalf("QP without REMOTE_READ: %+v", wc)
	}
}

// TestInvalidRequestLength: a SEND longer than the posted receive buffer
// is an invalid request for the requester and a local length error for
// the receiver.
func TestInvalidRequestLength(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, smr := a.buffer(t, 100, 0)
	_, rmr := b.buffer(t, 10, 0)
	if err := b.qp.PostRecv(RecvWR{WRID: 9, SGEs: sge(rmr, 0, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, SGEs: sge(smr, 0, 100)}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCRemInvReqErr || wc.WRID != 1 {
		t.Fatalf("sender: %+v", wc)
	}
	if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != WCLocLenErr || wc.WRID != 9 {
		t.Fatalf("receiver: %+v", wc)
	}
}

func TestRNRRecovery(t *testing.T) {
	clk := manual()
	a, b, _ := newPair(t, pairOpts{clock: clk, rnrRetry: 3, retry: 3, minRNR: 14})
	src, smr := a.buffer(t, 3000, 0)
	fill(src, 5)
	dst, dmr := b.buffer(t, 3000, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 3000)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "RNR NAK", func() bool { return a.dev.Counters().RcvdRNRErr == 1 && rnrWaiting(a.qp) })
	if c := b.dev.Counters(); c.SendRNRErr != 1 {
		t.Fatalf("send_rnr_err %d", c.SendRNRErr)
	}
	// Back-off 1.28 ms (code 14): before it ends nothing is resent.
	clk.Advance(time.Millisecond)
	noWC(t, a.scq)
	if err := b.qp.PostRecv(RecvWR{WRID: 2, SGEs: sge(dmr, 0, 3000)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Millisecond)
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("%+v", wc)
	}
	if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.ByteLen != 3000 || string(dst) != string(src) {
		t.Fatalf("%+v", wc)
	}
}

func TestRNRRetryExceeded(t *testing.T) {
	clk := manual()
	a, b, _ := newPair(t, pairOpts{clock: clk, rnrRetry: 2, minRNR: 1})
	_, smr := a.buffer(t, 8, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, SGEs: sge(smr, 0, 8)},
		SendWR{WRID: 2, Opcode: WRSend, SGEs: sge(smr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	// Step the clock until the retries run out; a step may bring more than
	// one NAK (see TestRNRInfinite), so progress, not a count per step, is
	// what each step waits for.
	var seen uint64
	for a.dev.Counters().RetryRNRExceededErr == 0 {
		eventually(t, fmt.Sprintf("RNR NAK %d", seen+1), func() bool {
			c := a.dev.Counters()
			return c.RetryRNRExceededErr != 0 || c.RcvdRNRErr > seen && rnrWaiting(a.qp)
		})
		seen = a.dev.Counters().RcvdRNRErr
		if a.dev.Counters().RetryRNRExceededErr == 0 {
			clk.Advance(time.Millisecond)
		}
	}
	wcs := waitWC(t, a.scq, 2, 5*time.Second)
	if wcs[0].WRID != 1 || wcs[0].Status != WCRNRRetryExcErr || wcs[0].Status.String() != "RNR retry counter exceeded" {
		t.Fatalf("%+v", wcs[0])
	}
	if wcs[1].Status != WCWRFlushErr {
		t.Fatalf("%+v", wcs[1])
	}
	if c := a.dev.Counters(); c.RetryRNRExceededErr != 1 || c.RcvdRNRErr != 3 {
		t.Fatalf("counters %+v", c)
	}
	if c := b.dev.Counters(); c.SendRNRErr != 3 {
		t.Fatalf("send_rnr_err %d", c.SendRNRErr)
	}
}

// TestRetryExceededSilentPeer: every packet is lost; after retry_cnt
// timeouts the WR completes with "transport retry counter exceeded".
func TestRetryExceededSilentPeer(t *testing.T) {
	clk := manual()
	a, _, n := newPair(t, pairOpts{clock: clk, retry: 3, timeout: 10})
	n.SetFaults(memnet.Faults{Loss: 1})
	_, smr := a.buffer(t, 8, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, SGEs: sge(smr, 0, 8), RemoteAddr: 0x1000, RKey: 1}); err != nil {
		t.Fatal(err)
	}
	to := AckTimeout(10)
	for i := 0; i < 3; i++ {
		clk.Advance(to)
		if c := a.dev.Counters(); c.CompleterRetryErr != uint64(i+1) {
			t.Fatalf("after %d timeouts: completer_retry_err %d", i+1, c.CompleterRetryErr)
		}
		noWC(t, a.scq)
	}
	clk.Advance(to)
	wc := waitWC(t, a.scq, 1, time.Second)[0]
	if wc.Status != WCRetryExcErr || wc.Status.String() != "transport retry counter exceeded" || wc.Opcode != WCRDMAWrite {
		t.Fatalf("%+v", wc)
	}
	c := a.dev.Counters()
	if c.RetryExceededErr != 1 || c.LocalAckTimeout != 4 || c.RetransmittedPkts != 3 {
		t.Fatalf("counters %+v", c)
	}
	if a.qp.State() != QPSErr {
		t.Fatalf("state %v", a.qp.State())
	}
}

func TestFlushToErr(t *testing.T) {
	clk := manual()
	a, _, n := newPair(t, pairOpts{clock: clk})
	n.SetFaults(memnet.Faults{Loss: 1})
	_, mr := a.buffer(t, 64, 0)
	for i := 0; i < 5; i++ {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRSend, SGEs: sge(mr, 0, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		if err := a.qp.PostRecv(RecvWR{WRID: uint64(100 + i), SGEs: sge(mr, 0, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.Modify(&QPAttr{State: QPSErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 5, time.Second)
	for i, wc := range wcs {
		if wc.WRID != uint64(i) || wc.Status != WCWRFlushErr || wc.Status.String() != "Work Request Flushed Error" {
			t.Fatalf("send %d: %+v", i, wc)
		}
	}
	rwcs := waitWC(t, a.rcq, 3, time.Second)
	for i, wc := range rwcs {
		if wc.WRID != uint64(100+i) || wc.Status != WCWRFlushErr {
			t.Fatalf("recv %d: %+v", i, wc)
		}
	}
	// Posting in ERR completes immediately with a flush error.
	if err := a.qp.PostSend(SendWR{WRID: 9, Opcode: WRSend, SGEs: sge(mr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, time.Second)[0]; wc.WRID != 9 || wc.Status != WCWRFlushErr {
		t.Fatalf("%+v", wc)
	}
	if err := a.qp.PostRecv(RecvWR{WRID: 10, SGEs: sge(mr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.rcq, 1, time.Second)[0]; wc.WRID != 10 || wc.Status != WCWRFlushErr {
		t.Fatalf("%+v", wc)
	}
	clk.Advance(time.Hour)
	noWC(t, a.scq)
}

// dropLink drops outgoing packets for which drop returns true.
type dropLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	mu       sync.Mutex
	drop     func(op bth.Opcode) bool
	n        atomic.Int32
}

func (l *dropLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := make([]udp.Packet, 0, len(pkts))
	for _, p := range pkts {
		if l.drop(bth.BTH(p.Buf).Opcode()) {
			l.n.Add(1)
			continue
		}
		keep = append(keep, p)
	}
	if len(keep) == 0 {
		return nil
	}
	return l.Link.Send(keep)
}

// TestLostAtomicAck: the responder's first ATOMIC ACK is lost; the
// requester times out and resends; the responder replays the saved result
// and the target memory changes exactly once.
func TestLostAtomicAck(t *testing.T) {
	for _, op := range []WROpcode{WRFetchAdd, WRCompareSwap} {
		t.Run(op.String(), func(t *testing.T) {
			clk := manual()
			o := pairOpts{clock: clk, retry: 3, timeout: 10}
			o.defaults()
			n := memnet.NewMemNetwork(memnet.Faults{})
			a := newSide(t, n, addrA, &o)
			lb, err := n.Link(addrB)
			if err != nil {
				t.Fatal(err)
			}
			dropped := false
			dl := &dropLink{Wrap: udp.Wrap{Link: lb}, drop: func(op bth.Opcode) bool {
				if op == bth.RCAtomicAck && !dropped {
					dropped = true
					return true
				}
				return false
			}}
			b := sideOn(t, dl, &o)
			connect(t, a, b, addrB, 100, 200, &o)
			connect(t, b, a, addrA, 200, 100, &o)
			target, tmr := b.buffer(t, 8, memreg.AccessRemoteAtomic)
			nativePut(target, 40)
			res, rmr := a.buffer(t, 8, 0)
			wr := SendWR{WRID: 1, Opcode: op, Flags: SendSignaled, SGEs: sge(rmr, 0, 8), RemoteAddr: tmr.IOVA(), RKey: tmr.RKey(), CompareAdd: 2}
			if op == WRCompareSwap {
				wr.CompareAdd, wr.Swap = 40, 42
			}
			if err := a.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			eventually(t, "ATOMIC ACK drop", func() bool { return dl.n.Load() == 1 })
			if got := nativeGet(target); got != 42 {
				t.Fatalf("memory after first execution %d", got)
			}
			noWC(t, a.scq)
			clk.Advance(AckTimeout(10))
			wc := waitWC(t, a.scq, 1, 5*time.Second)[0]
			if wc.Status != WCSuccess {
				t.Fatalf("%+v", wc)
			}
			if got := nativeGet(res); got != 40 {
				t.Fatalf("returned orig %d, want 40", got)
			}
			if got := nativeGet(target); got != 42 {
				t.Fatalf("memory %d after replay, want 42 (executed once)", got)
			}
			if c := b.dev.Counters(); c.DuplicateRequest != 1 {
				t.Fatalf("duplicate_request %d", c.DuplicateRequest)
			}
			if c := a.dev.Counters(); c.CompleterRetryErr != 1 {
				t.Fatalf("completer_retry_err %d", c.CompleterRetryErr)
			}
		})
	}
}

// TestLostReadResponse: a lost READ response makes the requester re-request
// the missing part; the responder replays it from its saved resource.
func TestLostReadResponse(t *testing.T) {
	clk := manual()
	o := pairOpts{clock: clk, retry: 3, timeout: 10}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newSide(t, n, addrA, &o)
	lb, err := n.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	dl := &dropLink{Wrap: udp.Wrap{Link: lb}, drop: func(op bth.Opcode) bool {
		if op.Info().Kind == bth.KindReadResponse {
			count++
			return count == 3 // the second middle packet
		}
		return false
	}}
	b := sideOn(t, dl, &o)
	connect(t, a, b, addrB, 100, 200, &o)
	connect(t, b, a, addrA, 200, 100, &o)
	src, smr := b.buffer(t, 5000, memreg.AccessRemoteRead)
	fill(src, 1)
	dst, dmr := a.buffer(t, 5000, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, 5000), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	// The gap is seen when the 4th response arrives: immediate re-request.
	wc := waitWC(t, a.scq, 1, 5*time.Second)[0]
	if wc.Status != WCSuccess || string(dst) != string(src) {
		t.Fatalf("%+v", wc)
	}
	if c := b.dev.Counters(); c.DuplicateRequest != 1 {
		t.Fatalf("duplicate_request %d", c.DuplicateRequest)
	}
}

// sideOn builds a side on an arbitrary link.
func sideOn(t testing.TB, l udp.Link, o *pairOpts) *side {
	t.Helper()
	dev, err := NewDevice(l, DeviceConfig{Clock: o.clock, MaxUnackedPSNs: o.window, MaxUnackedSmallPSNs: o.small})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, _ := dev.AllocPD()
	scq, _ := dev.CreateCQ(o.cqDepth)
	rcq, _ := dev.CreateCQ(o.cqDepth)
	qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: rcq, MaxSendWR: o.sqDepth, MaxRecvWR: o.rqDepth, MaxSGE: 4})
	if err != nil {
		t.Fatal(err)
	}
	return &side{dev: dev, pd: pd, scq: scq, rcq: rcq, qp: qp}
}

func TestCQOverflow(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{cqDepth: 4})
	_, smr := a.buffer(t, 8, 0)
	_, dmr := b.buffer(t, 8, memreg.AccessRemoteWrite)
	for i := 0; i < 6; i++ {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "overflow", func() bool { return a.scq.Err() != nil })
	if !errors.Is(a.scq.Err(), ErrCQOverflow) {
		t.Fatal(a.scq.Err())
	}
	wc := make([]WC, 8)
	if n := a.scq.Poll(wc); n != 4 {
		t.Fatalf("polled %d", n)
	}
	if _, err := a.scq.Wait(t.Context(), wc); !errors.Is(err, ErrCQOverflow) {
		t.Fatalf("Wait: %v", err)
	}
}

func TestPostErrors(t *testing.T) {
	a, _, n := newPair(t, pairOpts{sqDepth: 2, clock: manual()})
	n.SetFaults(memnet.Faults{Loss: 1})
	_, mr := a.buffer(t, 64, 0)
	bad := sge(mr, 0, 8)
	bad = append(bad, memreg.SGE{Addr: 1, Length: 1, LKey: 0x1234})
	err := a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: sge(mr, 0, 8)}, SendWR{Opcode: WRSend, SGEs: bad})
	if err == nil || !errors.Is(err, memreg.ErrUnknownKey) {
		t.Fatalf("bad lkey: %v", err)
	}
	// A bad lkey is an invalid WR too (it was not, before WRError), and
	// the error says which WR and SGE: the first WR stays posted.
	if !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("bad lkey is not ErrInvalidWR: %v", err)
	}
	var we *WRError
	if !errors.As(err, &we) || we.Index != 1 || we.Field != "sg_list[1].lkey" || we.Op != "PostSend" {
		t.Fatalf("bad lkey: WRError %+v from %v", we, err)
	}
	if want := "transport: PostSend qp "; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "wr 1 ") ||
		!strings.Contains(err.Error(), "lkey 0x1234") {
		t.Fatalf("error %q does not name the QP, the WR and the lkey", err)
	}
	err = a.qp.PostSend(SendWR{Opcode: WRFetchAdd, SGEs: sge(mr, 0, 8), RemoteAddr: 3})
	if !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("misaligned atomic: %v", err)
	}
	// The first WR of the first call was posted; one more fills the queue.
	err = a.qp.PostSend(SendWR{WRID: 5, Opcode: WRSend, SGEs: sge(mr, 0, 8)}, SendWR{WRID: 6, Opcode: WRSend, SGEs: sge(mr, 0, 8)})
	if !errors.Is(err, ErrQueueFull) || !contains(err.Error(), "wr 1") {
		t.Fatalf("queue full: %v", err)
	}
	if err := a.qp.PostSend(SendWR{Opcode: 42}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("still full: %v", err)
	}
	if err := a.qp.PostRecv(RecvWR{SGEs: []memreg.SGE{{Addr: mr.IOVA(), Length: 8, LKey: 0x777}}}); !errors.Is(err, memreg.ErrUnknownKey) || !errors.Is(err, ErrInvalidWR) || !contains(err.Error(), "PostRecv qp") ||
		!contains(err.Error(), "sg_list[0].lkey: lkey 0x777") {
		t.Fatalf("recv bad lkey: %v", err)
	}
}

func TestModifyStateMachine(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	s := newSide(t, n, addrA, &o)
	qp := s.qp
	if qp.State() != QPSReset || qp.State().String() != "RESET" {
		t.Fatal(qp.State())
	}
	// Missing required attribute.
	err := qp.Modify(&QPAttr{State: QPSInit, Port: 1}, AttrState|AttrPort)
	if !errors.Is(err, ErrMissingAttr) || !contains(err.Error(), "access_flags") {
		t.Fatalf("missing: %v", err)
	}
	// Illegal transition.
	err = qp.Modify(&QPAttr{State: QPSRTS}, AttrState)
	if !errors.Is(err, ErrInvalidState) || !contains(err.Error(), "RESET -> RTS") {
		t.Fatalf("illegal: %v", err)
	}
	// Attribute not allowed in this transition.
	err = qp.Modify(&QPAttr{State: QPSInit, Port: 1, AccessFlags: 0, Timeout: 3}, AttrState|AttrPort|AttrAccessFlags|AttrPKeyIndex|AttrTimeout)
	if !errors.Is(err, ErrInvalidAttr) || !contains(err.Error(), "timeout") {
		t.Fatalf("extra: %v", err)
	}
	if qp.State() != QPSReset {
		t.Fatal("state changed on error")
	}
	if err := qp.Modify(&QPAttr{State: QPSInit, Port: 1}, AttrState|AttrPort|AttrAccessFlags|AttrPKeyIndex); err != nil {
		t.Fatal(err)
	}
	// Invalid value leaves the QP unchanged.
	rtr := QPAttr{State: QPSRTR, AV: AddressVector{Addr: addrB}, PathMTU: 9, DestQPN: 0x20, RQPSN: 5, MaxDestRdAtomic: 1}
	rtrMask := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	if err := qp.Modify(&rtr, rtrMask); !errors.Is(err, ErrInvalidAttr) || !contains(err.Error(), "path_mtu") {
		t.Fatalf("bad mtu: %v", err)
	}
	if q, _ := qp.Query(); q.State != QPSInit || q.PathMTU != 0 || q.DestQPN != 0 {
		t.Fatalf("QP changed on error: %+v", q)
	}
	rtr.PathMTU = MTU2048
	// A connected QP has one peer: no group address.
	for _, g := range []string{"224.0.0.251", "239.1.2.3", "255.255.255.255"} {
		bad := rtr
		bad.AV.Addr = netip.MustParseAddr(g)
		if err := qp.Modify(&bad, rtrMask); !errors.Is(err, ErrInvalidAttr) || !contains(err.Error(), "group address") {
			t.Fatalf("peer %s: %v", g, err)
		}
	}
	if err := qp.Modify(&rtr, rtrMask); err != nil {
		t.Fatal(err)
	}
	rts := QPAttr{State: QPSRTS, SQPSN: 0x1000000, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxQPRdAtomic: 1}
	rtsMask := AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	if err := qp.Modify(&rts, rtsMask); !errors.Is(err, ErrInvalidAttr) || !contains(err.Error(), "sq_psn") {
		t.Fatalf("bad psn: %v", err)
	}
	rts.SQPSN = 77
	if err := qp.Modify(&rts, rtsMask); err != nil {
		t.Fatal(err)
	}
	q, _ := qp.Query()
	if q.State != QPSRTS || q.SQPSN != 77 || q.RQPSN != 5 || q.PathMTU != MTU2048 || q.DestQPN != 0x20 || q.AV.Addr != addrB {
		t.Fatalf("query %+v", q)
	}
	if err := qp.Modify(&QPAttr{State: QPSSQD}, AttrState); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&QPAttr{State: QPSSQD, Timeout: 5}, AttrState|AttrTimeout); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&QPAttr{State: QPSRTS}, AttrState); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&QPAttr{State: QPSErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&QPAttr{State: QPSRTS}, AttrState); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("ERR -> RTS: %v", err)
	}
	if err := qp.Modify(&QPAttr{State: QPSReset}, AttrState); err != nil {
		t.Fatal(err)
	}
	if q, _ := qp.Query(); q.State != QPSReset || q.DestQPN != 0 {
		t.Fatalf("after reset %+v", q)
	}
	_ = netip.Addr{}
	_ = packet.Len
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestStatusStrings(t *testing.T) {
	want := []string{"success", "local length error", "local QP operation error", "local EE context operation error",
		"local protection error", "Work Request Flushed Error", "memory management operation error", "bad response error",
		"local access error", "remote invalid request error", "remote access error", "remote operation error",
		"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation error",
		"remote invalid RD request", "aborted error", "invalid EE context number", "invalid EE context state",
		"fatal error", "response timeout error", "general error"}
	for i, w := range want {
		if got := WCStatus(i).String(); got != w {
			t.Errorf("WCStatus(%d) = %q, want %q", i, got, w)
		}
	}
}

// TestAckTimeoutExact: the first retransmission happens exactly one local
// ACK timeout (4.096 µs × 2^timeout) after the last send.
func TestAckTimeoutExact(t *testing.T) {
	if AckTimeout(14) != 67108864*time.Nanosecond || AckTimeout(0) != 0 || AckTimeout(1) != 8192*time.Nanosecond {
		t.Fatalf("AckTimeout(14) = %v", AckTimeout(14))
	}
	clk := manual()
	a, _, n := newPair(t, pairOpts{clock: clk, retry: 1, timeout: 14})
	n.SetFaults(memnet.Faults{Loss: 1})
	_, smr := a.buffer(t, 8, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, SGEs: sge(smr, 0, 8), RemoteAddr: 0x1000, RKey: 1}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(AckTimeout(14) - time.Nanosecond)
	if c := a.dev.Counters(); c.LocalAckTimeout != 0 {
		t.Fatalf("timeout fired early: %+v", c)
	}
	clk.Advance(time.Nanosecond)
	if c := a.dev.Counters(); c.LocalAckTimeout != 1 || c.RetransmittedPkts != 1 {
		t.Fatalf("no retransmission at the timeout: %+v", c)
	}
	// Timeout 0 means infinite: nothing ever fires.
	clk2 := manual()
	a2, _, n2 := newPair(t, pairOpts{clock: clk2, retry: 1, timeout: 14})
	if err := a2.qp.Modify(&QPAttr{State: QPSSQD}, AttrState); err != nil {
		t.Fatal(err)
	}
	if err := a2.qp.Modify(&QPAttr{State: QPSSQD, Timeout: 0}, AttrState|AttrTimeout); err != nil {
		t.Fatal(err)
	}
	if err := a2.qp.Modify(&QPAttr{State: QPSRTS}, AttrState); err != nil {
		t.Fatal(err)
	}
	n2.SetFaults(memnet.Faults{Loss: 1})
	_, smr2 := a2.buffer(t, 8, 0)
	if err := a2.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, SGEs: sge(smr2, 0, 8), RemoteAddr: 0x1000, RKey: 1}); err != nil {
		t.Fatal(err)
	}
	clk2.Advance(24 * time.Hour)
	if c := a2.dev.Counters(); c.LocalAckTimeout != 0 {
		t.Fatalf("infinite timeout fired: %+v", c)
	}
}

// TestRNRInfinite: rnr_retry 7 retries forever.
func TestRNRInfinite(t *testing.T) {
	clk := manual()
	a, b, _ := newPair(t, pairOpts{clock: clk, rnrRetry: 7, minRNR: 1})
	_, smr := a.buffer(t, 8, 0)
	_, dmr := b.buffer(t, 8, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	// Each clock step lets the RNR timer fire and the SEND go again; the
	// NAK for it may arrive while the step is still firing timers, and then
	// the next back-off can fall inside the same step, so a step may bring
	// more than one NAK (ManualClock fires every timer due by its end).
	var seen uint64
	for seen < 20 {
		eventually(t, fmt.Sprintf("RNR NAK %d", seen+1), func() bool {
			return a.dev.Counters().RcvdRNRErr > seen && rnrWaiting(a.qp)
		})
		seen = a.dev.Counters().RcvdRNRErr
		if seen < 20 {
			clk.Advance(20 * time.Microsecond)
		}
	}
	if c := a.dev.Counters(); c.RetryRNRExceededErr != 0 {
		t.Fatalf("RNR retry 7 (infinite) gave up after %d NAKs: %+v", c.RcvdRNRErr, c)
	}
	noWC(t, a.scq)
	if err := b.qp.PostRecv(RecvWR{WRID: 2, SGEs: sge(dmr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Millisecond)
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("%+v", wc)
	}
}

// rnrWaiting reports whether qp is in an RNR back-off (timer armed).
func rnrWaiting(qp *QP) bool {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.tmr.rnrWait
}

// TestLateDuplicateReadAfterDeregister: a duplicate READ request arriving
// after the READ completed and the region was deregistered matches the
// saved resource, but its rkey no longer reads: the responder answers with
// a Remote Access Error NAK and goes to ERR, as rxe's read_reply does
// (rxe_recheck_mr fails, RESPST_ERR_RKEY_VIOLATION, class C). The NAK is
// behind the requester's window, so the requester's completed READ is not
// touched. (It used to be dropped; TestDuplicateReadRkeyRechecked shows
// why that was wrong when the requester is still waiting.)
func TestLateDuplicateReadAfterDeregister(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, lmr := a.buffer(t, 4096, 0)
	_, rmr := b.buffer(t, 4096, memreg.AccessRemoteRead)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(lmr, 0, 4096), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("%+v", wc)
	}
	if err := rmr.Deregister(); err != nil {
		t.Fatal(err)
	}
	// Replay the READ request (PSN 0xfffff0, the first of A's PSNs).
	buf := make([]byte, udp.MaxPacketSize)
	f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest, PKey: bth.DefaultPKey, DestQP: b.qp.QPN(), PSN: 0xfffff0, AckReq: true}}
	f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = rmr.IOVA(), rmr.RKey(), 4096
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.dev.HandlePacket(buf[:n], addrA); err != nil {
		t.Fatal(err)
	}
	if c := b.dev.Counters(); c.DuplicateRequest != 1 {
		t.Fatalf("duplicate_request %d", c.DuplicateRequest)
	}
	if st := b.qp.State(); st != QPSErr {
		t.Fatalf("responder state %v after a duplicate READ whose rkey is gone, want ERR (NAK sent)", st)
	}
	noWC(t, a.scq)
}

// TestDuplicateReadRkeyRechecked: the last READ response is lost and the
// responder deregisters the region before the requester's ACK timer
// resends the READ. The duplicate matches the saved resource, but its rkey
// is checked again (rxe's read_reply, rxe_recheck_mr): the responder NAKs
// Remote Access Error and the requester completes with REM_ACCESS_ERR after
// one resend. Before, the duplicate was dropped and the requester resent
// until retry_cnt was spent, then completed with RETRY_EXC_ERR.
func TestDuplicateReadRkeyRechecked(t *testing.T) {
	clk := manual()
	o := pairOpts{clock: clk, retry: 3, timeout: 10}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newSide(t, n, addrA, &o)
	lb, err := n.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	dropped := false
	dl := &dropLink{Wrap: udp.Wrap{Link: lb}, drop: func(op bth.Opcode) bool {
		if op == bth.RCReadResponseLast && !dropped {
			dropped = true
			return true
		}
		return false
	}}
	b := sideOn(t, dl, &o)
	connect(t, a, b, addrB, 100, 200, &o)
	connect(t, b, a, addrA, 200, 100, &o)
	_, smr := b.buffer(t, 4096, memreg.AccessRemoteRead)
	_, dmr := a.buffer(t, 4096, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, 4096), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "READ_RESPONSE_LAST drop", func() bool { return dl.n.Load() == 1 })
	// The three responses that were not dropped have been handled (each
	// restarts the ACK timer).
	eventually(t, "the first three READ responses", func() bool { return a.dev.Counters().RcvdPkts >= 3 })
	noWC(t, a.scq)
	if err := smr.Deregister(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(AckTimeout(10))
	eventually(t, "the duplicate READ", func() bool { return b.dev.Counters().DuplicateRequest == 1 })
	var wc [1]WC
	eventually(t, "the READ's completion without another ACK timeout", func() bool { return a.scq.Poll(wc[:]) == 1 })
	if wc[0].Status != WCRemAccessErr || wc[0].WRID != 1 {
		t.Fatalf("READ completed %+v, want REM_ACCESS_ERR", wc[0])
	}
	if c := a.dev.Counters(); c.LocalAckTimeout != 1 {
		t.Fatalf("local_ack_timeout_err %d, want 1", c.LocalAckTimeout)
	}
}
