package transport

// Regression tests for the library's contract with its users: wake-ups,
// ownership across devices, busy resources, Close, CQ overflow, local
// requester errors, link errors, asynchronous events and completion
// channels (issue 13).

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestCQWaitTwoWaiters: two goroutines wait for one completion each on
// one CQ; one PostSend of two signalled WRITEs completes both, possibly in
// one batch (one wake). Both waiters must return. Before the fix the
// second waited until its deadline.
func TestCQWaitTwoWaiters(t *testing.T) {
	for round := 0; round < 20; round++ {
		a, r, _ := newPair(t, pairOpts{})
		_, smr := a.buffer(t, 64, 0)
		_, dmr := r.buffer(t, 64, memreg.AccessRemoteWrite)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var wc [1]WC
				_, err := a.scq.Wait(ctx, wc[:])
				errs <- err
			}()
		}
		time.Sleep(time.Millisecond) // let both park
		wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
		w2 := wr
		w2.WRID = 2
		if err := a.qp.PostSend(wr, w2); err != nil {
			t.Fatal(err)
		}
		all := make(chan struct{})
		go func() { wg.Wait(); close(all) }()
		select {
		case <-all:
		case <-time.After(3 * time.Second):
			cancel()
			t.Fatalf("round %d: a waiter still waits although a completion is waiting for it", round)
		}
		cancel()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: a waiter returned %v", round, err)
			}
		}
	}
}

// TestCrossDeviceObjects: a QP may only use its own device's PD and CQs,
// as libibverbs requires; a CQ only its device's completion channel.
func TestCrossDeviceObjects(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	a := newSide(t, n, addrA, &o)
	b := newSide(t, n, addrB, &o)
	init := func(pd *memreg.PD, scq, rcq *CQ) error {
		_, err := b.dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 4, MaxRecvWR: 4})
		return err
	}
	if err := init(a.pd, b.scq, b.rcq); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("QP on B with A's PD: %v, want ErrWrongDevice", err)
	}
	if err := init(b.pd, a.scq, b.rcq); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("QP on B with A's send CQ: %v, want ErrWrongDevice", err)
	}
	if err := init(b.pd, b.scq, a.rcq); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("QP on B with A's recv CQ: %v, want ErrWrongDevice", err)
	}
	if err := init(b.pd, b.scq, b.rcq); err != nil {
		t.Errorf("QP on B with B's objects: %v", err)
	}
	ch, err := a.dev.CreateCompChannel(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.dev.CreateCQWith(CQAttr{Depth: 4, Channel: ch}); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("CQ on B with A's channel: %v, want ErrWrongDevice", err)
	}
}

// TestBusyResources: a PD or CQ that a QP uses cannot go away (verbs'
// EBUSY); after the QP is destroyed both can.
func TestBusyResources(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	s := newSide(t, n, addrA, &o)
	if err := s.pd.Dealloc(); !errors.Is(err, memreg.ErrBusy) {
		t.Errorf("Dealloc of a PD a QP uses: %v, want ErrBusy", err)
	}
	if err := s.scq.Destroy(); !errors.Is(err, ErrBusy) {
		t.Errorf("Destroy of the send CQ a QP uses: %v, want ErrBusy", err)
	}
	if err := s.rcq.Destroy(); !errors.Is(err, ErrBusy) {
		t.Errorf("Destroy of the recv CQ a QP uses: %v, want ErrBusy", err)
	}
	ch, err := s.dev.CreateCompChannel(2)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := s.dev.CreateCQWith(CQAttr{Depth: 4, Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Destroy(); !errors.Is(err, ErrBusy) {
		t.Errorf("Destroy of a channel a CQ uses: %v, want ErrBusy", err)
	}
	if err := s.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := s.qp.Destroy(); !errors.Is(err, ErrDestroyed) {
		t.Errorf("second Destroy: %v, want ErrDestroyed", err)
	}
	for _, c := range []*CQ{s.scq, s.rcq, cq} {
		if err := c.Destroy(); err != nil {
			t.Errorf("CQ.Destroy after the QP went: %v", err)
		}
	}
	if err := ch.Destroy(); err != nil {
		t.Errorf("channel Destroy after its CQ went: %v", err)
	}
	if _, ok := <-ch.C(); ok {
		t.Error("channel not closed by Destroy")
	}
	if err := s.pd.Dealloc(); err != nil {
		t.Errorf("PD.Dealloc after the QP went: %v", err)
	}
	if _, err := s.dev.CreateQP(s.pd, QPInitAttr{Type: QPTypeRC, SendCQ: s.scq, RecvCQ: s.rcq, MaxSendWR: 1, MaxRecvWR: 1}); err == nil {
		t.Error("CreateQP with a dead PD and destroyed CQs succeeded")
	}
}

// TestCloseUnblocks: Close wakes a waiter blocked with no deadline; after
// Close, posting returns ErrClosed (not a flush completion), like every
// other call on the device.
func TestCloseUnblocks(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	cq, err := a.dev.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var wc [1]WC
		_, err := cq.Wait(context.Background(), wc[:])
		done <- err
	}()
	// Registered before Close: RegisterMR fails on a closed device.
	_, mr := a.buffer(t, 8, 0)
	time.Sleep(time.Millisecond)
	if err := a.dev.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Wait after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the CQ waiter")
	}
	if err := a.qp.PostSend(SendWR{WRID: 9, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(mr, 0, 8)}); !errors.Is(err, ErrClosed) {
		t.Errorf("PostSend after Close: %v, want ErrClosed", err)
	}
	if err := a.qp.PostRecv(RecvWR{SGEs: sge(mr, 0, 8)}); !errors.Is(err, ErrClosed) {
		t.Errorf("PostRecv after Close: %v, want ErrClosed", err)
	}
	var wc [4]WC
	if k := a.scq.Poll(wc[:]); k != 0 {
		t.Errorf("PostSend after Close produced completions %+v", wc[:k])
	}
	if _, err := a.dev.CreateCQ(1); !errors.Is(err, ErrClosed) {
		t.Errorf("CreateCQ after Close: %v", err)
	}
	if _, err := a.dev.AllocPD(); !errors.Is(err, ErrClosed) {
		t.Errorf("AllocPD after Close: %v", err)
	}
	if err := a.qp.Modify(&QPAttr{State: QPSErr}, AttrState); !errors.Is(err, ErrClosed) {
		t.Errorf("Modify after Close: %v", err)
	}
	if _, ok := <-a.dev.Events(); ok {
		// Drain: events raised before Close are delivered first.
		for range a.dev.Events() {
		}
	}
}

// TestResourcesAfterClose: a closed device holds nothing — Close released
// its QPs, SRQs, CQs and completion channels (their Destroy answers
// ErrClosed) — so Resources reports zero. It kept counting the CQs and
// channels, which nothing could destroy any more (probe lib26/fragile).
func TestResourcesAfterClose(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	ch, err := a.dev.CreateCompChannel(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.dev.CreateCQWith(CQAttr{Depth: 4, Channel: ch}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.dev.CreateSRQ(a.pd, SRQAttr{MaxWR: 4}); err != nil {
		t.Fatal(err)
	}
	if r := a.dev.Resources(); r.QPs == 0 || r.CQs == 0 || r.SRQs == 0 || r.CompChannels == 0 {
		t.Fatalf("before Close: %+v", r)
	}
	if err := a.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if r := a.dev.Resources(); r != (Resources{}) {
		t.Errorf("after Close: %+v, want none", r)
	}
	if err := a.scq.Destroy(); !errors.Is(err, ErrClosed) {
		t.Errorf("CQ.Destroy after Close: %v, want ErrClosed", err)
	}
	if err := ch.Destroy(); !errors.Is(err, ErrClosed) {
		t.Errorf("CompChannel.Destroy after Close: %v, want ErrClosed", err)
	}
}

// TestCloseRacesCreateQP: QPs created while Close runs are either refused
// (ErrClosed) or flushed to ERR by Close; none is left behind in RESET.
func TestCloseRacesCreateQP(t *testing.T) {
	for round := 0; round < 50; round++ {
		n := memnet.NewMemNetwork(memnet.Faults{})
		l, err := n.Link(addrA)
		if err != nil {
			t.Fatal(err)
		}
		dev, err := NewDevice(l, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(16)
		var qps []*QP
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				qps = append(qps, qp)
				select {
				case <-stop:
				default:
				}
			}
		}()
		time.Sleep(time.Duration(round%5) * 20 * time.Microsecond)
		dev.Close()
		close(stop)
		wg.Wait()
		for _, qp := range qps {
			if st := qp.State(); st != QPSErr {
				t.Fatalf("round %d: QP %#x created before Close returned is in %v, not flushed to ERR", round, qp.QPN(), st)
			}
		}
	}
}

// TestCQOverflowFailsQP: a QP whose completion is lost to a full CQ moves
// to ERR; the device raises EventCQErr and EventQPFatal.
func TestCQOverflowFailsQP(t *testing.T) {
	a, r, _ := newPair(t, pairOpts{cqDepth: 2})
	_, smr := a.buffer(t, 8, 0)
	_, dmr := r.buffer(t, 8, memreg.AccessRemoteWrite)
	wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	for i := 0; i < 3; i++ {
		wr.WRID = uint64(i)
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	got := map[EventType]bool{}
	deadline := time.After(5 * time.Second)
	for !got[EventCQErr] || !got[EventQPFatal] {
		select {
		case ev := <-a.dev.Events():
			got[ev.Type] = true
			if ev.Type == EventCQErr && ev.CQ != a.scq {
				t.Errorf("CQ error event names %p, want the send CQ", ev.CQ)
			}
			if ev.Type == EventQPFatal && (ev.QP != a.qp || !errors.Is(ev.Err, ErrCQOverflow)) {
				t.Errorf("QP fatal event %v", ev)
			}
		case <-deadline:
			t.Fatalf("events seen %v, want CQ error and QP fatal", got)
		}
	}
	if st := a.qp.State(); st != QPSErr {
		t.Errorf("QP state %v after its CQ overflowed, want ERR", st)
	}
	if err := a.scq.Err(); !errors.Is(err, ErrCQOverflow) {
		t.Errorf("CQ.Err = %v", err)
	}
	if c := a.dev.Counters(); c.CQOverflow == 0 {
		t.Error("cq_overflow not counted")
	}
	// The two stored completions are still there; then Wait reports the overflow.
	wc := make([]WC, 4)
	if k := a.scq.Poll(wc); k != 2 {
		t.Errorf("polled %d completions, want the 2 stored", k)
	}
	if _, err := a.scq.Wait(context.Background(), wc); !errors.Is(err, ErrCQOverflow) {
		t.Errorf("Wait on an overflowed, empty CQ: %v", err)
	}
}

// TestLocalErrorAfterSentWQEs: a WQE whose local memory goes away after it
// was first sent fails when the requester needs it again (a go-back-N
// retransmission); the WQE before it, whose retransmitted packets are
// already on the wire, completes successfully as its ACK arrives (rxe
// does the same), the failed one reports its own status and the one after
// it is flushed. Before the fix, the earlier WQE was flushed too.
func TestLocalErrorAfterSentWQEs(t *testing.T) {
	clk := manual()
	a, r, n := newPair(t, pairOpts{clock: clk, mtu: MTU1024, retry: 7, timeout: 10})
	_, big := a.buffer(t, 4<<10, 0)
	_, small := a.buffer(t, 64, 0)
	_, dmr := r.buffer(t, 4<<10, memreg.AccessRemoteWrite)
	n.SetFaults(memnet.Faults{Loss: 1}) // the first flight is lost
	err := a.qp.PostSend(
		SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(big, 0, 4<<10), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		SendWR{WRID: 2, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(small, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		SendWR{WRID: 3, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(big, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := small.Deregister(); err != nil {
		t.Fatal(err)
	}
	n.SetFaults(memnet.Faults{})
	// The timeout resends the first WRITE's packets, then fails to gather
	// the second WRITE.
	clk.Advance(AckTimeout(10))
	got := waitWC(t, a.scq, 3, 5*time.Second)
	want := []struct {
		id uint64
		st WCStatus
	}{{1, WCSuccess}, {2, WCLocProtErr}, {3, WCWRFlushErr}}
	for i, w := range want {
		if got[i].WRID != w.id || got[i].Status != w.st {
			t.Errorf("completion %d: wr_id %d %v, want wr_id %d %v", i, got[i].WRID, got[i].Status, w.id, w.st)
		}
	}
	if st := a.qp.State(); st != QPSErr {
		t.Errorf("QP state %v, want ERR", st)
	}
}

// failingLink is a udp.Link whose Recv fails a number of times, then
// blocks until Close.
type failingLink struct {
	addr   netip.Addr
	mu     sync.Mutex
	fails  int
	closed chan struct{}
}

var errLinkDown = errors.New("test: link down")

func (l *failingLink) Send([]udp.Packet) error { return nil }
func (l *failingLink) LocalAddr() netip.Addr   { return l.addr }
func (l *failingLink) BatchSize() int          { return 1 }
func (l *failingLink) Stats() udp.Stats        { return udp.Stats{} }
func (l *failingLink) Close() error            { close(l.closed); return nil }
func (l *failingLink) Recv([]udp.Packet) (int, error) {
	l.mu.Lock()
	if l.fails > 0 {
		l.fails--
		l.mu.Unlock()
		return 0, errLinkDown
	}
	l.mu.Unlock()
	<-l.closed
	return 0, net.ErrClosed
}

// buildPkt builds a minimal packet of opcode op for destQP (ICRC not set).
func buildPkt(t *testing.T, op bth.Opcode, destQP uint32) []byte {
	t.Helper()
	var f packet.Fields
	f.BTH.Opcode = op
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = destQP
	buf := make([]byte, udp.MaxPacketSize)
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestRecvErrorsCounted: link errors are counted (recv_err) and the last
// one is kept; they used to be retried silently.
func TestRecvErrorsCounted(t *testing.T) {
	l := &failingLink{addr: addrA, fails: 3, closed: make(chan struct{})}
	dev, err := NewDevice(l, DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	deadline := time.Now().Add(5 * time.Second)
	for dev.Counters().RecvErr < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if c := dev.Counters().RecvErr; c != 3 {
		t.Fatalf("recv_err = %d, want 3", c)
	}
	if !errors.Is(dev.LastRecvError(), errLinkDown) {
		t.Fatalf("LastRecvError = %v", dev.LastRecvError())
	}
}

// TestHandlePacketErrors: a packet for a QPN that does not exist is
// ErrUnknownQP (it was ErrInvalidWR), a malformed one ErrMalformed, one of
// another transport ErrTransportMismatch; each is counted under its name.
func TestHandlePacketErrors(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	ack := buildPkt(t, bth.RCAck, 0x999)
	if err := a.dev.HandlePacket(ack, addrB); !errors.Is(err, ErrUnknownQP) || errors.Is(err, ErrInvalidWR) {
		t.Errorf("unknown QP: %v", err)
	}
	if err := a.dev.HandlePacket(ack[:10], addrB); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed: %v", err)
	}
	ud := buildPkt(t, bth.UDSendOnly, a.qp.QPN())
	if err := a.dev.HandlePacket(ud, addrB); !errors.Is(err, ErrTransportMismatch) {
		t.Errorf("UD packet to an RC QP: %v", err)
	}
	c := a.dev.Counters()
	if c.UnknownQP != 1 || c.MalformedPkts != 1 || c.TransportMismatch != 1 {
		t.Errorf("counters unknown_qp %d malformed_pkts %d transport_mismatch %d, want 1 each", c.UnknownQP, c.MalformedPkts, c.TransportMismatch)
	}
}

// TestEvents: communication established on the first packet in RTR, a
// responder access error (the responder's device raises EventQPAccessErr,
// the requester's EventQPFatal with the failed completion's status), and
// SQ drained.
func TestEvents(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	a := newSide(t, n, addrA, &o)
	b := newSide(t, n, addrB, &o)
	connect(t, a, b, addrB, 100, 200, &o)
	// b only to RTR: its first received packet raises COMM_EST.
	if err := b.qp.Init(o.access); err != nil {
		t.Fatal(err)
	}
	rtr := QPAttr{State: QPSRTR, AV: AddressVector{Addr: addrA}, PathMTU: o.mtu, DestQPN: a.qp.QPN(), RQPSN: 100,
		MaxDestRdAtomic: 4, MinRNRTimer: 12}
	if err := b.qp.Modify(&rtr, AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer); err != nil {
		t.Fatal(err)
	}
	_, smr := a.buffer(t, 8, 0)
	_, dmr := b.buffer(t, 8, memreg.AccessRemoteWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, b.dev, EventCommEst, b.qp)
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("WRITE: %v", wc.Status)
	}
	// A WRITE with a bad rkey: remote access error on both sides.
	if err := a.qp.PostSend(SendWR{WRID: 2, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey() ^ 0xff00}); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, b.dev, EventQPAccessErr, b.qp)
	ev := expectEvent(t, a.dev, EventQPFatal, a.qp)
	var we *WCError
	if !errors.As(ev.Err, &we) || we.Status != WCRemAccessErr || we.WRID != 2 {
		t.Errorf("QP fatal cause %v, want the WRITE's remote access error", ev.Err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Err() == nil || !errors.As(wc.Err(), &we) || we.Status != WCRemAccessErr {
		t.Errorf("WC.Err() = %v", wc.Err())
	}

	// SQ drained: a fresh pair, RTS -> SQD with nothing outstanding.
	c, _, _ := newPair(t, pairOpts{})
	if err := c.qp.Modify(&QPAttr{State: QPSSQD}, AttrState); err != nil {
		t.Fatal(err)
	}
	expectEvent(t, c.dev, EventSQDrained, c.qp)
}

func expectEvent(t *testing.T, d *Device, typ EventType, qp *QP) AsyncEvent {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-d.Events():
			if ev.Type == typ && ev.QP == qp {
				return ev
			}
			t.Logf("skipping event %v", ev)
		case <-deadline:
			t.Fatalf("no %v event for qp %#x", typ, qp.QPN())
			return AsyncEvent{}
		}
	}
}

// TestCompChannel: an armed CQ is delivered once on its channel; with
// solicited-only arming an unsolicited SEND does not fire and a solicited
// one does; one goroutine selects over two CQs.
func TestCompChannel(t *testing.T) {
	a, r, _ := newPair(t, pairOpts{})
	ch, err := r.dev.CreateCompChannel(2)
	if err != nil {
		t.Fatal(err)
	}
	// r's QP delivers into its own CQs; make two channel CQs on r and a
	// second QP pair that uses them is more than needed: arm the
	// existing receive CQ through a fresh side instead.
	cq1, err := r.dev.CreateCQWith(CQAttr{Depth: 16, Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.scq.ReqNotify(false); err == nil {
		t.Error("ReqNotify on a CQ without a channel succeeded")
	}
	qp, err := r.dev.CreateQP(r.pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq1, RecvCQ: cq1, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	// A second A-side QP talks to qp.
	aq, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: a.scq, RecvCQ: a.rcq, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := aq.Connect(ConnParams{Peer: addrB, DestQPN: qp.QPN(), RQPSN: 7, SQPSN: 9}); err != nil {
		t.Fatal(err)
	}
	if err := qp.Connect(ConnParams{Peer: addrA, DestQPN: aq.QPN(), RQPSN: 9, SQPSN: 7}); err != nil {
		t.Fatal(err)
	}
	_, smr := a.buffer(t, 8, 0)
	_, rmr := r.buffer(t, 64, 0)
	for i := 0; i < 3; i++ {
		if err := qp.PostRecv(RecvWR{WRID: uint64(i), SGEs: sge(rmr, 8*i, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(flags SendFlags) {
		t.Helper()
		if err := aq.PostSend(SendWR{Opcode: WRSend, Flags: flags, SGEs: sge(smr, 0, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	// Armed for any completion.
	if err := cq1.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	send(0)
	select {
	case got := <-ch.C():
		if got != cq1 {
			t.Fatalf("channel delivered %p, want cq1", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no channel event for an armed CQ")
	}
	waitWC(t, cq1, 1, 5*time.Second)
	// Solicited only: an unsolicited SEND does not fire.
	if err := cq1.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	send(0)
	waitWC(t, cq1, 1, 5*time.Second)
	select {
	case <-ch.C():
		t.Fatal("solicited-only CQ fired for an unsolicited SEND")
	default:
	}
	send(SendSolicited)
	select {
	case <-ch.C():
	case <-time.After(5 * time.Second):
		t.Fatal("no channel event for a solicited SEND")
	}
	// One event per arming: nothing more without ReqNotify.
	waitWC(t, cq1, 1, 5*time.Second)
	select {
	case <-ch.C():
		t.Fatal("a second event without re-arming")
	default:
	}
}

// TestCQRingGrows: a CQ's ring starts small and doubles as completions
// pile up, up to the depth asked for; completions come out in order
// across growth with a wrapped ring, the CQ holds exactly its depth and
// overflows at one more.
func TestCQRingGrows(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	const depth = 40
	cq, err := a.dev.CreateCQ(depth)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(cq.ring); got != cqRingStart {
		t.Fatalf("new CQ of depth %d: ring of %d, want %d", depth, got, cqRingStart)
	}
	if cq.Depth() != depth {
		t.Fatalf("Depth() = %d, want %d", cq.Depth(), depth)
	}
	next, want := uint64(0), uint64(0)
	put := func(k int) {
		t.Helper()
		for range k {
			if ok, _ := cq.store(&WC{WRID: next}, false); !ok {
				t.Fatalf("store of wr %d refused with %d stored (depth %d): %v", next, cq.n, depth, cq.Err())
			}
			next++
		}
	}
	get := func(k int) {
		t.Helper()
		wc := make([]WC, k)
		if n := cq.Poll(wc); n != k {
			t.Fatalf("polled %d, want %d", n, k)
		}
		for _, w := range wc {
			if w.WRID != want {
				t.Fatalf("polled wr %d, want %d", w.WRID, want)
			}
			want++
		}
	}
	put(10)
	get(7)  // head moves on: the next stores wrap around
	put(13) // 16 stored, ring full but not grown yet
	if len(cq.ring) != cqRingStart {
		t.Fatalf("ring of %d with %d stored, want %d", len(cq.ring), cq.n, cqRingStart)
	}
	put(1) // grows to 32, unwrapping
	if len(cq.ring) != 32 {
		t.Fatalf("ring of %d after growing, want 32", len(cq.ring))
	}
	get(5)
	put(depth - cq.n) // full to its depth: the ring is capped at 40
	if len(cq.ring) != depth || cq.n != depth || cq.Err() != nil {
		t.Fatalf("ring %d, stored %d, err %v; want %d, %d, nil", len(cq.ring), cq.n, cq.Err(), depth, depth)
	}
	if ok, _ := cq.store(&WC{WRID: next}, false); ok || !errors.Is(cq.Err(), ErrCQOverflow) {
		t.Fatalf("store beyond depth: ok %v, err %v; want an overflow", ok, cq.Err())
	}
	get(depth)
}

// TestRecvCQOverflowNotAcked: the receiver's recv CQ holds one completion
// and is not polled; two SENDs arrive. The first is completed and ACKed;
// the second's completion does not fit, so the responder does not ACK it
// and its QP goes to ERR, as rxe's do_complete does (no ACK after a failed
// rxe_cq_post). The sender's second SEND does not complete with SUCCESS
// (here: retry exceeded, the receiver being in ERR). Before, the second
// SEND was ACKed and the sender saw SUCCESS for a message whose receive
// completion was lost.
func TestRecvCQOverflowNotAcked(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	oa := pairOpts{timeout: 10}
	oa.defaults()
	ob := pairOpts{timeout: 10, cqDepth: 1}
	ob.defaults()
	a := newSide(t, n, addrA, &oa)
	b := newSide(t, n, addrB, &ob)
	connect(t, a, b, addrB, 100, 200, &oa)
	connect(t, b, a, addrA, 200, 100, &ob)
	_, smr := a.buffer(t, 64, 0)
	_, rmr := b.buffer(t, 128, 0)
	for i := range 2 {
		if err := b.qp.PostRecv(RecvWR{WRID: uint64(100 + i), SGEs: sge(rmr, 64*i, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(1 + i), Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	wcs := waitWC(t, a.scq, 2, 10*time.Second)
	if wcs[0].WRID != 1 || wcs[0].Status != WCSuccess {
		t.Fatalf("first SEND: %+v", wcs[0])
	}
	if wcs[1].WRID != 2 || wcs[1].Status == WCSuccess {
		t.Fatalf("second SEND, whose receive completion was lost to the full CQ: %+v, want an error", wcs[1])
	}
	if st := b.qp.State(); st != QPSErr {
		t.Fatalf("receiver state %v after its recv CQ overflowed", st)
	}
	if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.WRID != 100 || wc.Status != WCSuccess {
		t.Fatalf("receiver's stored completion %+v", wc)
	}
}

// TestZeroQueueDepths: max_send_wr 0 and max_recv_wr 0 are accepted, as in
// verbs and rxe (a QP with no receive queue is a WRITE/READ-only
// requester; one with no send queue only responds). Posting to the
// missing queue fails at once with ErrQueueFull naming the field
// (PostRecv, PostSend, PostSendContext, WaitSendRoom, BindMW), nothing
// indexes a zero-size ring, and a keep-alive probe still goes out. Before,
// CreateQP refused both.
func TestZeroQueueDepths(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	a := newSide(t, n, addrA, &o)
	b := newSide(t, n, addrB, &o)
	qa, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: a.scq, RecvCQ: a.rcq, MaxSendWR: 8, MaxRecvWR: 0})
	if err != nil {
		t.Fatalf("max_recv_wr 0: %v", err)
	}
	qb, err := b.dev.CreateQP(b.pd, QPInitAttr{Type: QPTypeRC, SendCQ: b.scq, RecvCQ: b.rcq, MaxSendWR: 0, MaxRecvWR: 4})
	if err != nil {
		t.Fatalf("max_send_wr 0: %v", err)
	}
	if _, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: a.scq, RecvCQ: a.rcq, MaxSendWR: -1}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "max_send_wr") {
		t.Fatalf("max_send_wr -1: %v", err)
	}
	sa := &side{dev: a.dev, pd: a.pd, scq: a.scq, rcq: a.rcq, qp: qa}
	sb := &side{dev: b.dev, pd: b.pd, scq: b.scq, rcq: b.rcq, qp: qb}
	connect(t, sa, sb, addrB, 100, 200, &o)
	connect(t, sb, sa, addrA, 200, 100, &o)
	src, smr := a.buffer(t, 4096, 0)
	fill(src, 9)
	dst, dmr := b.buffer(t, 4096, memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessMWBind)
	// The requester without a receive queue WRITEs, READs and SENDs.
	if err := qa.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 4096), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || !bytes.Equal(dst, src) {
		t.Fatalf("WRITE from a QP without a receive queue: %+v", wc)
	}
	if err := qa.PostSend(SendWR{WRID: 2, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA() + 64, RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("READ: %+v", wc)
	}
	if err := qb.PostRecv(RecvWR{WRID: 7, SGEs: sge(dmr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	if err := qa.PostSend(SendWR{WRID: 3, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, 1, 5*time.Second)
	if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != 7 {
		t.Fatalf("SEND to a QP without a send queue: %+v", wc)
	}
	// Posting to the missing queues.
	queueFull := func(what string, err error, field string) {
		t.Helper()
		if !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), field+" 0") {
			t.Fatalf("%s: %v, want ErrQueueFull naming %s 0", what, err, field)
		}
	}
	queueFull("PostRecv", qa.PostRecv(RecvWR{WRID: 8, SGEs: sge(smr, 0, 8)}), "max_recv_wr")
	queueFull("PostSend", qb.PostSend(SendWR{WRID: 9, Opcode: WRSend, SGEs: sge(dmr, 0, 8)}), "max_send_wr")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	queueFull("PostSendContext", qb.PostSendContext(ctx, SendWR{WRID: 10, Opcode: WRSend}), "max_send_wr")
	queueFull("WaitSendRoom", qb.WaitSendRoom(ctx), "max_send_wr")
	mw, _ := b.pd.AllocMW(memreg.MWType1)
	_, err = qb.BindMW(11, mw, MWBindInfo{MR: dmr, Addr: dmr.IOVA(), Length: 8, Access: memreg.AccessRemoteRead}, SendSignaled)
	queueFull("BindMW", err, "max_send_wr")
	if mw.Bound() {
		t.Fatal("window bound by a refused BindMW")
	}
	// A keep-alive probe needs no send-queue slot.
	if err := qb.Probe(); err != nil {
		t.Fatalf("Probe on a QP with max_send_wr 0: %v", err)
	}
	eventually(t, "the probe's ACK", func() bool { return qb.State() == QPSRTS && b.dev.Counters().KeepAliveProbes == 1 })
	noWC(t, b.scq)
	if ctx.Err() != nil {
		t.Fatal("a post to a missing queue waited")
	}
}
