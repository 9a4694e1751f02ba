package transport

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// sendWQE is a send queue slot. Its fields are ordered as the QP's are
// (TestQPHotLayout): what a WRITE's post, turns and ACK read first, then
// wr, whose first fields (WRID to RKey) they read too, and the READ's
// scatter list last, so that a WRITE touches its first 136 bytes
// (TestSendWQEHotLayout).
type sendWQE struct {
	sges      []memreg.SGE
	ref       *memreg.Ref // the region a one-element sges was checked against at post (a hint: memreg.Ref)
	npkts     int
	length    uint32
	firstPSN  bth.PSN
	signaled  bool
	rdCounted bool
	done      bool
	localDone bool // a local operation (bind, invalidate) was executed
	probe     bool // a keep-alive probe (QP.Probe): never completes to a CQ
	extra     bool // pushWQE set wr's fields that postFast does not write (clearExtra)
	status    WCStatus
	wr        SendWR             // as posted, but for SGEs (nil; the list is sges)
	rsl       memreg.ScatterList // RDMA READ: places the response data into sges
}

type recvWQE struct {
	wrid   uint64
	sges   []memreg.SGE
	length uint64
	ref    *memreg.Ref // the region a one-element sges was checked against at post (a hint: memreg.Ref)
}

// rdRes is a saved responder resource for a READ or atomic request.
type rdRes struct {
	valid    bool
	atomic   bool
	firstPSN bth.PSN
	lastPSN  bth.PSN
	va       uint64
	rkey     uint32
	length   uint32
	orig     uint64
}

// QP is a Reliable Connected queue pair.
//
// All methods are safe for concurrent use; the requester, responder and
// completer run under the QP's mutex, so PostSend, PostRecv, Modify and
// the device's receive goroutine serialize per QP. The SGE slices of a work
// request are copied by PostSend and PostRecv; the memory they name must
// stay registered until the WR completes.
type QP struct {
	// The fields are ordered by who touches them per message (issue 30
	// item 4: with 10,000 active QPs no QP's state stays in the CPU's
	// caches, and every cache line a message's send, its ACK, the
	// scheduler's turn and account touch is a miss): first what every
	// packet, post and turn of either role reads, then the output queue
	// (both roles), the requester's, completer's, timers' and scheduler's
	// state, then the responder's, and last what is used rarely
	// (creation, errors, events, receive queue, congestion control's
	// rate state, the scratch Fields of READ/atomic/NAK packets).
	// TestQPHotLayout pins how many cache lines a requester's and a
	// responder's WRITE path touch (a QP starts 8 bytes into a line, after
	// the allocator's header).

	// Every packet, post and turn.
	dev       *Device
	mu        sync.Mutex
	qpn       uint32
	transport bth.Transport // the BTH transport of its packets (RC or UD)
	destroyed bool
	rxBatch   bool // input from the receive goroutine is running: defer CQ wakeups
	cqLost    bool // a completion was lost to a CQ in error: the QP must move to ERR (settle)
	commEst   bool // EventCommEst was raised
	rxQueued  bool // on dev.rxPending (receive goroutine only)
	outSmall  bool // see slabs
	outFixed  bool // the output queue never grows (QP1: one MAD per Send; output.go)
	// rxIn is set while the batch owner hands this QP packets of a
	// received batch (input): now reads the device's batch clock
	// (Device.rxNow) then. A flag, not a pointer to the clock: a pointer
	// store into the QP costs a write barrier check per run.
	rxIn    bool
	srcPort uint16
	_       [8]byte                          // where the clock's pointer was: the hot fields after it keep their lines (TestQPHotLayout)
	sr      *srState                         // selective repeat (sack.go), nil: go-back-N
	trace   func(format string, args ...any) // test hook, nil in production
	mtu     int
	timeout time.Duration // local ACK timeout, 0 = infinite
	heard   uint64        // packets accepted from the peer (liveness.go)
	attr    QPAttr
	peer    netip.Addr
	pd      *memreg.PD
	rv      memreg.QPView // remote-facing view of pd for this QP (type 2 windows)
	sendCQ  *CQ
	init    QPInitAttr

	// The output queue (output.go), both roles.
	out     []udp.Packet
	outBufs []*[udp.MaxPacketSize]byte // taken from the device's pool while packets are queued
	nout    int
	// slabs hold the queued small packets back to back (outBufN): the
	// last one is being filled, slabOff bytes of it so far. outSmall: the
	// buffer outBufN returned last is in it. A hot QP keeps its first
	// slab between flushes (releaseSlabs).
	slabs   []*[udp.MaxPacketSize]byte
	slabOff int
	ackSlot int // nout when the last queued packet is a positive ACK that a newer one may replace, else 0
	// zcTaken is the number of the device's last received-batch take
	// (Device.respTook) that moved zero-copy packets out of the QP
	// (zcInFlight).
	zcTaken uint64

	// send queue: monotonic indexes, slot = index % len(sq)
	sq                   []sendWQE
	sqHead, sqCur, sqEnd uint64
	// sqMask and rqMask (below) are len(sq)-1 and len(rq)-1 when that
	// length is a power of two (the rings start at ringStart and double),
	// else 0: sqAt and rqAt then take the slot with a mask instead of a
	// 64-bit division (tens of cycles, several per message). Set with the
	// ring (setSQ, setRQ).
	sqMask uint64
	// probes is 1 while a keep-alive probe is in the send queue (it does
	// not count against max_send_wr; liveness.go); roomSig wakes every
	// PostSendContext and WaitSendRoom waiter when a send WQE leaves the
	// queue (closed, then replaced by the next waiter; nil while nobody
	// waits; read per completion), and roomWait counts the waiters.
	probes   int
	roomWait int
	roomSig  chan struct{}

	req  requester
	comp completer

	tq  [numTimerKinds]timerEntry // this QP's entries in dev.tq
	tmr timers

	// The send scheduler's state (sched.go): schedQueued and
	// schedRespQueued under dev.sched.mu, schedInBatch the scheduler's
	// goroutine's own, the others under mu.
	schedQueued     bool  // in the scheduler's request ring
	schedRespQueued bool  // in the scheduler's response ring (readresp.go)
	schedTurn       bool  // in a requester turn: req.progress builds up to schedLeft packets
	schedRespTurn   bool  // in a responder turn: resp.progress sends up to schedLeft packets
	schedMore       bool  // the turn ended on the quantum, with more to send
	schedInBatch    uint8 // the kinds of turn (schedReqTurn, schedRespTurn) it had in the batch being built
	// schedMarkPSN and schedMarkAt (Unix ns of QP.now): every PSN
	// before schedMarkPSN was sent by schedMarkAt (schedMarked; account
	// renews the mark once they are all acknowledged). schedStale: they
	// were not, a stale limit after schedMarkAt (schedStaleAfter), and a
	// packet sent after it was (txSched.overtaken).
	schedMarked bool
	schedStale  bool
	// schedFromTurn: in a requester turn that began with nothing
	// unacknowledged (serveReq; account dates its mark by the turn).
	schedFromTurn bool
	schedLeft     int
	// schedInflight is this QP's share of dev.sched.inflight (account):
	// its unacknowledged PSNs, at most schedQPCap of them, none while
	// schedStale.
	schedInflight int32
	schedHolder   int32 // index + 1 in dev.sched.holders while schedInflight > 0, under dev.sched.holdMu
	schedMarkPSN  bth.PSN
	schedMarkAt   int64
	// schedMarkLo (Unix ns, 0 unknown): the PSNs the mark covers that
	// were unacknowledged when it was made were sent after it;
	// schedIdleAt (Unix ns) is when account last found the QP, marked
	// before, with nothing unacknowledged. See txSched.overtaken.
	schedMarkLo int64
	schedIdleAt int64

	// congestion control (cc.go): its first bytes (paceArmed, the
	// reaction point's limited and held) are read per turn.
	cc qpCC

	// The responder (its fields for a WRITE first; responder.go).
	resp responder

	// Rarely used: creation, the receive queue, events, errors.
	recvCQ *CQ
	srq    *SRQ

	// receive queue
	rq            []recvWQE
	rqHead, rqEnd uint64
	rqMask        uint64

	commEstCh  chan struct{} // closed with commEst
	sqdDrained bool          // EventSQDrained was raised for the current SQD

	// Liveness (liveness.go): failCh is closed when the QP enters ERR
	// (failed reports that it is), failErr says why; heard, probes,
	// roomSig and roomWait are above.
	failCh       chan struct{}
	failed       bool
	failErr      error
	destroyCause error // what Destroy's callers name (DestroyCause), nil: ErrDestroyed alone

	// reqF and respF are where the requester and the responder build a
	// READ/atomic request, a NAK or a READ response's header fields
	// (packet.Build); a WRITE's packets and their ACKs are built without.
	reqF, respF packet.Fields
}

// initRoles points the QP's requester, completer and responder (embedded
// in it by value) back at it. Every constructor of a QP calls it before the
// QP is published; the roles' resets keep the pointer.
func (qp *QP) initRoles() { qp.req.qp, qp.comp.qp, qp.resp.qp = qp, qp, qp }

// pushWC stores a completion in cq. Inside a received batch the waiter is
// woken at the end of the batch (Device.wakePending), else right away. A
// completion the CQ cannot take (overflow, or a CQ in error) marks the QP
// for the error state, which settle applies once the operation in progress
// is over. solicited marks a receive completion of a solicited message.
func (qp *QP) pushWC(cq *CQ, wc *WC, solicited bool) {
	cq.mu.Lock()
	ok, wake := cq.storeLocked(wc, solicited)
	cq.mu.Unlock()
	if !ok {
		qp.cqLost = true
		if wake {
			cq.overflowed()
		}
	}
	if wake {
		if qp.rxBatch { // qp.wakeCQ, in line
			qp.dev.deferWake(cq)
		} else {
			cq.wake()
		}
	}
}

// wakeCQ wakes cq's waiters after a completion was stored in it (or it
// overflowed): at the end of the batch inside a received one
// (Device.wakePending), else now.
func (qp *QP) wakeCQ(cq *CQ) {
	if qp.rxBatch {
		qp.dev.deferWake(cq)
	} else {
		cq.wake()
	}
}

// settle finishes an operation on the QP (a received packet, a post, a
// timer): a QP that lost a completion to its CQ moves to ERR, as verbs
// moves a QP whose CQ overflowed, and raises EventQPFatal.
// In SQD it also raises EventSQDrained once nothing is outstanding.
func (qp *QP) settle() {
	if qp.cqLost || qp.attr.State == QPSSQD {
		qp.settleSlow() // inlined check: every post and received packet settles
	}
}

// settleSlow is settle's work, when there may be some.
func (qp *QP) settleSlow() {
	if qp.cqLost {
		qp.cqLost = false
		if qp.attr.State != QPSErr && !qp.destroyed {
			qp.fail(EventQPFatal, ErrCQOverflow)
		}
	}
	if qp.attr.State == QPSSQD && !qp.sqdDrained && !qp.comp.outstanding() && !qp.req.started(qp.sqCur) {
		qp.sqdDrained = true
		qp.dev.raise(AsyncEvent{Type: EventSQDrained, QP: qp})
	}
}

// fail moves the QP to ERR by itself (an error, not a Modify) and raises
// the asynchronous event ev with cause.
func (qp *QP) fail(ev EventType, cause error) {
	if !qp.failed && qp.failErr == nil {
		qp.failErr = cause
	}
	wasErr := qp.attr.State == QPSErr
	qp.enterError(false)
	qp.dev.raise(AsyncEvent{Type: ev, QP: qp, Err: cause})
	if !wasErr && qp.srq != nil {
		// Last WQE Reached after the error that caused it, as a
		// consumer that tears the QP down on the fatal event expects.
		qp.dev.raise(AsyncEvent{Type: EventQPLastWQEReached, QP: qp, SRQ: qp.srq})
	}
}

// CreateQP creates a QP of type a.Type (QPTypeRC, QPTypeUC or QPTypeUD) in
// the RESET state. The PD and both CQs must belong to this device
// (ErrWrongDevice). While the QP exists, its PD
// cannot be deallocated and its CQs cannot be destroyed (they answer
// ErrBusy); Destroy releases them.
func (d *Device) CreateQP(pd *memreg.PD, a QPInitAttr) (*QP, error) {
	if d.isClosed() {
		return nil, ErrClosed
	}
	var tr bth.Transport
	switch a.Type {
	case QPTypeRC:
		tr = bth.TransportRC
	case QPTypeUD:
		tr = bth.TransportUD
	case QPTypeUC:
		tr = bth.TransportUC
	default:
		return nil, fmt.Errorf("transport: CreateQP: qp_type %v not supported (RC, UC and UD are): %w", a.Type, ErrInvalidConfig)
	}
	if pd == nil {
		return nil, fmt.Errorf("transport: CreateQP: nil pd: %w", ErrInvalidConfig)
	}
	if a.SendCQ == nil || a.RecvCQ == nil {
		return nil, fmt.Errorf("transport: CreateQP: send_cq and recv_cq are required: %w", ErrInvalidConfig)
	}
	if pd.Table() != d.table {
		return nil, fmt.Errorf("transport: CreateQP: pd: %w", ErrWrongDevice)
	}
	if a.SendCQ.dev != d {
		return nil, fmt.Errorf("transport: CreateQP: send_cq: %w", ErrWrongDevice)
	}
	if a.RecvCQ.dev != d {
		return nil, fmt.Errorf("transport: CreateQP: recv_cq: %w", ErrWrongDevice)
	}
	// 0 is allowed, as in verbs and rxe (rxe_qp_chk_cap checks only the
	// upper bound): a QP with no send queue, or (below) no receive queue
	// — a WRITE/READ-only requester. Posting to it fails with
	// ErrQueueFull naming max_send_wr / max_recv_wr.
	if a.MaxSendWR < 0 || a.MaxSendWR > 1<<16 {
		return nil, fmt.Errorf("transport: CreateQP: max_send_wr %d out of range 0..%d: %w", a.MaxSendWR, 1<<16, ErrInvalidConfig)
	}
	if a.SRQ != nil {
		if a.SRQ.dev != d {
			return nil, fmt.Errorf("transport: CreateQP: srq: %w", ErrWrongDevice)
		}
		if a.SRQ.pd != pd {
			return nil, fmt.Errorf("transport: CreateQP: srq: the SRQ is in another PD: %w", ErrInvalidConfig)
		}
		a.MaxRecvWR = 1 // unused: receives come from the SRQ
	}
	if a.MaxRecvWR < 0 || a.MaxRecvWR > 1<<16 {
		return nil, fmt.Errorf("transport: CreateQP: max_recv_wr %d out of range 0..%d: %w", a.MaxRecvWR, 1<<16, ErrInvalidConfig)
	}
	if a.MaxSGE == 0 {
		a.MaxSGE = 1
	}
	if a.MaxSGE < 0 || a.MaxSGE > 32 {
		return nil, fmt.Errorf("transport: CreateQP: max_sge %d out of range 1..32: %w", a.MaxSGE, ErrInvalidConfig)
	}
	qp := &QP{dev: d, pd: pd, sendCQ: a.SendCQ, recvCQ: a.RecvCQ, srq: a.SRQ, init: a, transport: tr, commEstCh: make(chan struct{}),
		failCh: make(chan struct{})}
	qp.initRoles()
	if a.SRQ != nil {
		qp.resp.srqWQE.sges = make([]memreg.SGE, 0, a.SRQ.maxSGE)
	}
	// The rings start small and grow (doubling) to max_send_wr and
	// max_recv_wr as WRs are posted: an idle QP costs little memory.
	// A ring has at least one slot, so no index is taken modulo 0 (with
	// max_send_wr 0 the slot holds a keep-alive probe; with max_recv_wr
	// 0 it stays unused).
	qp.setSQ(growRing[sendWQE](nil, 0, 0, max(1, min(a.MaxSendWR, ringStart)), a.MaxSGE))
	qp.setRQ(growRing[recvWQE](nil, 0, 0, max(1, min(a.MaxRecvWR, ringStart)), a.MaxSGE))
	qp.resp.res = make([]rdRes, d.cfg.MaxRdAtomic)
	qp.ccInit()
	qp.initTimers()

	d.mu.Lock()
	defer d.mu.Unlock()
	// Checked under mu: Close snapshots the QPs under mu after setting
	// closed, so a QP is either in its snapshot (and flushed) or refused.
	if d.isClosed() {
		return nil, ErrClosed
	}
	if a.SendCQ.destroyed || a.RecvCQ.destroyed {
		return nil, fmt.Errorf("transport: CreateQP: cq: %w", ErrDestroyed)
	}
	if a.SRQ != nil && a.SRQ.destroyed {
		return nil, fmt.Errorf("transport: CreateQP: srq: %w", ErrDestroyed)
	}
	if len(d.qps) >= d.cfg.MaxQP {
		return nil, fmt.Errorf("transport: CreateQP: the device holds %d QPs, its DeviceConfig.MaxQP: %w", len(d.qps), ErrLimit)
	}
	if err := pd.Acquire(); err != nil {
		return nil, fmt.Errorf("transport: CreateQP: pd: %w", err)
	}
	n, err := d.qpns.alloc(d.now(), func(n uint32) bool { _, busy := d.qps[n]; return busy })
	if err != nil {
		pd.Release()
		return nil, err
	}
	qp.qpn = n
	a.SendCQ.users++
	a.RecvCQ.users++
	if a.SRQ != nil {
		a.SRQ.users++
	}
	qp.rv = pd.ForQP(qp.qpn)
	if a.Type == QPTypeUD {
		qp.srcPort = udSourcePort(qp.qpn)
	}
	d.qps[qp.qpn] = qp
	d.qpTab.set(qp.qpn, qp)
	return qp, nil
}

// CommEstablished returns a channel that is closed when the QP receives
// its first packet from the peer, in RTR (the event EventCommEst also
// reports it) or in RTS: a connection manager waiting for an RTU — with
// the QP in RTS already, as Linux's rdma_accept leaves it before its REP —
// takes it as one.
func (qp *QP) CommEstablished() <-chan struct{} { return qp.commEstCh }

// QPN returns the QP number.
func (qp *QP) QPN() uint32 { return qp.qpn }

// PD returns the QP's protection domain.
func (qp *QP) PD() *memreg.PD { return qp.pd }

// Destroy moves the QP to ERR (flushing its work requests), removes it
// from the device and releases its PD and CQs. Destroying it again returns
// ErrDestroyed; on a closed device (whose Close released the QP) it
// returns ErrClosed.
func (qp *QP) Destroy() error {
	qp.mu.Lock()
	switch {
	case qp.dev.isClosed():
		qp.mu.Unlock()
		return fmt.Errorf("transport: Destroy qp %#x: %w", qp.qpn, ErrClosed)
	case qp.destroyed:
		qp.mu.Unlock()
		return fmt.Errorf("transport: Destroy qp %#x: %w", qp.qpn, qp.destroyedErr())
	}
	if qp.failErr == nil && !qp.failed {
		qp.failErr = qp.destroyedErr()
	}
	qp.enterError(false)
	qp.stopTimersLocked()
	qp.destroyed = true
	qp.roomFreed() // waiters for send-queue room return ErrDestroyed
	qp.mu.Unlock()
	qp.detach()
	return nil
}

// detach removes a QP that was just marked destroyed from its device and
// releases its hold on its PD, CQs and SRQ. Called once per QP, by
// whoever set destroyed (Destroy or Device.Close).
func (qp *QP) detach() {
	d := qp.dev
	d.mu.Lock()
	if d.qps[qp.qpn] == qp {
		delete(d.qps, qp.qpn)
		d.qpTab.set(qp.qpn, nil)
	}
	qp.sendCQ.users--
	qp.recvCQ.users--
	if qp.srq != nil {
		qp.srq.users--
	}
	d.mu.Unlock()
	qp.pd.Release()
}

// State returns the current QP state.
func (qp *QP) State() QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.attr.State
}

// Query returns the QP's current attributes. On a closed device it
// returns ErrClosed.
func (qp *QP) Query() (QPAttr, error) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.dev.isClosed() {
		return QPAttr{}, fmt.Errorf("transport: Query qp %#x: %w", qp.qpn, ErrClosed)
	}
	a := qp.attr
	if a.State >= QPSRTS {
		a.SQPSN = uint32(qp.req.psn)
	}
	if a.State >= QPSRTR {
		a.RQPSN = uint32(qp.resp.psn)
	}
	return a, nil
}

// input dispatches a received packet. Called from the device receive
// goroutine with batched set: what the packet makes the QP send is queued
// and flushed at the end of the received batch (Device.flushPending).
// Without batched it is sent before input returns.
func (qp *QP) input(p *packetT, up *udp.Packet, batched bool) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if batched {
		qp.rxIn = true
		defer func() { qp.rxIn = false }()
		qp.inputLocked(p, up, true)
		if qp.nout > 0 {
			qp.queuedInBatch()
		}
		return
	}
	qp.afterTakenResponses()
	qp.inputLocked(p, up, false)
}

// afterTakenResponses returns, with qp.mu held as on entry, once no
// received batch's responses are on their way to the link outside the
// QP: Device.flushPending takes them out of their QPs (coalesce.go) and
// holds respMu until it has sent them. A packet handled outside the
// receive path (HandlePacket) is answered right away, from the QP; its
// ACK for a WRITE at PSN p+1 left before a taken READ response for PSN p
// (TestReadResponseNotOvertakenByHandlePacket). Found free while qp.mu
// is held, respMu says that whatever was taken of the QP is sent, and a
// flushPending that starts later waits for qp.mu before it takes
// anything of it. Not waited for under qp.mu: flushPending takes qp.mu
// under respMu.
func (qp *QP) afterTakenResponses() {
	for !qp.dev.respMu.TryLock() {
		qp.mu.Unlock()
		qp.dev.respMu.Lock()
		qp.dev.respMu.Unlock()
		qp.mu.Lock()
	}
	qp.dev.respMu.Unlock()
}

// beginBatchInput takes the QP for a run of packets of a received batch
// (Device.inputBatch): its lock, and the batch clock. endBatchInput gives
// both back.
func (qp *QP) beginBatchInput() {
	qp.mu.Lock()
	qp.rxIn = true
}

// endBatchInput ends the QP's run of packets in a received batch. What
// the run made the QP queue is noted here, once per run (not per
// packet): the QP goes on the device's list of QPs to flush at the
// batch's end (rxPending), and the batch is marked as having queued more
// than bare ACKs (rxDataQueued) if it did.
func (qp *QP) endBatchInput() {
	if qp.nout > 0 {
		qp.queuedInBatch()
	}
	qp.rxIn = false
	qp.mu.Unlock()
}

// queuedInBatch records that the QP has packets queued at the end of its
// run in a received batch (endBatchInput). Called with qp.mu held.
func (qp *QP) queuedInBatch() {
	d := qp.dev
	if !qp.rxQueued {
		qp.rxQueued = true
		d.rxPending = append(d.rxPending, qp)
	}
	if !d.rxDataQueued && !qp.acksOnlyQueued() {
		d.rxDataQueued = true
	}
}

// inputLocked is input with qp.mu held (and, for a batched packet, rxIn
// set: Device.inputBatch, between beginBatchInput and endBatchInput).
func (qp *QP) inputLocked(p *packetT, up *udp.Packet, batched bool) {
	st := qp.attr.State
	bt := p.BTH
	_ = bt[bth.Size-1] // parsed: a whole BTH, so PKey needs no bounds checks
	// The usual packet passes every check of inputChecks, which are made
	// here in one test: an RC packet (not a CNP) for an RC QP (not QP1,
	// not UD) in RTR, RTS, SQD or SQE, not destroyed, with the default
	// partition key, from the peer's address exactly as stored. Any
	// other packet gets inputChecks' checks one by one, in their order,
	// with their counters (TestInputFastGate).
	if p.Info.Transport != bth.TransportRC || qp.transport != bth.TransportRC ||
		uint8(st-QPSRTR) > uint8(QPSSQE-QPSRTR) || qp.destroyed ||
		bt.PKey()&0x7fff != bth.DefaultPKey&0x7fff || up.Addr != qp.peer {
		if !qp.inputChecks(p, up, batched, st) {
			return
		}
	}
	inc(&qp.dev.ctr.RcvdPkts)
	qp.heard++
	if up.TOS&udp.ECNMask == udp.ECNCE {
		qp.ceMarked()
	}
	if !qp.commEst {
		qp.commEst = true
		close(qp.commEstCh)
		if st == QPSRTR {
			qp.dev.raise(AsyncEvent{Type: EventCommEst, QP: qp})
		}
	}
	qp.rxBatch = batched
	if qp.trace != nil && p.Info.Request && p.Info.Kind != bth.KindSend && p.Info.Kind != bth.KindWrite {
		qp.trace("rx req %v psn %v (resp.psn %v)", p.BTH.Opcode(), p.BTH.PSN(), qp.resp.psn)
	}
	if p.Info.Request {
		// responder.input in line: held behind a READ response under
		// way, or handled now.
		if r := &qp.resp; r.rd.active || r.held.n() > 0 {
			r.hold(p)
		} else {
			r.inputNow(p)
		}
	} else if st >= QPSRTS {
		qp.comp.input(p)
		if qp.schedMarked {
			qp.dev.sched.account(qp) // ACKed: room for the scheduler
		}
	}
	qp.settle()
	qp.rxBatch = false
	if !batched {
		qp.flushOut()
	}
	// Batched, what it queued is noted at the end of the QP's run of
	// packets (endBatchInput).
}

// inputChecks makes inputLocked's checks of a packet one by one: it
// drops and counts one for a QP in the wrong state, with a foreign
// partition key or from another address; hands a CNP, a MAD (QP1) or a
// UD datagram to their handlers; and reports whether p is for the
// responder or completer (the rest of inputLocked) — then it has not
// counted it.
func (qp *QP) inputChecks(p *packetT, up *udp.Packet, batched bool, st QPState) bool {
	if st < QPSRTR || st == QPSErr || qp.destroyed {
		inc(&qp.dev.ctr.WrongState)
		if qp.trace != nil && st != QPSErr {
			qp.trace("drop %v psn %v state %v", p.BTH.Opcode(), p.BTH.PSN(), st)
		}
		return false
	}
	bt := p.BTH
	_ = bt[bth.Size-1] // parsed: a whole BTH, so PKey needs no bounds checks
	if bt.PKey()&0x7fff != bth.DefaultPKey&0x7fff {
		inc(&qp.dev.ctr.WrongPeer)
		return false
	}
	if p.Info.Transport == bth.TransportCNP {
		inc(&qp.dev.ctr.RcvdPkts)
		qp.cnpInput(up)
		return false
	}
	if qp.qpn == 1 {
		inc(&qp.dev.ctr.RcvdPkts)
		qp.dev.gsi.input(p, up)
		return false
	}
	if qp.init.Type == QPTypeUD {
		inc(&qp.dev.ctr.RcvdPkts)
		qp.rxBatch = batched
		qp.udInput(p, up)
		qp.settle()
		qp.rxBatch = false
		return false
	}
	// qp.peer is unmapped (Modify): a source equal to it needs no Unmap.
	if src := up.Addr; src != qp.peer && src.Unmap() != qp.peer {
		inc(&qp.dev.ctr.WrongPeer)
		if qp.trace != nil {
			qp.trace("drop %v psn %v from %v pkey %#x", p.BTH.Opcode(), p.BTH.PSN(), src, p.BTH.PKey())
		}
		return false
	}
	return true
}

// acksOnlyQueued reports whether every queued packet is a bare ACK (or
// NAK). Called with qp.mu held.
func (qp *QP) acksOnlyQueued() bool {
	for i := 0; i < qp.nout; i++ {
		if bth.Opcode(qp.out[i].Buf[0]) != bth.RCAck {
			return false
		}
	}
	return true
}

func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("transport: "+format+": %w", append(args, sentinel)...)
}

// ringStart is the initial size of a QP's send and receive rings.
const ringStart = 4

// sqAt returns the send WQE with index i.
func (qp *QP) sqAt(i uint64) *sendWQE {
	if m := qp.sqMask; m != 0 {
		return &qp.sq[i&m]
	}
	return &qp.sq[i%uint64(len(qp.sq))]
}

// rqAt returns the receive WQE with index i.
func (qp *QP) rqAt(i uint64) *recvWQE {
	if m := qp.rqMask; m != 0 {
		return &qp.rq[i&m]
	}
	return &qp.rq[i%uint64(len(qp.rq))]
}

// setSQ makes r the send ring.
func (qp *QP) setSQ(r []sendWQE) { qp.sq, qp.sqMask = r, ringMask(len(r)) }

// setRQ makes r the receive ring.
func (qp *QP) setRQ(r []recvWQE) { qp.rq, qp.rqMask = r, ringMask(len(r)) }

// ringMask returns n-1 when n is a power of two, else 0 (see QP.sqMask).
func ringMask(n int) uint64 {
	if n > 1 && n&(n-1) == 0 {
		return uint64(n - 1)
	}
	return 0
}

// sqRoom makes room for one more send WQE (the caller checked
// max_send_wr), doubling the ring when it is full.
func (qp *QP) sqRoom() {
	if qp.sqEnd-qp.sqHead == uint64(len(qp.sq)) {
		qp.growSQ()
	}
}

// growSQ doubles the full send ring (sqRoom's rare case, out of line so
// that sqRoom is inlined into PostSend).
func (qp *QP) growSQ() {
	qp.setSQ(growRing(qp.sq, qp.sqHead, qp.sqEnd, min(2*len(qp.sq), qp.init.MaxSendWR+1), qp.init.MaxSGE)) // +1: a keep-alive probe
}

// rqRoom does for the receive ring what sqRoom does for the send ring.
func (qp *QP) rqRoom() {
	if qp.rqEnd-qp.rqHead == uint64(len(qp.rq)) {
		qp.growRQ()
	}
}

// growRQ doubles the full receive ring (see growSQ).
func (qp *QP) growRQ() {
	qp.setRQ(growRing(qp.rq, qp.rqHead, qp.rqEnd, min(2*len(qp.rq), qp.init.MaxRecvWR), qp.init.MaxSGE))
}

// wqe is what a ring holds: a send or a receive WQE with its SGE list.
type wqe interface{ sendWQE | recvWQE }

// growRing returns a ring of n entries holding old's entries with indexes
// [head, end) at their new slots (index mod n); every other slot gets an
// SGE list with room for maxSGE.
func growRing[T wqe](old []T, head, end uint64, n, maxSGE int) []T {
	r := make([]T, n)
	for i := head; i != end; i++ {
		r[i%uint64(n)] = old[i%uint64(len(old))]
	}
	for i := range r {
		idx := uint64(i)
		// Slots not filled from old get a fresh SGE list.
		if len(old) != 0 && inRing(idx, head, end, uint64(n)) {
			continue
		}
		switch e := any(&r[i]).(type) {
		case *sendWQE:
			e.sges = make([]memreg.SGE, 0, maxSGE)
		case *recvWQE:
			e.sges = make([]memreg.SGE, 0, maxSGE)
		}
	}
	return r
}

// inRing reports whether slot s of an n-slot ring holds one of the indexes
// [head, end).
func inRing(s, head, end, n uint64) bool {
	if end-head >= n {
		return true
	}
	a, b := head%n, end%n
	if a <= b {
		return s >= a && s < b
	}
	return s >= a || s < b
}
