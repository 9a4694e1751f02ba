package transport

import (
	"sync"
	"sync/atomic"
	"time"
)

// The device's send scheduler.
//
// A QP alone (a ping-pong, one stream) builds and sends its request
// packets in the goroutine that posted them, under its lock: nothing
// stands between PostSend and the link. When many QPs are busy at once
// (at least schedQPs of the device's QPs have a timer armed: they sent
// within the last ACK timeout), that would make every PostSend one
// system call of its own, and the first of 10,000 WRITEs posted at once
// would wait behind all the others' system calls. Then the requests go
// through the scheduler instead, as a NIC's doorbell hands work to its
// transmit engine:
//
//   - requester.progress outside a turn only queues the QP (txSched.add) and
//     returns: PostSend costs no system call, and no request packet is
//     built (nor its ACK timer started) before the QP's turn;
//   - the scheduler's goroutine serves the queued QPs round-robin, each
//     at most schedQuantum packets per turn (deficit round robin with
//     every packet costing one, the MTU being the QP's): a QP with a long send queue
//     goes back to the tail after its quantum, so 10,000 QPs progress
//     evenly and none starves;
//   - the packets of up to schedBatch turns leave in one Link.Send (one
//     sendmmsg of GSO datagrams), built in the turn that sends them: the
//     local ACK timer of a packet starts when it is built, right before
//     it is transmitted, never while its QP waits for its turn;
//   - no QP is served while the device's RC QPs have maxInflight packets
//     unacknowledged in all (inflight): the QPs beyond it wait here,
//     where no timer of theirs runs, not in the peer's receive queue,
//     where it would (10,000 packets posted at once took over a second
//     to be absorbed, and thousands of 67 ms timers expired on packets
//     that were on their way);
//   - but the budget counts only packets on their way, so that no peer
//     can hold it: a QP counts at most qpCap (a quarter of the budget)
//     of its unacknowledged PSNs, and none once the oldest of them has
//     waited for its ACK longer than its stale limit (a quarter of its
//     ACK timeout, 5 to 20 ms: schedStaleAfter). See account.
//
// So the local ACK timeout measures, as an RNIC's does, the time since
// the packet was transmitted. A resend (the ACK timer, an RNR back-off
// ending, a NAK) on a busy device also waits for the QP's turn; retry
// and RNR counters keep their meaning, since a QP spends a retry only on
// an expiry of a timer started by a transmission. UD QPs are not
// scheduled (a UD send is one datagram, with no timer). Under a Clock
// other than RealClock the scheduler is off unless DeviceConfig.SchedQPs
// asks for it: tests of timers want a request sent by the call that
// made it.
//
// Order: a QP's request packets leave in PSN order because the scheduler
// holds the lock of every QP whose packets are in the batch until the
// batch was sent (it takes further locks with TryLock only, so it never
// waits for a lock while holding one: no lock order to break), and any
// other path that sends a QP's packets (an ACK, a response, a resend
// built under the QP's lock) does it under that same lock.
type txSched struct {
	d       *Device
	minQPs  int32 // defer when at least this many timers are armed; <= 0: never
	started atomic.Bool

	mu     sync.Mutex
	ring   []*QP // circular FIFO of queued QPs; QP.schedQueued marks them
	head   int
	n      int
	queued atomic.Int32 // n, readable without mu
	closed bool

	// inflight is the sum over the device's RC QPs of their sent and
	// unacknowledged PSNs as last accounted (account), the scheduler's
	// measure of what the peers have not absorbed yet. It serves no QP
	// while inflight >= maxInflight (stalled): a link this process can
	// fill faster than its peer drains would otherwise keep the packets
	// of thousands of QPs in the peer's socket buffer, past their ACK
	// timeouts, or overflow it.
	inflight    atomic.Int64
	maxInflight int64
	qpCap       int32        // the most one QP counts in inflight: maxInflight/4
	ackDelay    atomic.Int64 // moving average of the QPs' ACK delays, ns (staleLimit)
	stalled     atomic.Bool

	wake chan struct{} // cap 1: the goroutine has work
	done chan struct{} // closed when the goroutine ended

	// The goroutine's own state.
	force bool // serve one QP despite a full inflight (schedStall)
	// waitResp: a QP's turn found a received batch's responses on their
	// way to the link (responder.progress): wait for them after the batch.
	waitResp bool
	held     []*QP
	scan     []*QP     // sweep's copy of the device's QPs
	out      respBatch // the batch's packets (the QPs' requests, their ACKs)
}

// schedQuantum is how many request packets a QP builds per turn (16
// packets of MTU 4096: 64 KiB); schedBatch how many QPs' turns share one
// Link.Send at most, schedMaxPkts how many packets.
//
// schedStall is how long the scheduler waits for an ACK to bring a full
// inflight below maxInflight before it looks for stale QPs (sweep) and,
// finding none, serves one QP anyway; schedStaleMax is the most a QP's
// oldest unacknowledged PSN waits for its ACK before the QP's PSNs stop
// counting in inflight (schedStaleAfter).
const (
	schedInflight = 256 // packets (1 MiB at MTU 4096)
	schedStall    = 5 * time.Millisecond
	schedStaleMax = 20 * time.Millisecond
	schedQuantum  = 16
	schedBatch    = 64
	schedMaxPkts  = 256
	defaultSchedQ = 64
)

// initSched prepares the device's scheduler (the goroutine starts on the
// first deferred request).
func (d *Device) initSched() {
	s := &d.sched
	s.d = d
	switch {
	case d.cfg.SchedQPs < 0:
		s.minQPs = 0
	case d.cfg.SchedQPs == 0:
		// On the wall clock only: a test's ManualClock wants every
		// request sent by the call that made it, not by a goroutine.
		if _, ok := d.clock.(RealClock); ok {
			s.minQPs = defaultSchedQ
		}
	default:
		s.minQPs = int32(d.cfg.SchedQPs)
	}
	s.maxInflight = schedInflight
	if d.cfg.SchedInflight > 0 {
		s.maxInflight = int64(d.cfg.SchedInflight)
	}
	s.qpCap = int32(max(1, min(s.maxInflight/4, 1<<30)))
	s.wake = make(chan struct{}, 1)
	s.done = make(chan struct{})
}

// deferring reports whether a request outside a scheduler turn should
// be queued rather than sent now: the device has enough busy QPs.
func (s *txSched) deferring() bool {
	// While QPs wait in the ring, a new request waits behind them.
	return s.minQPs > 0 && (s.d.tq.armed.Load() >= s.minQPs || s.queued.Load() > 0)
}

// add queues qp for a turn unless it is queued already. Called with
// qp.mu held.
func (s *txSched) add(qp *QP) {
	s.mu.Lock()
	if s.closed || qp.schedQueued {
		s.mu.Unlock()
		return
	}
	s.push(qp)
	qp.schedQueued = true
	first := s.n == 1
	s.mu.Unlock()
	if !s.started.Load() && s.started.CompareAndSwap(false, true) {
		go s.loop()
	}
	if first {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// grow doubles the ring. Under s.mu.
func (s *txSched) grow() {
	r := make([]*QP, max(64, 2*len(s.ring)))
	for i := 0; i < s.n; i++ {
		r[i] = s.ring[(s.head+i)%len(s.ring)]
	}
	s.ring, s.head = r, 0
}

// pop takes the QP at the head of the ring, nil if it is empty. The QP
// stays marked queued until its turn clears the mark, so that a PostSend
// meanwhile does not queue it twice.
func (s *txSched) pop() *QP {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return nil
	}
	qp := s.ring[s.head]
	s.ring[s.head] = nil
	s.head = (s.head + 1) % len(s.ring)
	s.n--
	s.queued.Store(int32(s.n))
	return qp
}

// requeue puts qp (popped, still marked queued) back at the tail.
func (s *txSched) requeue(qp *QP) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		qp.schedQueued = false
		return
	}
	s.push(qp)
}

// push puts qp at the ring's tail, growing the ring when full. Under s.mu.
func (s *txSched) push(qp *QP) {
	if s.n == len(s.ring) {
		s.grow()
	}
	s.ring[(s.head+s.n)%len(s.ring)] = qp
	s.n++
	s.queued.Store(int32(s.n))
}

// unmark clears qp's queued mark at the start of its turn (qp.mu held):
// from here on a new request queues it again.
func (s *txSched) unmark(qp *QP) {
	s.mu.Lock()
	qp.schedQueued = false
	s.mu.Unlock()
}

// close ends the goroutine (Device.Close) and waits for it.
func (s *txSched) close() {
	s.mu.Lock()
	s.closed = true
	for i := 0; i < s.n; i++ {
		j := (s.head + i) % len(s.ring)
		s.ring[j].schedQueued = false
		s.ring[j] = nil
	}
	s.n = 0
	s.queued.Store(0)
	s.mu.Unlock()
	if !s.started.Load() && s.started.CompareAndSwap(false, true) {
		close(s.done)
		return
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	// It ends after the batch it is sending; a link's Send that never
	// returns must not hang Close (the link is closed after this).
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
}

// loop is the scheduler's goroutine: it serves the queued QPs until the
// device closes.
func (s *txSched) loop() {
	defer close(s.done)
	var t *time.Timer
	for {
		if s.stalled.Load() {
			// Waiting for ACKs. Should none bring inflight below the
			// budget for schedStall, the QPs holding it are looked at
			// (a peer gone silent, or acknowledging a PSN now and then:
			// their PSNs stop counting once stale); should that free
			// nothing either, one QP is served anyway.
			start := time.Now()
			if t == nil {
				t = time.NewTimer(schedStall)
			} else {
				t.Reset(schedStall)
			}
			select {
			case <-s.wake:
			case <-t.C:
				s.sweep()
				if s.stalled.Load() && s.stalled.CompareAndSwap(true, false) {
					s.force = true
					inc(&s.d.ctr.SchedForcedTurns)
				}
			}
			atomic.AddUint64(&s.d.ctr.SchedFullNs, uint64(time.Since(start)))
		} else {
			<-s.wake
		}
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		for s.runBatch() && !s.stalled.Load() {
		}
	}
}

// runBatch builds one batch of turns and sends it; it reports false when
// the ring was empty.
func (s *txSched) runBatch() bool {
	served := false
	for len(s.held) < schedBatch && len(s.out.pkts) < schedMaxPkts {
		if s.full() {
			break
		}
		qp := s.pop()
		if qp == nil {
			break
		}
		served = true
		if len(s.held) == 0 {
			qp.mu.Lock() // holding no other lock: may wait
		} else if !qp.mu.TryLock() {
			// Busy elsewhere (its input, a PostSend): it takes its turn
			// after this batch.
			s.requeue(qp)
			break
		}
		s.held = append(s.held, qp)
		s.serve(qp)
		s.account(qp)
	}
	s.flush()
	if s.waitResp {
		// Holding no QP's lock now: flushPending can finish its send.
		s.waitResp = false
		s.d.respMu.Lock()
		s.d.respMu.Unlock()
	}
	return served
}

// full reports that the peers have maxInflight packets to absorb: the
// scheduler waits for their ACKs (account wakes it). Scheduler goroutine
// only.
func (s *txSched) full() bool {
	if s.force {
		s.force = false
		return false
	}
	if s.inflight.Load() < s.maxInflight {
		return false
	}
	s.stalled.Store(true)
	if s.inflight.Load() < s.maxInflight { // an ACK came in between
		s.stalled.Store(false)
		return false
	}
	return true
}

// account brings the device's inflight count up to date with qp's sent
// and unacknowledged PSNs (none once the QP left RTS/SQD or was
// destroyed), and wakes a stalled scheduler that may go on. Called with
// qp.mu held wherever that number changes in bulk: a scheduler turn, the
// end of a received batch (an ACK), a timer, the move to ERR, the
// scheduler's sweep.
//
// What counts is what the budget is for, the packets on their way to a
// peer that takes them: the budget keeps packets waiting here, where no
// ACK timer runs, rather than in a receive queue, where theirs would.
// It is no measure of a peer that does not acknowledge what it took, and
// letting such a peer's PSNs count let it stop every QP of the device: one
// QP whose peer acknowledges a PSN every 40 ms (never a retry spent,
// never a timeout) held a budget that its small-packet window (512 PSNs)
// alone exceeds, and 80 QPs to a healthy peer fell to 2 % of their
// throughput. An RNIC, or rxe, has no device-wide budget at all: each QP
// is held by its own window and a slow peer slows only its own QPs. So:
//
//   - a QP counts at most qpCap (a quarter of the budget) PSNs: one QP,
//     however large its window and however slowly its peer
//     acknowledges, leaves three quarters to the others; what it has
//     beyond, its own window bounds, as on an RNIC;
//   - a QP whose oldest unacknowledged PSN has waited for its ACK longer
//     than its stale limit (schedStaleAfter: a quarter of its ACK
//     timeout, 5 to 20 ms) counts none (schedStale, counted in
//     sched_stale_qps) until every PSN it had sent then is acknowledged.
//     The budget keeps what it has on its way to a few milliseconds'
//     worth; a packet unacknowledged for that long is not in a queue
//     the other QPs wait behind, but lost, or held by a peer that is
//     slow to acknowledge, or behind something only its own QP waits
//     for. Should a whole peer be that slow (every QP stale), the budget
//     still bounds what is sent per stale limit.
//
// The age is kept with a mark, not per packet: schedMarkPSN is req.psn
// as it was at schedMarkAt, renewed once comp.psn reached it. While
// comp.psn is before the mark, the PSN comp.psn was sent before
// schedMarkAt and is still unacknowledged: the QP is stale when that is
// longer ago than its limit. A peer that acknowledges one PSN at a time
// never reaches the mark; one that acknowledges promptly does within a
// round trip.
func (s *txSched) account(qp *QP) {
	u := qp.unackedPSNs()
	if u == 0 {
		if qp.schedMarked && !qp.schedStale {
			s.sampleAckDelay(s.d.clock.Now().Sub(qp.schedMarkAt))
		}
		qp.schedMarked, qp.schedStale = false, false
		s.set(qp, 0)
		return
	}
	if !qp.schedMarked || qp.comp.psn.Diff(qp.schedMarkPSN) >= 0 {
		now := s.d.clock.Now()
		if qp.schedMarked && !qp.schedStale {
			s.sampleAckDelay(now.Sub(qp.schedMarkAt))
		}
		qp.schedMarkPSN, qp.schedMarkAt = qp.req.psn, now
		qp.schedMarked, qp.schedStale = true, false
	} else if !qp.schedStale && s.d.clock.Now().Sub(qp.schedMarkAt) >= s.staleLimit(qp) {
		qp.schedStale = true
		inc(&s.d.ctr.SchedStaleQPs)
	}
	switch {
	case qp.schedStale:
		u = 0
	case u > s.qpCap:
		u = s.qpCap
	}
	s.set(qp, u)
}

// sampleAckDelay adds one QP's ACK delay — from a mark to the ACK that
// covered everything sent before it — to the device's moving average
// (weight 1/8).
func (s *txSched) sampleAckDelay(d time.Duration) {
	if d < 0 {
		return
	}
	old := s.ackDelay.Load()
	s.ackDelay.Store(old + (int64(d)-old)/8) // racing samples: one may be lost
}

// staleLimit is how long qp's oldest unacknowledged PSN may wait for its
// ACK before its PSNs stop counting (account): schedStaleAfter, or four
// times the device's average ACK delay if that is longer (up to the
// QP's ACK timeout). A QP is stale when its peer is slow compared with
// the others' peers, not when the whole path is: on a slow wire every
// QP's packets wait in the same queue, ACK delays grow for all, and the
// budget must go on bounding what is on its way (else the queue grows
// and the timers expire in it: TestSchedNoTimeoutWhileWaiting under
// -race, a 625 packet/s wire, did).
func (s *txSched) staleLimit(qp *QP) time.Duration {
	limit := qp.schedStaleAfter()
	if e := 4 * time.Duration(s.ackDelay.Load()); e > limit {
		limit = e
		if qp.timeout > 0 && limit > qp.timeout {
			limit = qp.timeout
		}
	}
	return limit
}

// schedStaleAfter is how long qp's oldest unacknowledged PSN may wait
// for its ACK before the QP's PSNs stop counting in the scheduler's
// inflight (account): a quarter of its local ACK timeout, at least
// schedStall and at most schedStaleMax (16.8 ms at the default 67 ms;
// schedStaleMax for a QP without a timeout). Long enough that a packet
// the budget made wait its turn, taking a few milliseconds to be
// absorbed, never counts as stale, and short enough that a slow peer
// holds the budget for no more than a few batches. Called with qp.mu
// held.
func (qp *QP) schedStaleAfter() time.Duration {
	d := qp.timeout / 4
	if qp.timeout == 0 || d > schedStaleMax {
		d = schedStaleMax
	}
	return max(d, schedStall)
}

// sweep accounts every QP that holds a share of inflight, so that a QP
// gone stale stops counting even when no event of its own (an ACK, a
// timer) comes to account it: a silent peer's QP with a long ACK
// timeout. Called by the scheduler's goroutine, holding no QP's lock,
// when inflight was full for schedStall; a QP whose lock is busy, or a
// device whose lock is, waits for the next sweep.
func (s *txSched) sweep() {
	d := s.d
	if !d.mu.TryLock() { // Close may hold it while it waits for this goroutine
		return
	}
	for _, qp := range d.qps {
		s.scan = append(s.scan, qp)
	}
	d.mu.Unlock()
	for i, qp := range s.scan {
		s.scan[i] = nil
		if qp.mu.TryLock() {
			if qp.schedInflight > 0 {
				s.account(qp)
			}
			qp.mu.Unlock()
		}
	}
	s.scan = s.scan[:0]
}

// forget drops qp's share of inflight (its timers stop: ERR, RESET,
// destroy). Called with qp.mu held.
func (s *txSched) forget(qp *QP) {
	qp.schedMarked, qp.schedStale = false, false
	s.set(qp, 0)
}

// unackedPSNs returns the PSNs an RC QP in RTS or SQD has sent and not
// seen acknowledged; 0 for any other QP. Called with qp.mu held.
func (qp *QP) unackedPSNs() int32 {
	var n int32
	if st := qp.attr.State; qp.init.Type == QPTypeRC && !qp.destroyed && (st == QPSRTS || st == QPSSQD) {
		n = qp.req.psn.Diff(qp.comp.psn)
		if n < 0 {
			n = 0
		}
	}
	return n
}

// set makes n qp's share of inflight. Called with qp.mu held.
func (s *txSched) set(qp *QP, n int32) {
	if n == qp.schedInflight {
		return
	}
	v := s.inflight.Add(int64(n - qp.schedInflight))
	qp.schedInflight = n
	if v < s.maxInflight && s.stalled.Load() && s.stalled.CompareAndSwap(true, false) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// serve runs qp's turn: up to schedQuantum packets of a READ response
// under way (readresp.go) and up to schedQuantum request packets are
// built, and everything the QP has queued joins the batch. Called with
// qp.mu held.
func (s *txSched) serve(qp *QP) {
	s.unmark(qp)
	if qp.destroyed {
		return
	}
	qp.schedTurn, qp.schedLeft, qp.schedMore = true, qp.schedQuantum(), false
	qp.resp.progress()
	// The requests get a quantum of their own: neither role of the QP
	// waits for the other's backlog (an RNIC's requester and responder
	// are engines of their own too).
	qp.schedLeft = qp.schedQuantum()
	qp.req.progress()
	qp.schedTurn = false
	qp.settle()
	if qp.schedMore {
		qp.schedMore = false
		s.mu.Lock()
		if !s.closed && !qp.schedQueued {
			qp.schedQueued = true
			s.mu.Unlock()
			s.requeue(qp)
		} else {
			s.mu.Unlock()
		}
	}
	if qp.nout == 0 {
		return
	}
	qp.ackLast()
	if qp.trace != nil {
		qp.traceOut()
	}
	s.out.pkts, s.out.bufs = qp.takeOut(s.out.pkts, s.out.bufs)
}

// flush sends the batch, gives its buffers back and unlocks its QPs.
func (s *txSched) flush() {
	s.out.send(s.d)
	for i, qp := range s.held {
		qp.mu.Unlock()
		s.held[i] = nil
	}
	s.held = s.held[:0]
}

// schedHold reports, inside requester.progress, that the QP must not build a
// request packet now: outside a scheduler turn on a busy device it is
// queued for one instead; inside a turn its quantum is spent (it goes
// back to the ring's tail). Called with qp.mu held.
func (qp *QP) schedHold() bool {
	if qp.schedTurn {
		if qp.schedLeft > 0 {
			return false
		}
		qp.schedMore = true
		return true
	}
	if qp.dev.sched.deferring() {
		qp.dev.sched.add(qp)
		return true
	}
	return false
}

// schedQuantum returns how many request packets qp builds per turn:
// schedQuantum packets of MTU 4096 (64 KiB), as many bytes at a smaller
// MTU, so that a 64 KiB message leaves in one turn whatever the MTU (at
// the default MTU 1024 it took four turns, and an ACK for each).
func (qp *QP) schedQuantum() int {
	if qp.mtu <= 0 || qp.mtu >= 4096 {
		return schedQuantum
	}
	return schedQuantum * 4096 / qp.mtu
}
