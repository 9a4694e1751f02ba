package transport

import (
	"bytes"
	"fmt"
	"net/netip"
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

// TestSchedReadResponseNotHeldByBudget: the quanta of a long READ
// response are not held back by the device's request budget
// (SchedInflight). READ responses are never acknowledged and are not
// unacknowledged packets of the device, yet the scheduler stopped serving
// its ring while its own requests filled the budget, READ responses
// included: a device whose WRITEs were unacknowledged stopped answering
// its peer's READ (a quantum per forced turn, one every 5 ms, once
// sched_forced_turns gave up waiting for an ACK), so that between two
// devices that both READ and WRITE each direction waited on the other's.
//
// Device a (ManualClock: no timer fires and no QP turns stale; requests
// through the scheduler, a budget of 64 packets, 16 per QP) has five QPs
// with a 32-packet WRITE each to an address where nobody answers: the
// budget is full and stays full. b READs 1 MiB (1,024 responses, 16
// quanta) from a: it must complete, with the right data, while a's budget
// is still full, without a single forced turn.
func TestSchedReadResponseNotHeldByBudget(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	o := pairOpts{clock: clk, timeout: 14}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	la, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	adev, err := NewDevice(la, DeviceConfig{Clock: clk, SchedQPs: 1, SchedInflight: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adev.Close() })
	apd, err := adev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	a := &side{dev: adev, pd: apd}
	a = qpOn(t, a)
	b := newSide(t, n, addrB, &o)
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)

	// Fill a's budget with WRITEs nobody acknowledges.
	silent := netip.MustParseAddr("192.0.2.3")
	_, wmr := a.buffer(t, 32<<10, 0)
	for k := 0; k < 5; k++ {
		w := qpOn(t, a)
		if err := w.qp.Connect(ConnParams{Peer: silent, DestQPN: 0x300 + uint32(k), SQPSN: 0x40, PathMTU: MTU1024,
			Retry: &Retry{Timeout: 14, RetryCnt: 7}}); err != nil {
			t.Fatal(err)
		}
		if err := w.qp.PostSend(SendWR{Opcode: WRWrite, SGEs: sge(wmr, 0, 32<<10), RemoteAddr: 0x1000, RKey: 1}); err != nil {
			t.Fatal(err)
		}
	}
	s := &adev.sched
	for deadline := time.Now().Add(10 * time.Second); s.inflight.Load() < s.maxInflight || s.queued.Load() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("a's budget: %d of %d, %d QPs queued; want it full, none queued", s.inflight.Load(), s.maxInflight, s.queued.Load())
		}
		time.Sleep(time.Millisecond)
	}
	forced := adev.Counters().SchedForcedTurns

	const size = 1 << 20
	src, smr := a.buffer(t, size, memreg.AccessRemoteRead)
	fill(src, 21)
	dst, dmr := b.buffer(t, size, 0)
	if err := b.qp.PostSend(SendWR{WRID: 7, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.scq, 1, 20*time.Second); wc[0].Status != WCSuccess || wc[0].WRID != 7 {
		t.Fatalf("READ: %+v", wc[0])
	}
	if !bytes.Equal(dst, src) {
		t.Error("the READ's data differs")
	}
	c := adev.Counters()
	t.Logf("a: budget %d of %d; sched_forced_turns %d (%d before the READ), sched_full_ns %d", s.inflight.Load(), s.maxInflight, c.SchedForcedTurns, forced, c.SchedFullNs)
	if s.inflight.Load() < s.maxInflight {
		t.Fatalf("a's budget is no longer full (%d of %d): the test proves nothing", s.inflight.Load(), s.maxInflight)
	}
	if d := c.SchedForcedTurns - forced; d != 0 {
		t.Errorf("a answered the READ in %d forced turns: its READ responses waited for its own requests' ACKs", d)
	}
}

// TestSchedBothRolesOrder pins down the order of a QP's packets when both
// its roles go through the scheduler at once: b answers a 1 MiB READ from
// a (responder turns) while it sends 64 WRITEs of 16 KiB to a on the same
// QP (requester turns, every request through the scheduler), so that the
// QP often has a turn of each kind in one batch, and a turn fills its
// output queue and sends it on the spot (outSlot). Each of b's two PSN
// sequences to a — its requests, its responses — must leave in order
// (no loss, a ManualClock: nothing is ever resent), and everything
// completes with the right data.
//
// Why it holds: every packet of a QP is built under its lock into its
// output queue; the scheduler keeps the lock of every QP of its batch
// until the batch is sent and takes a QP's packets out only then (flush),
// after the QP's last turn in it; a received batch takes out responses
// only (and the scheduler's responder turn waits for those: respMu); a
// direct send (an ACK timer, a PostSend, HandlePacket, a full output
// queue) sends the whole queue, in order, under the lock.
func TestSchedBothRolesOrder(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	o := pairOpts{clock: clk, mtu: MTU4096}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newSide(t, n, addrA, &o)
	lb, err := n.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	tap := &roleOrderLink{Wrap: udp.Wrap{Link: lb}}
	bdev, err := NewDevice(tap, DeviceConfig{Clock: clk, SchedQPs: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bdev.Close() })
	bpd, err := bdev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	b := qpOn(t, &side{dev: bdev, pd: bpd})
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	tap.dqpn.Store(a.qp.QPN())

	const size, wsize, nw = 1 << 20, 9 << 10, 60
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	fill(src, 31)
	dst, dmr := a.buffer(t, size, 0)
	wsrc, wmr := b.buffer(t, wsize, 0)
	fill(wsrc, 32)
	wdst, wdmr := a.buffer(t, nw*wsize, memreg.AccessRemoteWrite)
	for i := 0; i < nw; i++ {
		if err := b.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(wmr, 0, wsize), RemoteAddr: wdmr.IOVA() + uint64(i*wsize), RKey: wdmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 20*time.Second); wc[0].Status != WCSuccess {
		t.Fatalf("READ: %+v", wc[0])
	}
	for i, wc := range waitWC(t, b.scq, nw, 20*time.Second) {
		if wc.Status != WCSuccess || wc.WRID != uint64(i) {
			t.Fatalf("WRITE %d: %+v", i, wc)
		}
	}
	if !bytes.Equal(dst, src) {
		t.Error("the READ's data differs")
	}
	for i := 0; i < nw; i++ {
		if !bytes.Equal(wdst[i*wsize:(i+1)*wsize], wsrc) {
			t.Fatalf("WRITE %d's data differs", i)
		}
	}
	tap.mu.Lock()
	defer tap.mu.Unlock()
	t.Logf("b sent %d requests and %d responses to a; %d Link.Sends carried both", tap.reqs, tap.resps, tap.mixed)
	if tap.bad != "" {
		t.Errorf("b sent %s", tap.bad)
	}
	if want := nw * npkts(wsize, 4096); tap.reqs != want || tap.resps != size/4096 {
		t.Errorf("b sent %d requests and %d responses, want %d and %d", tap.reqs, tap.resps, want, size/4096)
	}
}

// roleOrderLink checks that the packets sent to the QP dqpn leave in PSN
// order within each of the two sequences, requests and responses, and
// counts them.
type roleOrderLink struct {
	udp.Wrap
	dqpn               atomic.Uint32
	mu                 sync.Mutex
	last               [2]bth.PSN
	seen               [2]bool
	reqs, resps, mixed int
	bad                string
}

func (l *roleOrderLink) Send(pkts []udp.Packet) error {
	var p packet.Packet
	l.mu.Lock()
	var kinds [2]bool
	for _, up := range pkts {
		if p.Decode(up.Buf) != packet.FaultNone || p.BTH.DestQP() != l.dqpn.Load() {
			continue
		}
		k := 1
		if p.Info.Request {
			k = 0
			l.reqs++
		} else {
			l.resps++
		}
		kinds[k] = true
		// An ACK repeats the PSN of the response before it; a request
		// or a READ response never does.
		if d := p.BTH.PSN().Diff(l.last[k]); l.seen[k] && (d < 0 || d == 0 && p.Info.Kind != bth.KindAck) && l.bad == "" {
			l.bad = fmt.Sprintf("%v psn %v after psn %v", p.BTH.Opcode(), p.BTH.PSN(), l.last[k])
		}
		l.seen[k], l.last[k] = true, p.BTH.PSN()
	}
	if kinds[0] && kinds[1] {
		l.mixed++
	}
	l.mu.Unlock()
	return l.Link.Send(pkts)
}

// TestSchedRingsOneRoundRobin: the scheduler's two rings, requester
// turns and responder turns, are served as one round-robin, oldest entry
// first; while the request budget is full the responder turns go on and
// the requester turns wait (the budget reports the stall), and once it
// has room they follow in their order.
func TestSchedRingsOneRoundRobin(t *testing.T) {
	s := &txSched{maxInflight: 4, qpCap: 1}
	q := make([]*QP, 5)
	for i := range q {
		q[i] = &QP{qpn: uint32(10 + i)}
	}
	put := func(qp *QP, resp bool) {
		t.Helper()
		s.mu.Lock()
		_, ok := s.put(qp, resp)
		s.mu.Unlock()
		if !ok {
			t.Fatalf("qp %d (resp %v) not queued", qp.qpn, resp)
		}
	}
	type turn struct {
		qpn  uint32
		resp bool
	}
	next := func() (tt turn) {
		qp, resp := s.next()
		if qp == nil {
			return turn{}
		}
		// The turn's start: the QP may be queued again.
		if resp {
			qp.schedRespQueued = false
		} else {
			qp.schedQueued = false
		}
		return turn{qp.qpn, resp}
	}
	expect := func(what string, want ...turn) {
		t.Helper()
		var got []turn
		for tt := next(); tt != (turn{}); tt = next() {
			got = append(got, tt)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: turns %v, want %v", what, got, want)
		}
	}
	put(q[0], false)
	put(q[1], true)
	put(q[0], true) // both kinds: two entries
	put(q[2], false)
	put(q[3], true)
	s.mu.Lock()
	_, dup := s.put(q[2], false)
	s.mu.Unlock()
	if dup {
		t.Fatal("a QP queued twice for the same kind of turn")
	}
	if n := s.queued.Load(); n != 5 {
		t.Fatalf("queued %d, want 5", n)
	}
	expect("budget free", turn{10, false}, turn{11, true}, turn{10, true}, turn{12, false}, turn{13, true})

	put(q[0], false)
	put(q[1], true)
	put(q[2], false)
	put(q[3], true)
	s.inflight.Store(4)
	expect("budget full", turn{11, true}, turn{13, true})
	if !s.stalled.Load() {
		t.Error("the budget held requests back without reporting the stall")
	}
	if n := s.queued.Load(); n != 2 {
		t.Fatalf("queued %d, want the 2 requesters", n)
	}
	put(q[4], true)
	expect("budget still full", turn{14, true})
	s.inflight.Store(0)
	s.stalled.Store(false)
	put(q[4], true)
	expect("budget free again", turn{10, false}, turn{12, false}, turn{14, true})
}

// TestSchedStallExpiresDuringReadResponse: while READ responses keep the
// scheduler busy, a stall of the requests still ends after schedStall
// (the sweep, then a forced turn), not only once the responses are done.
// a's budget is full of WRITEs nobody acknowledges (ManualClock: they
// never turn stale), b READs 16 MiB from a (a's responses are counted and
// dropped, each Link.Send of them taking 500 µs: about 256 turns), and
// then a third QP of a posts a WRITE to b: it must complete while the
// READ's responses are still being sent, in a forced turn.
func TestSchedStallExpiresDuringReadResponse(t *testing.T) {
	clk := NewManualClock(time.Unix(1000, 0))
	o := pairOpts{clock: clk, timeout: 14}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	la, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	tap := &readRespLink{Wrap: udp.Wrap{Link: la}, drop: true, delay: 500 * time.Microsecond}
	adev, err := NewDevice(tap, DeviceConfig{Clock: clk, SchedQPs: 1, SchedInflight: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adev.Close() })
	apd, err := adev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	a := qpOn(t, &side{dev: adev, pd: apd})
	b := newSide(t, n, addrB, &o)
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	tap.dqpn.Store(b.qp.QPN())
	h, h2 := qpOn(t, a), qpOn(t, b)
	connect(t, h, h2, addrB, 0x100, 0x200, &o)
	connect(t, h2, h, addrA, 0x200, 0x100, &o)

	silent := netip.MustParseAddr("192.0.2.3")
	_, wmr := a.buffer(t, 32<<10, 0)
	for k := 0; k < 5; k++ {
		w := qpOn(t, a)
		if err := w.qp.Connect(ConnParams{Peer: silent, DestQPN: 0x300 + uint32(k), SQPSN: 0x40, PathMTU: MTU1024,
			Retry: &Retry{Timeout: 14, RetryCnt: 7}}); err != nil {
			t.Fatal(err)
		}
		if err := w.qp.PostSend(SendWR{Opcode: WRWrite, SGEs: sge(wmr, 0, 32<<10), RemoteAddr: 0x1000, RKey: 1}); err != nil {
			t.Fatal(err)
		}
	}
	s := &adev.sched
	for deadline := time.Now().Add(10 * time.Second); s.inflight.Load() < s.maxInflight || s.queued.Load() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("a's budget: %d of %d, %d QPs queued; want it full, none queued", s.inflight.Load(), s.maxInflight, s.queued.Load())
		}
		time.Sleep(time.Millisecond)
	}

	const size = 16 << 20
	total := int64(size / 1024)
	_, smr := a.buffer(t, size, memreg.AccessRemoteRead)
	_, dmr := b.buffer(t, size, 0)
	if err := b.qp.PostSend(SendWR{WRID: 7, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); tap.n.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("a sent no READ response")
		}
		time.Sleep(100 * time.Microsecond)
	}
	_, hmr := a.buffer(t, 64, 0)
	_, h2mr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	if err := h.qp.PostSend(SendWR{WRID: 9, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(hmr, 0, 64), RemoteAddr: h2mr.IOVA(), RKey: h2mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, h.scq, 1, 60*time.Second); wc[0].Status != WCSuccess {
		t.Fatalf("WRITE: %+v", wc[0])
	}
	sent := tap.n.Load()
	c := adev.Counters()
	t.Logf("the WRITE completed after %d of the READ's %d responses; sched_forced_turns %d", sent, total, c.SchedForcedTurns)
	if sent >= total {
		t.Errorf("the WRITE completed only after all %d READ responses were sent: the responder turns put off the stall's end", total)
	}
	if c.SchedForcedTurns == 0 {
		t.Error("no forced turn: the budget did not hold the WRITE, the test proves nothing")
	}
	for deadline := time.Now().Add(60 * time.Second); tap.n.Load() < total; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d READ responses sent", tap.n.Load(), total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	tap.check(t)
}
