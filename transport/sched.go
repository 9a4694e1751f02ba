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
//     built (nor its ACK timer started) before the QP's turn (asked once
//     per call, at its first packet: a call not deferred sends all its
//     window admits);
//   - the scheduler's goroutine serves the queued QPs round-robin, each
//     at most schedQuantum packets per turn (deficit round robin with
//     every packet costing one, the MTU being the QP's): a QP with a long send queue
//     goes back to the tail after its quantum, so 10,000 QPs progress
//     evenly and none starves;
//   - the packets of up to schedBatch turns leave in one Link.Send (one
//     sendmmsg of GSO datagrams), built in the turn that sends them: the
//     local ACK timer of a packet starts when it is built, right before
//     it is transmitted, never while its QP waits for its turn;
//   - no QP's requests are served while the device's RC QPs have
//     maxInflight packets unacknowledged in all (inflight): the QPs
//     beyond it wait here, where no timer of theirs runs, not in the
//     peer's receive queue, where it would (10,000 packets posted at
//     once took over a second to be absorbed, and thousands of 67 ms
//     timers expired on packets that were on their way);
//   - the responses of a long READ (readresp.go) have turns of their
//     own, a responder's, in the same round-robin (two rings, served
//     oldest entry first: next), and the budget does not hold them
//     back: they are never acknowledged and are no unacknowledged
//     packets of this device. Held with the requests, a device whose
//     requests were unacknowledged stopped answering its peers' READs
//     (a quantum per forced turn, every 5 ms), and two devices that
//     each READ from and WRITE to the other could wait on each other;
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
// Order: a QP's packets leave in PSN order, each of its two sequences
// (its requests, its responses), because every packet is built under the
// QP's lock into its output queue, in order, and whatever sends them
// sends that queue from its head: the scheduler holds the lock of every
// QP of its batch until the batch was sent (it takes further locks with
// TryLock only, so it never waits for a lock while holding one: no lock
// order to break) and takes a QP's packets out only then, after the QP's
// last turn in the batch (flush: a QP may have had a turn of each kind,
// and the second may send its full queue on the spot); any other path
// that sends a QP's packets (PostSend, a timer, a full output queue)
// does it under that same lock. The one exception, a received batch's
// responses taken out of their QPs to leave together
// (Device.flushPending), is waited for by every responder turn and by
// HandlePacket (Device.respMu): TestSchedBothRolesOrder,
// TestReadResponseNotOvertakenByHandlePacket.
type txSched struct {
	d       *Device
	minQPs  int32 // defer when at least this many timers are armed; <= 0: never
	started atomic.Bool

	mu sync.Mutex
	// ring holds the QPs waiting for a turn of their requester
	// (QP.schedQueued marks them), rring those waiting for a turn of
	// their responder: a READ response under way, or the requests held
	// behind one (QP.schedRespQueued; readresp.go). The budget below
	// holds back the first only. Their entries are numbered as they are
	// queued (seq), and the next turn is the oldest entry of the two: one
	// round-robin over both.
	ring   schedRing
	rring  schedRing
	seq    uint64
	queued atomic.Int32 // ring.n + rring.n, readable without mu
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
	// ackedLo (Unix ns, 0 none) is the latest QP.schedMarkLo of a mark
	// found acknowledged: a packet sent after it has been acknowledged
	// (overtaken).
	ackedLo atomic.Int64
	stalled atomic.Bool
	// freed counts the shares of inflight that went down while the
	// budget was full (set): ACKs the path brought.
	freed atomic.Uint64

	wake chan struct{} // cap 1: the goroutine has work
	done chan struct{} // closed when the goroutine ended

	// The goroutine's own state.
	force bool // serve one QP despite a full inflight (schedStall)
	// stallAt is when the budget was found full (full), zero once the
	// loop noted the end of that stall (noteStall).
	stallAt time.Time
	// waitFrom is when the current wait for an ACK began: stallAt, or
	// the last stallExpired that forced no turn.
	waitFrom time.Time
	// freedSeen is the last value of freed the goroutine saw, at
	// freedAt: while ACKs free room (freed moves) within schedStaleMax,
	// a stall forces no turn (stallExpired).
	freedSeen uint64
	freedAt   time.Time
	// waitResp: a QP's turn found a received batch's responses on their
	// way to the link (responder.progress): wait for them after the batch.
	waitResp bool
	held     []*QP // the batch's QPs, locked until it is sent
	npkts    int   // packets the held QPs have queued
	scan     []*QP // sweep's copy of holders
	// holders are the QPs whose share of inflight is above zero (their
	// schedHolder is their index + 1), under holdMu: what sweep looks
	// at, so that its work is the few QPs holding the budget, not every
	// QP of the device (10,000 cold QPs, milliseconds, per stall). A QP
	// leaving it leaves a nil slot, whose index goes to holdFree for the
	// next QP to come: moving the last holder into the slot instead
	// wrote that other QP's schedHolder, a cache miss on a cold QP per
	// message with thousands of QPs taking turns. The list is as long as
	// the most QPs that held a share at once (at most the budget's
	// packets while all are counted).
	holdMu   sync.Mutex
	holders  []*QP
	holdFree []int32
	// sweeps and swept count the sweeps and the QPs they looked at
	// (tests).
	sweeps, swept atomic.Uint64
	out           respBatch // the batch's packets (the QPs' requests, their ACKs)
}

// schedRing is a circular FIFO of the QPs waiting for one kind of turn,
// each with the number it was queued under. Under txSched.mu.
type schedRing struct {
	q    []schedEntry
	head int
	n    int
}

type schedEntry struct {
	qp  *QP
	seq uint64
}

// push puts qp at the tail, growing the ring when full.
func (r *schedRing) push(qp *QP, seq uint64) {
	if r.n == len(r.q) {
		q := make([]schedEntry, max(64, 2*len(r.q)))
		for i := 0; i < r.n; i++ {
			q[i] = r.q[(r.head+i)%len(r.q)]
		}
		r.q, r.head = q, 0
	}
	r.q[(r.head+r.n)%len(r.q)] = schedEntry{qp: qp, seq: seq}
	r.n++
}

// front returns the number of the entry at the head; the ring must not
// be empty.
func (r *schedRing) front() uint64 { return r.q[r.head].seq }

// pop takes the QP at the head; the ring must not be empty.
func (r *schedRing) pop() *QP {
	qp := r.q[r.head].qp
	r.q[r.head] = schedEntry{}
	r.head = (r.head + 1) % len(r.q)
	r.n--
	return qp
}

// clear empties the ring, calling f for each QP in it.
func (r *schedRing) clear(f func(*QP)) {
	for i := 0; i < r.n; i++ {
		j := (r.head + i) % len(r.q)
		f(r.q[j].qp)
		r.q[j] = schedEntry{}
	}
	r.head, r.n = 0, 0
}

// Turn kinds, the bits of QP.schedInBatch.
const (
	schedReqTurn  = 1
	schedRespTurn = 2
)

// schedQuantum is how many request packets a QP builds per turn (16
// packets of MTU 4096: 64 KiB); schedBatch how many QPs' turns share one
// Link.Send at most, schedMaxPkts how many packets.
//
// schedStall is how long the scheduler waits for an ACK to bring a full
// inflight below maxInflight before it looks for stale QPs (sweep) and,
// finding none while no ACK freed room for schedStaleMax, serves one QP
// anyway (stallExpired); schedStaleMax is also the most a QP's oldest
// unacknowledged PSN waits for its ACK before the QP's PSNs may stop
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
	// While QPs wait in the rings, a new request waits behind them.
	return s.minQPs > 0 && (s.d.tq.armed.Load() >= s.minQPs || s.queued.Load() > 0)
}

// add queues qp for a turn of its requester unless it is queued for one
// already. Called with qp.mu held.
func (s *txSched) add(qp *QP) { s.enqueue(qp, false) }

// addResp queues qp for a turn of its responder (the next quantum of a
// READ response, the requests held behind it) unless it is queued for
// one already. The request budget does not hold these turns back.
// Called with qp.mu held.
func (s *txSched) addResp(qp *QP) { s.enqueue(qp, true) }

func (s *txSched) enqueue(qp *QP, resp bool) {
	s.mu.Lock()
	first, ok := s.put(qp, resp)
	s.mu.Unlock()
	if !ok {
		return
	}
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

// put queues qp in the ring of resp's kind unless it is there already or
// the scheduler closed; it reports whether it did, and whether that ring
// was empty. Under s.mu, with qp.mu held.
func (s *txSched) put(qp *QP, resp bool) (first, ok bool) {
	mark := &qp.schedQueued
	if resp {
		mark = &qp.schedRespQueued
	}
	if s.closed || *mark {
		return false, false
	}
	*mark = true
	r := s.push(qp, resp)
	return r.n == 1, true
}

// push puts qp at the tail of the ring of resp's kind and returns that
// ring. Under s.mu.
func (s *txSched) push(qp *QP, resp bool) *schedRing {
	r := &s.ring
	if resp {
		r = &s.rring
	}
	s.seq++
	r.push(qp, s.seq)
	s.queued.Store(int32(s.ring.n + s.rring.n))
	return r
}

// next takes the QP whose turn is next: the oldest entry of the two
// rings, of the request ring only while the budget has room (full). The
// QP stays marked queued until its turn clears the mark (unmark), so that
// a PostSend meanwhile does not queue it twice. It returns nil when no
// QP may be served.
func (s *txSched) next() (qp *QP, resp bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := s.ring.n > 0 && (s.rring.n == 0 || s.ring.front() < s.rring.front())
	if req && s.full() {
		req = false // the responses go on: they are no requests
	}
	switch {
	case req:
		qp = s.ring.pop()
	case s.rring.n > 0:
		qp, resp = s.rring.pop(), true
	default:
		return nil, false
	}
	s.queued.Store(int32(s.ring.n + s.rring.n))
	return qp, resp
}

// requeue puts qp (popped, still marked queued) back at the tail of the
// ring of resp's kind.
func (s *txSched) requeue(qp *QP, resp bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if resp {
			qp.schedRespQueued = false
		} else {
			qp.schedQueued = false
		}
		return
	}
	s.push(qp, resp)
}

// unmark clears qp's queued mark of resp's kind at the start of its turn
// (qp.mu held): from here on new work queues it again.
func (s *txSched) unmark(qp *QP, resp bool) {
	s.mu.Lock()
	if resp {
		qp.schedRespQueued = false
	} else {
		qp.schedQueued = false
	}
	s.mu.Unlock()
}

// close ends the goroutine (Device.Close) and waits for it.
func (s *txSched) close() {
	s.mu.Lock()
	s.closed = true
	s.ring.clear(func(qp *QP) { qp.schedQueued = false })
	s.rring.clear(func(qp *QP) { qp.schedRespQueued = false })
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
			// Requests wait for ACKs (responses had their turns, and
			// none is left). Should none bring inflight below the
			// budget within schedStall of the stall's start, the QPs
			// holding it are looked at (a peer gone silent, or
			// acknowledging a PSN now and then: their PSNs stop
			// counting once stale); should that free nothing either,
			// one QP is served anyway.
			wait := schedStall - time.Since(s.waitFrom)
			fired := wait <= 0
			if !fired {
				if t == nil {
					t = time.NewTimer(wait)
				} else {
					t.Reset(wait)
				}
				select {
				case <-s.wake:
				case <-t.C:
					fired = true
				}
			}
			if fired {
				s.stallExpired()
			}
		} else {
			<-s.wake
		}
		s.noteStall()
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		for s.runBatch() {
			// Responder turns go on while the requests are stalled;
			// they must not put off the sweep (a long READ answered
			// while silent peers hold the budget).
			if s.stalled.Load() && time.Since(s.waitFrom) >= schedStall {
				s.stallExpired()
			}
		}
	}
}

// stallExpired handles a stall that lasted schedStall: the QPs holding
// the budget are accounted (sweep), and if that frees nothing and no ACK
// freed room for schedStaleMax, one QP's requests are served anyway
// (force).
//
// On a link whose packets take longer than schedStall each (16 packets
// of 6 ms), every gap between two ACKs was such a stall: a forced turn
// per packet sent put one QP's packets more into the link's queue, which
// grew without bound and held packets past their ACK timeout. So a turn
// is forced only when no ACK freed room in the budget (freed) for
// schedStaleMax: a path that acknowledges, however slowly, is left to
// drain; a peer that holds the budget silently is still passed by.
func (s *txSched) stallExpired() {
	s.sweep()
	now := time.Now()
	if f := s.freed.Load(); f != s.freedSeen || s.freedAt.IsZero() {
		s.freedSeen, s.freedAt = f, now
	}
	if now.Sub(s.freedAt) < schedStaleMax {
		s.waitFrom = now // sweep again after schedStall
		return
	}
	if s.stalled.Load() && s.stalled.CompareAndSwap(true, false) {
		s.force = true
		inc(&s.d.ctr.SchedForcedTurns)
	}
}

// runBatch builds one batch of turns and sends it; it reports false when
// no QP could be served (both rings empty, or only requests queued and
// the budget full).
func (s *txSched) runBatch() bool {
	served := false
	for turns := 0; turns < schedBatch && s.npkts < schedMaxPkts; turns++ {
		qp, resp := s.next()
		if qp == nil {
			break
		}
		served = true
		kind := uint8(schedReqTurn)
		if resp {
			kind = schedRespTurn
		}
		if qp.schedInBatch&kind != 0 {
			// It had this kind of turn in this batch already (alone
			// in its ring): the next one is in the next batch.
			s.requeue(qp, resp)
			break
		}
		if qp.schedInBatch == 0 {
			if len(s.held) == 0 {
				qp.mu.Lock() // holding no other lock: may wait
			} else if !qp.mu.TryLock() {
				// Busy elsewhere (its input, a PostSend): it takes
				// its turn after this batch.
				s.requeue(qp, resp)
				break
			}
			s.held = append(s.held, qp)
		}
		qp.schedInBatch |= kind
		n := qp.nout
		if resp {
			s.serveResp(qp)
		} else {
			s.serveReq(qp)
		}
		s.npkts += qp.nout - n
		s.account(qp)
		qp.schedFromTurn = false
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

// full reports that the peers have maxInflight request packets to
// absorb: the request ring waits for their ACKs (account wakes the
// scheduler). Scheduler goroutine only, under s.mu, with requests queued.
func (s *txSched) full() bool {
	if s.force {
		s.force = false
		return false
	}
	if s.inflight.Load() < s.maxInflight {
		return false
	}
	if !s.stalled.Load() {
		s.noteStall()
		s.stallAt = time.Now()
		s.waitFrom = s.stallAt
	}
	s.stalled.Store(true)
	if s.inflight.Load() < s.maxInflight { // an ACK came in between
		s.stalled.Store(false)
		return false
	}
	return true
}

// noteStall adds the last stall, once it ended, to sched_full_ns.
// Scheduler goroutine only.
func (s *txSched) noteStall() {
	if !s.stallAt.IsZero() && !s.stalled.Load() {
		atomic.AddUint64(&s.d.ctr.SchedFullNs, uint64(time.Since(s.stallAt)))
		s.stallAt = time.Time{}
	}
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
//     timeout, 5 to 20 ms) while a packet sent after it was
//     acknowledged, on any QP (overtaken), counts none (schedStale,
//     counted in sched_stale_qps) until every PSN it had sent then is
//     acknowledged. A packet overtaken so is not in a queue the other
//     QPs wait behind, but lost, or held by a peer that is slow to
//     acknowledge, or behind something only its own QP waits for. One
//     not overtaken waits in the path's queue with the others' (a slow
//     link: every QP's ACK delay long): it goes on counting, however
//     long, so that the budget goes on bounding that queue. Before,
//     age alone made every QP stale on a link slower than the budget
//     per stale limit (16 packets at 6 ms each), the queue grew and the
//     ACK timers expired in it (TestSchedStaleNeedsOvertaking).
//
// The age is kept with a mark, not per packet: schedMarkPSN is req.psn
// as it was at schedMarkAt, renewed once comp.psn reached it. While
// comp.psn is before the mark, the PSN comp.psn was sent before
// schedMarkAt and is still unacknowledged: the QP is stale when that is
// longer ago than its limit. A peer that acknowledges one PSN at a time
// never reaches the mark; one that acknowledges promptly does within a
// round trip.
//
// The times are QP.now's: inside a received batch the batch's one clock
// reading. A requester with READs outstanding stays marked and is
// accounted for every READ response it receives; a clock reading each
// (time.Now for the stale check) cost a 64 KiB READ 16 of them at MTU
// 4096 (TestBatchClockSchedMarked). Called with qp.mu held.
func (s *txSched) account(qp *QP) {
	u := qp.unackedPSNs()
	if u == 0 {
		if qp.schedMarked {
			now := qp.now()
			if !qp.schedStale {
				s.sampleAckDelay(time.Duration(now.UnixNano() - qp.schedMarkAt))
			}
			s.noteAcked(qp.schedMarkLo)
			qp.schedIdleAt = now.UnixNano()
		}
		qp.schedMarked, qp.schedStale = false, false
		s.set(qp, 0)
		return
	}
	if !qp.schedMarked || qp.comp.psn.Diff(qp.schedMarkPSN) >= 0 {
		now := qp.now()
		if qp.schedMarked {
			if !qp.schedStale {
				s.sampleAckDelay(time.Duration(now.UnixNano() - qp.schedMarkAt))
			}
			s.noteAcked(qp.schedMarkLo)
			// What is unacknowledged now was sent after the old mark.
			qp.schedMarkLo = qp.schedMarkAt
		} else if qp.schedFromTurn {
			// Built by this turn, just now (serveReq): a QP that
			// answered peer gives evidence with its first ACK, not
			// its second (a silent peer's QPs beside it go stale
			// after one forced turn of it).
			qp.schedMarkLo = now.UnixNano()
		} else {
			// Sent since the QP was last found with nothing unacknowledged.
			qp.schedMarkLo = qp.schedIdleAt
		}
		qp.schedMarkPSN, qp.schedMarkAt = qp.req.psn, now.UnixNano()
		qp.schedMarked, qp.schedStale = true, false
	} else if !qp.schedStale && time.Duration(qp.now().UnixNano()-qp.schedMarkAt) >= s.staleLimit(qp) && s.overtaken(qp.schedMarkAt) {
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

// noteAcked records that the PSNs of a mark whose unacknowledged PSNs
// were sent after lo (QP.schedMarkLo) are all acknowledged.
func (s *txSched) noteAcked(v int64) {
	if v == 0 {
		return
	}
	for {
		old := s.ackedLo.Load()
		if v <= old || s.ackedLo.CompareAndSwap(old, v) {
			return
		}
	}
}

// overtaken reports that a packet sent after markAt (a QP's mark: its
// oldest unacknowledged PSN was sent no later) has been acknowledged,
// on any QP of the device: the path delivers what was sent after that
// PSN, so its own peer is what holds it. On one slow path, where every
// QP's packets wait in one queue in the order they were sent, no QP is
// overtaken and none goes stale, however long the queue takes.
func (s *txSched) overtaken(markAt int64) bool {
	return s.ackedLo.Load() > markAt
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
// timeout. It looks at holders only (the QPs whose share is above zero),
// not at every QP of the device. Called by the scheduler's goroutine,
// holding no QP's lock, when inflight was full for schedStall; a QP whose
// lock is busy waits for the next sweep.
func (s *txSched) sweep() {
	s.holdMu.Lock()
	for _, qp := range s.holders {
		if qp != nil {
			s.scan = append(s.scan, qp)
		}
	}
	s.holdMu.Unlock()
	s.sweeps.Add(1)
	s.swept.Add(uint64(len(s.scan)))
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
	if n < qp.schedInflight && s.stalled.Load() {
		s.freed.Add(1)
	}
	if n == 0 || qp.schedInflight == 0 {
		s.hold(qp, n > 0)
	}
	qp.schedInflight = n
	if v < s.maxInflight && s.stalled.Load() && s.stalled.CompareAndSwap(true, false) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// hold adds qp to holders (on) or takes it out. Called with qp.mu held
// when its share of inflight becomes or stops being zero. It touches no
// other QP.
func (s *txSched) hold(qp *QP, on bool) {
	s.holdMu.Lock()
	if on {
		if qp.schedHolder == 0 {
			if n := len(s.holdFree); n > 0 {
				i := s.holdFree[n-1]
				s.holdFree = s.holdFree[:n-1]
				s.holders[i] = qp
				qp.schedHolder = i + 1
			} else {
				s.holders = append(s.holders, qp)
				qp.schedHolder = int32(len(s.holders))
			}
		}
	} else if i := qp.schedHolder - 1; i >= 0 {
		s.holders[i] = nil
		s.holdFree = append(s.holdFree, i)
		qp.schedHolder = 0
	}
	s.holdMu.Unlock()
}

// serveReq runs a turn of qp's requester: up to its quantum of request
// packets are built. Called with qp.mu held.
func (s *txSched) serveReq(qp *QP) {
	s.unmark(qp, false)
	if qp.destroyed {
		return
	}
	qp.schedTurn, qp.schedLeft, qp.schedMore = true, qp.schedQuantum(), false
	// Nothing unacknowledged before the turn: what it builds is all the
	// QP will have on its way (account's mark from it: schedFromTurn).
	qp.schedFromTurn = !qp.schedMarked && qp.unackedPSNs() == 0
	qp.req.progress()
	qp.schedTurn = false
	s.endTurn(qp, false)
}

// serveResp runs a turn of qp's responder: up to its quantum of a READ
// response under way (readresp.go), then of the requests held behind it.
// The two roles have turns of their own, each its quantum, so that
// neither waits for the other's backlog (an RNIC's requester and
// responder are engines of their own too) and the request budget holds
// back the requests only. Called with qp.mu held.
func (s *txSched) serveResp(qp *QP) {
	s.unmark(qp, true)
	if qp.destroyed {
		return
	}
	qp.schedRespTurn, qp.schedLeft, qp.schedMore = true, qp.schedQuantum(), false
	qp.resp.progress()
	qp.schedRespTurn = false
	s.endTurn(qp, true)
}

// endTurn settles qp after a turn and queues it again (at the tail) if
// its quantum ended the turn with more to send.
func (s *txSched) endTurn(qp *QP, resp bool) {
	qp.settle()
	if qp.schedMore {
		qp.schedMore = false
		s.mu.Lock()
		s.put(qp, resp)
		s.mu.Unlock()
	}
}

// flush sends the batch, gives its buffers back and unlocks its QPs. A
// QP's packets are taken out of it only here, all at once, after its
// last turn in the batch: a QP may have had a turn of each kind, and a
// second turn that sends its full output queue on the spot (outSlot)
// must not overtake what an earlier turn left for the batch.
func (s *txSched) flush() {
	for _, qp := range s.held {
		if qp.nout == 0 || qp.destroyed {
			continue
		}
		qp.ackLast()
		if qp.trace != nil {
			qp.traceOut()
		}
		s.out.pkts, s.out.bufs = qp.takeOut(s.out.pkts, s.out.bufs)
	}
	s.out.send(s.d)
	for i, qp := range s.held {
		qp.schedInBatch = 0
		qp.mu.Unlock()
		s.held[i] = nil
	}
	s.held = s.held[:0]
	s.npkts = 0
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
