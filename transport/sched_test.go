package transport

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// wireLink is a Link whose Send puts copies of the packets on a wire of
// a fixed rate (one packet per per, in FIFO order) in front of the
// wrapped link, as a NIC port of that rate with a deep queue would: a
// sender that hands it many packets at once sees them leave one by one.
type wireLink struct {
	udp.Wrap
	per time.Duration

	mu     sync.Mutex
	q      [][]byte
	dst    []udp.Packet
	closed bool
	kick   chan struct{}
	done   chan struct{}
}

func newWireLink(l udp.Link, per time.Duration) *wireLink {
	w := &wireLink{Wrap: udp.Wrap{Link: l}, per: per, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *wireLink) Send(pkts []udp.Packet) error {
	w.mu.Lock()
	for i := range pkts {
		w.q = append(w.q, pkts[i].AppendWire(nil))
		w.dst = append(w.dst, udp.Packet{Addr: pkts[i].Addr, SrcPort: pkts[i].SrcPort, TOS: pkts[i].TOS})
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return nil
}

// run delivers the queued packets at the wire's rate, checking every
// 500 µs how many the elapsed time allows (sleeps are not precise
// enough to pace one packet at a time).
func (w *wireLink) run() {
	defer close(w.done)
	var start time.Time // of the current busy period
	sent := 0           // packets delivered in it
	var batch []udp.Packet
	for {
		w.mu.Lock()
		closed, n := w.closed, len(w.q)
		w.mu.Unlock()
		if closed {
			return
		}
		if n == 0 {
			start = time.Time{}
			<-w.kick
			continue
		}
		if start.IsZero() {
			start, sent = time.Now(), 0
		}
		allowed := int(time.Since(start)/w.per) - sent
		if allowed <= 0 {
			time.Sleep(500 * time.Microsecond)
			continue
		}
		w.mu.Lock()
		k := min(allowed, len(w.q))
		batch = batch[:0]
		for i := 0; i < k; i++ {
			p := w.dst[i]
			p.Buf = w.q[i]
			batch = append(batch, p)
		}
		w.q = append(w.q[:0], w.q[k:]...)
		w.dst = append(w.dst[:0], w.dst[k:]...)
		w.mu.Unlock()
		w.Link.Send(batch)
		sent += k
	}
}

func (w *wireLink) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	<-w.done
	return w.Link.Close()
}

// schedRig is n RC QP pairs from a device behind a wireLink (none for
// per 0) to a device on the plain in-memory network, on the wall clock.
type schedRig struct {
	net    *memnet.MemNetwork
	a, b   *Device
	qa, qb []*QP
	cq     *CQ
	mr     *memreg.MR
	dst    *memreg.MR
}

func newSchedRig(t *testing.T, n int, cfg DeviceConfig, per time.Duration, timeout uint8) *schedRig {
	return newSchedRigFaults(t, n, cfg, per, timeout, memnet.Faults{})
}

// newSchedRigFaults is newSchedRig on a network with faults f.
func newSchedRigFaults(t *testing.T, n int, cfg DeviceConfig, per time.Duration, timeout uint8, f memnet.Faults) *schedRig {
	t.Helper()
	net := memnet.NewMemNetwork(f)
	la, err := net.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := net.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxQP = n + 16
	var link udp.Link = la
	if per > 0 {
		link = newWireLink(la, per)
	}
	a, err := NewDevice(link, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := NewDevice(lb, DeviceConfig{MaxQP: n + 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r := &schedRig{net: net, a: a, b: b}
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	if r.cq, err = a.CreateCQ(2*n + 16); err != nil {
		t.Fatal(err)
	}
	cqb, err := b.CreateCQ(2*n + 16)
	if err != nil {
		t.Fatal(err)
	}
	if r.mr, err = pda.RegisterMR(make([]byte, 4096), memreg.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if r.dst, err = pdb.RegisterMR(make([]byte, 4096), memreg.AccessLocalWrite|memreg.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	for range n {
		qa, err := a.CreateQP(pda, QPInitAttr{Type: QPTypeRC, SendCQ: r.cq, RecvCQ: r.cq, MaxSendWR: 4, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		qb, err := b.CreateQP(pdb, QPInitAttr{Type: QPTypeRC, SendCQ: cqb, RecvCQ: cqb, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		retry := Retry{Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}
		if err := qa.Connect(ConnParams{Peer: addrB, DestQPN: qb.QPN(), PathMTU: MTU1024, Retry: &retry}); err != nil {
			t.Fatal(err)
		}
		if err := qb.Connect(ConnParams{Peer: addrA, DestQPN: qa.QPN(), PathMTU: MTU1024, Retry: &retry, Access: memreg.AccessRemoteWrite}); err != nil {
			t.Fatal(err)
		}
		r.qa = append(r.qa, qa)
		r.qb = append(r.qb, qb)
	}
	return r
}

// post posts one 1 KiB WRITE (one packet) on QP i.
func (r *schedRig) post(t *testing.T, i int) {
	t.Helper()
	if err := r.qa[i].PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled,
		SGEs: sge(r.mr, 0, 1024), RemoteAddr: r.dst.IOVA(), RKey: r.dst.RKey()}); err != nil {
		t.Fatal(err)
	}
}

// collect waits for completions until want have come or d passed, adds
// them per QP to per (reposting on the QP while repost is before its
// deadline) and returns how many came.
func (r *schedRig) collect(t *testing.T, want int, d time.Duration, per []int, repost time.Time) int {
	t.Helper()
	wcs := make([]WC, 256)
	got := 0
	end := time.Now().Add(d)
	for got < want && time.Now().Before(end) {
		k := r.cq.Poll(wcs)
		if k == 0 {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		for _, wc := range wcs[:k] {
			if wc.Status != WCSuccess {
				t.Fatalf("WRITE on QP %d: %v", wc.WRID, wc.Status)
			}
			got++
			per[wc.WRID]++
			if time.Now().Before(repost) {
				r.post(t, int(wc.WRID))
				want++
			}
		}
	}
	return got
}

// TestSchedNoTimeoutWhileWaiting: 600 QPs post a WRITE each at once into
// a 1,250-packet/s wire with a 268 ms ACK timeout (the wire needs 480 ms
// for them all; under -race 150 QPs, 625 packets/s, 32 packets in flight
// and 134 ms, as before, timing unchecked). With the send
// scheduler (the default on the wall clock), a QP's packet waits for its
// turn on this device — where no ACK timer runs — and leaves when little
// is in flight (16 packets, 12.8 ms of wire): no timer expires (but for
// expiries the stack finds late, this process not having run for a
// whole timeout on a loaded machine), nothing else is resent; then,
// every QP keeping one WRITE outstanding for 1.5 s, no QP falls behind
// another by more than two WRITEs. Without the scheduler (SchedQPs -1,
// as before it existed) every packet's timer starts as it is posted and
// the last ones expire in the wire's queue: the control case must see
// resends (genuine timeouts on an idle machine, which the scheduled case
// may not have), or the test proves nothing. (Before: a 2,500-packet/s
// wire, 32 packets in flight, a 134 ms timeout; it failed once in a full
// transport run at load 7-8. The timeout is now twice as long against
// the same 12.8 ms in flight: a stall of this process must be twice as
// long to delay an ACK past it without the stack judging the expiry
// late. The time in flight stays under the scheduler's staleness bound,
// 20 ms: a window longer than that is released as stale while the ACK
// delay average adapts, and the queue grows.)
func TestSchedNoTimeoutWhileWaiting(t *testing.T) {
	n, per, busy := 600, 800*time.Microsecond, 1500*time.Millisecond // 1,250 packets/s
	timeout, inflight := uint8(16), 16                               // 268 ms; 12.8 ms of wire
	if raceEnabled {
		// Everything runs several times slower: a slower wire, as many
		// packets per timeout.
		n, per, busy, timeout, inflight = 150, 1600*time.Microsecond, 1500*time.Millisecond, 15, 32
	}
	for _, tc := range []struct {
		name  string
		cfg   DeviceConfig
		sched bool
		slow  bool // 150 QPs, 6 ms per packet: 96 ms in flight
	}{
		{"scheduler", DeviceConfig{SchedQPs: 16, SchedInflight: inflight}, true, false},
		{"direct", DeviceConfig{SchedQPs: -1}, false, false},
		{"slow-link", DeviceConfig{SchedQPs: 16, SchedInflight: 16}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, per := n, per
			if tc.slow {
				// Each packet longer than the 5 ms stall and the budget
				// (96 ms) longer than the 20 ms stale limit: before, the
				// budget's QPs all went stale, every gap between two ACKs
				// forced a turn, the link's queue grew and 42 of the 150
				// WRITEs timed out in it (98-142 with a 268 ms timeout;
				// TestSchedStaleNeedsOvertaking,
				// TestSchedForcedTurnOnlyWhenNothingFreed).
				// A 537 ms ACK timeout: 441 ms of margin over the 96 ms
				// the budget holds, for a loaded machine.
				n, per = 150, 6*time.Millisecond
			}
			timeout := timeout
			if tc.slow {
				timeout = 17
			}
			r := newSchedRig(t, n, tc.cfg, per, timeout)
			perQP := make([]int, n)
			for i := range n {
				r.post(t, i)
			}
			if got := r.collect(t, n, 10*time.Second, perQP, time.Time{}); got != n {
				t.Fatalf("%d of %d WRITEs completed", got, n)
			}
			c := r.a.Counters()
			t.Logf("all at once: retransmitted %d, local_ack_timeout %d, ack_timeout_late %d", c.RetransmittedPkts, c.LocalAckTimeout, c.AckTimeoutLate)
			if !tc.sched {
				// Genuine timeouts (local_ack_timeout) here, ~260 of the
				// 600 on an idle machine; on a slow one (-race) the stack
				// may judge them all late. Either way timers expired on
				// packets the wire still held.
				if c.RetransmittedPkts == 0 {
					t.Fatalf("no resend without the scheduler: the wire did not hold the packets past their timeout, the test shows nothing")
				}
				return
			}
			if raceEnabled {
				// See the busy phase below: timing is not checked under
				// -race (it failed 1 run in 3 there on a loaded machine).
				t.Logf("-race: timeouts are not checked")
			} else {
				schedNoTimeout(t, c, "all at once")
			}
			// All busy at once: one WRITE outstanding per QP for 1.5 s.
			clear(perQP)
			for i := range n {
				r.post(t, i)
			}
			got := r.collect(t, n, 10*time.Second, perQP, time.Now().Add(busy))
			lo, hi := perQP[0], perQP[0]
			for _, v := range perQP {
				lo, hi = min(lo, v), max(hi, v)
			}
			c = r.a.Counters()
			t.Logf("busy: %d WRITEs, per QP %d..%d, retransmitted %d, local_ack_timeout %d, ack_timeout_late %d, sched_stale_qps %d, sched_forced_turns %d",
				got, lo, hi, c.RetransmittedPkts, c.LocalAckTimeout, c.AckTimeoutLate, c.SchedStaleQPs, c.SchedForcedTurns)
			// Checked again (it was only logged while 1 run in ~8 had
			// one inflight window of genuine timeouts here: the receive
			// driver's lost timer, fixed with TestLeaveAfterDeepEntryRace;
			// 0 in 38 runs since, 30 of them beside a CPU hog).
			if !raceEnabled {
				schedNoTimeout(t, c, "busy")
			}
			if lo < 1 || hi > lo+2 {
				t.Fatalf("per-QP WRITEs %d..%d: the round-robin let some QPs fall behind", lo, hi)
			}
		})
	}
}

// schedNoTimeout fails t if a QP's ACK timer expired for the peer's
// silence (local_ack_timeout) or a packet was resent for any other
// reason than an expiry the stack itself judged late (ack_timeout_late:
// this process was not scheduled for a whole timeout, as happens on a
// loaded CI machine; that resend costs no retry and says nothing of the
// scheduler).
func schedNoTimeout(t *testing.T, c Counters, phase string) {
	t.Helper()
	if c.LocalAckTimeout != 0 || c.RetransmittedPkts > c.AckTimeoutLate {
		t.Fatalf("%s: %d local ACK timeouts, %d packets resent (%d after late expiries): a QP timed out while it waited its turn",
			phase, c.LocalAckTimeout, c.RetransmittedPkts, c.AckTimeoutLate)
	}
}

// TestSchedAllocs: the scheduled path allocates nothing in steady state:
// 200 QPs, every request through the scheduler (SchedQPs 1), a WRITE
// posted on each and all 200 completions awaited, again and again.
func TestSchedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const n = 200
	r := newSchedRig(t, n, DeviceConfig{SchedQPs: 1}, 0, 14)
	wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(r.mr, 0, 1024), RemoteAddr: r.dst.IOVA(), RKey: r.dst.RKey()}
	wcs := make([]WC, n)
	ctx := context.Background()
	round := func() {
		for i := range n {
			wr.WRID = uint64(i)
			if err := r.qa[i].PostSend(wr); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < n; {
			k, err := r.cq.Wait(ctx, wcs)
			if err != nil {
				t.Fatal(err)
			}
			for _, wc := range wcs[:k] {
				if wc.Status != WCSuccess {
					t.Fatalf("WRITE on QP %d: %v", wc.WRID, wc.Status)
				}
			}
			got += k
		}
	}
	for range 20 {
		round()
	}
	if r.a.sched.queued.Load() != 0 || !r.a.sched.started.Load() {
		t.Fatalf("the scheduler did not run (started %v)", r.a.sched.started.Load())
	}
	allocs := testing.AllocsPerRun(20, round) / n
	t.Logf("allocations per scheduled WRITE: %.3f", allocs)
	if allocs > 0.05 {
		t.Errorf("%.3f allocations per scheduled WRITE in steady state, want ~0", allocs)
	}
}

// TestSchedRecovery: with every request going through the scheduler
// (SchedQPs 1), a lossy network (5 % of packets lost each way) still
// completes every WRITE of 100 QPs successfully and in order per QP:
// resends after an ACK timeout or a NAK wait for the QP's turn and go
// out; no QP exhausts its retries (retry_cnt 7, a 4 ms timeout).
func TestSchedRecovery(t *testing.T) {
	const n, m = 100, 20
	r := newSchedRigFaults(t, n, DeviceConfig{SchedQPs: 1}, 0, 10, memnet.Faults{Loss: 0.05, Seed: 7})
	next := make([]uint64, n) // the next WRID each QP must complete
	for i := range n {
		for k := range 2 { // two outstanding per QP: the CQ holds 2n+16
			if err := r.qa[i].PostSend(SendWR{WRID: uint64(k), Opcode: WRWrite, Flags: SendSignaled,
				SGEs: sge(r.mr, 0, 1024), RemoteAddr: r.dst.IOVA(), RKey: r.dst.RKey()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	byQPN := make(map[uint32]int, n)
	for i, qp := range r.qa {
		byQPN[qp.QPN()] = i
	}
	wcs := make([]WC, 256)
	done := 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for done < n*m {
		k, err := r.cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatalf("%d of %d WRITEs done: %v", done, n*m, err)
		}
		for _, wc := range wcs[:k] {
			i := byQPN[wc.QPN]
			if wc.Status != WCSuccess || wc.WRID != next[i] {
				t.Fatalf("QP %d: completion %d %v, want %d success", i, wc.WRID, wc.Status, next[i])
			}
			next[i]++
			done++
			if w := next[i] + 1; w < m {
				if err := r.qa[i].PostSend(SendWR{WRID: w, Opcode: WRWrite, Flags: SendSignaled,
					SGEs: sge(r.mr, 0, 1024), RemoteAddr: r.dst.IOVA(), RKey: r.dst.RKey()}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	c := r.a.Counters()
	t.Logf("retransmitted %d, local_ack_timeout %d, seq NAKs %d", c.RetransmittedPkts, c.LocalAckTimeout, c.RcvdSeqErr)
	if c.RetransmittedPkts == 0 {
		t.Fatal("nothing resent on a lossy network: the test shows nothing")
	}
	if !r.a.sched.started.Load() {
		t.Fatal("the scheduler never ran")
	}
	checkHolders(t, r.a) // many shares taken and dropped, under loss

}

// TestSchedLongMessages: 100 QPs post one 256 KiB WRITE each at once at
// MTU 1024 (256 packets a message, four scheduler turns of 64 KiB), every
// request through the scheduler, whose inflight budget (256 packets)
// holds one QP's whole message. The last packet of each turn asks for an
// ACK, so the budget drains as the peer takes the packets and no timer
// expires; when only a message's last packet asked for one, the budget
// filled with the first turns of QPs that no responder had a reason to
// acknowledge, and the scheduler waited for their ACK timeouts (a user's
// program with 100 QPs, one 64 KiB WRITE each at MTU 1024 when a turn was
// 16 packets whatever the MTU, moved 8 MB/s).
func TestSchedLongMessages(t *testing.T) {
	// MaxPktsPerAck above the message: only the turns' ends and a full
	// window ask for ACKs before a message's last packet (its default,
	// 64, is a turn at MTU 1024 and half the window, and would hide a
	// turn or a window that does not).
	for _, tc := range []struct {
		name string
		n    int
		cfg  DeviceConfig
	}{
		{"scheduled", 100, DeviceConfig{SchedQPs: 1, MaxPktsPerAck: 1024}},
		// Without the scheduler a QP sends until its window (128
		// packets) is full: the packet that fills it asks for an ACK.
		{"direct-window", 4, DeviceConfig{SchedQPs: -1, MaxPktsPerAck: 1024}},
	} {
		t.Run(tc.name, func(t *testing.T) { testSchedLongMessages(t, tc.n, tc.cfg) })
	}
}

func testSchedLongMessages(t *testing.T, n int, cfg DeviceConfig) {
	r := newSchedRig(t, n, cfg, 0, 14) // 67 ms ACK timeout
	pda, pdb := r.qa[0].PD(), r.qb[0].PD()
	const size = 256 << 10
	src, err := pda.RegisterMR(make([]byte, size), memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := pdb.RegisterMR(make([]byte, size), memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := r.qa[i].PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled,
			SGEs: sge(src, 0, size), RemoteAddr: dst.IOVA(), RKey: dst.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	perQP := make([]int, n)
	if got := r.collect(t, n, 20*time.Second, perQP, time.Time{}); got != n {
		t.Fatalf("%d of %d WRITEs completed", got, n)
	}
	c := r.a.Counters()
	t.Logf("retransmitted %d, local_ack_timeout %d, ack_timeout_late %d, sent %d, rcvd %d",
		c.RetransmittedPkts, c.LocalAckTimeout, c.AckTimeoutLate, c.SentPkts, c.RcvdPkts)
	if c.SentPkts < uint64(n*size/1024) {
		t.Fatalf("%d packets sent for %d WRITEs of %d packets", c.SentPkts, n, size/1024)
	}
	if !raceEnabled {
		schedNoTimeout(t, c, "256 KiB WRITEs at MTU 1024")
	}
}

// TestSchedTurnQuantum: in a scheduler turn the requester builds at most
// the turn's quantum of packets and asks for another turn (schedMore),
// though requester.progress asks the scheduler only once per call outside
// a turn; outside a turn, on a device that does not defer, one call sends
// the rest.
func TestSchedTurnQuantum(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{mtu: MTU1024})
	const size = 100 << 10 // 100 packets
	_, smr := a.buffer(t, size, 0)
	_, dmr := b.buffer(t, size, memreg.AccessRemoteWrite)
	qp := a.qp
	qp.mu.Lock()
	qp.schedTurn, qp.schedLeft = true, 0 // a turn with its quantum spent
	qp.mu.Unlock()
	if err := qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, size),
		RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	psn0 := qp.req.psn
	qp.schedLeft, qp.schedMore = 10, false
	qp.req.progress()
	built, more := qp.req.psn.Diff(psn0), qp.schedMore
	qp.schedTurn, qp.schedMore = false, false
	qp.req.progress()
	rest := qp.req.psn.Diff(psn0) - built
	qp.flushOut()
	qp.mu.Unlock()
	if built != 10 || !more {
		t.Fatalf("a turn of quantum 10 built %d packets (schedMore %v)", built, more)
	}
	if rest != 90 {
		t.Fatalf("outside a turn: %d more packets, want 90", rest)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second); wc[0].Status != WCSuccess {
		t.Fatalf("WRITE: %v", wc[0].Status)
	}
}
