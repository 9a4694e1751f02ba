package transport

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// Selective repeat (IRN, "Revisiting Network Support for RDMA", SIGCOMM
// 2018) between two rocev2 peers that negotiated it (QPAttr.SelectiveRepeat,
// set on both QPs by the application or by the CM after an ECE exchange).
// Every other QP runs go-back-N exactly as before: qp.sr is nil and none of
// this file runs.
//
// Responder. A request ahead of the expected PSN (ePSN) is held, if it
// falls within SRConfig.Window PSNs of it: its bytes are copied into a
// buffer from the device's packet pool, in the slot PSN mod Window. It is
// executed later, in PSN order, once the packets before it arrived: so a
// WRITE's MIDDLE and LAST packets reach their address through the RETH of
// their FIRST packet as always, every message completes in order and
// exactly once, and READ and atomic requests keep their execution order
// and replay rules (a duplicate READ or atomic is replayed from the saved
// resources, never executed twice). Each held packet is answered with a
// selective NAK: an RC ACKNOWLEDGE with a NAK "PSN sequence error" AETH
// whose BTH PSN is the ePSN (the cumulative acknowledgement, as in a
// standard sequence NAK), followed by a SACK block (aeth.SACK) whose bitmap
// names every PSN held beyond the ePSN. Within a received batch a newer
// selective NAK replaces a queued one, as positive ACKs are coalesced.
// A request dropped (beyond the window or MaxHeld) or held already draws
// one only if it would say something the last one did not: as go-back-N
// NAKs a gap once, a stream of them gets no packet back per packet.
//
// Requester. It keeps, per outstanding PSN, whether it is done (a SEND or
// WRITE packet acknowledged or held by the responder, a READ response or
// atomic ACK received) and whether it was resent in the current recovery
// round. A selective NAK, an ACK or a response beyond a PSN that is not
// done marks that PSN lost; the requester resends only those packets (for
// a READ, one READ request for each run of missing responses, which the
// responder answers from its saved resources), once per round. READ
// responses and atomic ACKs are placed when they arrive, in any order; a
// message completes when all its PSNs are done, in order. Two
// retransmission timeouts as IRN: RTOLow while at most LowThreshold packets
// are outstanding, RTOHigh otherwise; an expiry resends every outstanding
// PSN not done, and counts against retry_cnt only once per local ACK
// timeout (QPAttr.Timeout) without progress, so that the short timeouts do
// not exhaust the retries. Packets in flight are capped at MaxInflight (a
// bandwidth-delay product), below MaxUnackedPSNs. DCQCN paces resends as
// any other request.
//
// Memory. A QP without selective repeat has a nil pointer. With it, the
// state is about 3.5 KiB with the default window of 128 (srState), and the
// held packets take at most Window pool buffers of udp.MaxPacketSize bytes
// (128 × 4224 B = 528 KiB per QP at the default; SRMemoryWorstCase; Go's
// allocator rounds each buffer up to 4864 B, 608 KiB), given back as they
// are executed or when the QP leaves RTR/RTS, and all the device's QPs hold
// at most SRConfig.MaxHeld packets together.

// SRConfig configures selective repeat on a device's QPs that negotiated
// it. The zero value selects every default.
type SRConfig struct {
	// Window is how many PSNs ahead of the expected one the responder
	// holds out-of-order packets for (default 128, at most
	// aeth.SACKMaxBits = 256). Its worst-case memory per QP is
	// Window × udp.MaxPacketSize bytes (SRMemoryWorstCase).
	Window int
	// MaxInflight caps the packets a requester has in flight (IRN's
	// BDP-FC): set it near the path's bandwidth-delay product in packets
	// (default 128: 100 Gbit/s × 40 µs at MTU 4096; at most 1024). The
	// requester's window is the smaller of it and MaxUnackedPSNs.
	MaxInflight int
	// RTOLow is the retransmission timeout while at most LowThreshold
	// packets are outstanding (default 1 ms).
	RTOLow time.Duration
	// RTOHigh is the retransmission timeout otherwise (default 4 ms).
	// Both are capped at the QP's local ACK timeout.
	RTOHigh time.Duration
	// LowThreshold is the number of outstanding packets up to which
	// RTOLow applies (default 3, IRN's N).
	LowThreshold int
	// MaxHeld is the most out-of-order packets all the device's QPs
	// hold together (default 8192: about 38 MiB of pool buffers). Each
	// QP holds at most Window, but a peer that sends every QP it has a
	// window of tiny packets ahead of a gap made the device hold a
	// 4.75 KiB buffer for each (1.2 GiB for 1000 QPs from 9 MB sent,
	// hostile26). A packet beyond it is dropped and counted
	// (sr_hold_full) as one beyond the window is: the requester sends it
	// again, as go-back-N would.
	MaxHeld int
}

// srRingBits is the size of the requester's per-PSN bitmaps: MaxInflight
// never exceeds it, so every request packet in flight has its bit. A READ
// longer than the rest of the ring has its far responses kept as runs
// (srState.far) until the ring reaches them; nothing beyond the ring is
// resent before it does.
const srRingBits = 1024

// srFarRuns is how many runs of far READ responses a requester keeps at
// most (8 KiB; one run per loss past the ring: a 64 MiB READ at MTU 1024
// at 1 % loss has ~650). A response that would need more is dropped and
// asked for again when the ring reaches it.
const srFarRuns = 1024

// srRun is the PSNs [from, to).
type srRun struct{ from, to bth.PSN }

// normalize fills in the defaults and checks the ranges.
func (c SRConfig) normalize() (SRConfig, error) {
	if c.Window == 0 {
		c.Window = 128
	}
	if c.Window < 1 || c.Window > aeth.SACKMaxBits {
		return c, fmt.Errorf("transport: NewDevice: SelectiveRepeat.Window %d out of range 1..%d: %w", c.Window, aeth.SACKMaxBits, ErrInvalidConfig)
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = 128
	}
	if c.MaxInflight < 1 || c.MaxInflight > srRingBits {
		return c, fmt.Errorf("transport: NewDevice: SelectiveRepeat.MaxInflight %d out of range 1..%d: %w", c.MaxInflight, srRingBits, ErrInvalidConfig)
	}
	if c.RTOLow == 0 {
		c.RTOLow = time.Millisecond
	}
	if c.RTOHigh == 0 {
		c.RTOHigh = 4 * time.Millisecond
	}
	if c.RTOLow < 0 || c.RTOHigh < 0 || c.RTOHigh < c.RTOLow {
		return c, fmt.Errorf("transport: NewDevice: SelectiveRepeat RTOLow %v RTOHigh %v (want 0 < RTOLow <= RTOHigh): %w", c.RTOLow, c.RTOHigh, ErrInvalidConfig)
	}
	if c.LowThreshold == 0 {
		c.LowThreshold = 3
	}
	if c.LowThreshold < 0 {
		return c, fmt.Errorf("transport: NewDevice: SelectiveRepeat.LowThreshold %d < 0: %w", c.LowThreshold, ErrInvalidConfig)
	}
	if c.MaxHeld == 0 {
		c.MaxHeld = 8192
	}
	if c.MaxHeld < 0 {
		return c, fmt.Errorf("transport: NewDevice: SelectiveRepeat.MaxHeld %d < 0: %w", c.MaxHeld, ErrInvalidConfig)
	}
	return c, nil
}

// SRMemoryWorstCase returns the most memory one QP with selective repeat
// can hold in out-of-order packets under cfg (its defaults filled in):
// Window packet buffers of udp.MaxPacketSize bytes.
func SRMemoryWorstCase(cfg SRConfig) int {
	c, err := cfg.normalize()
	if err != nil {
		return 0
	}
	return c.Window * udp.MaxPacketSize
}

// srSlot is one held out-of-order request packet.
type srSlot struct {
	buf  *[udp.MaxPacketSize]byte // nil: the slot is free
	n    int32                    // packet length
	span int32                    // PSNs the request covers (a READ: its response packets)
	psn  bth.PSN
}

// srState is the selective repeat state of a QP (nil without it).
type srState struct {
	// responder
	slots []srSlot // Window slots, PSN mod Window
	held  int      // slots in use
	words [aeth.SACKMaxWords]uint32
	sack  [aeth.SACKMaxSize]byte
	// told is what the last selective NAK said (toldOn): its PSN (the
	// expected PSN), MSN and bitmap. A request the responder drops or
	// already holds draws a selective NAK only when it would say
	// something else (srSendSACK).
	told      [aeth.SACKMaxWords]uint32
	toldPSN   bth.PSN
	toldMSN   uint32
	toldWords int8
	toldOn    bool

	// requester: bit PSN mod srRingBits for the PSNs [base, base+srRingBits)
	done [srRingBits / 64]uint64 // acknowledged, held by the responder, or answered
	pend [srRingBits / 64]uint64 // resent in this round, or a held READ/atomic: do not resend
	base bth.PSN                 // comp.psn when the bitmaps were last trimmed
	// far holds the READ responses received beyond the ring (a READ
	// longer than the ring's rest, while a lost response holds comp.psn
	// back), as runs of PSNs in order; srSync moves them into done as the
	// ring reaches them. Without it they were taken for lost: each later
	// response asked for them again, and a 3 MB READ at 0.1 % loss was
	// sent ~370 times over.
	far []srRun // sorted, disjoint, not adjacent; nil until a READ needs it
	// edge is the ring's end where a recovery stopped (edgeOn): what is
	// lost beyond it is resent once the ring has moved a quarter on, in
	// one READ request per run, not one per PSN the ring moves.
	edge    bth.PSN
	edgeOn  bool
	ackedTo bth.PSN // the highest cumulative acknowledgement applied + 1
	hi      bth.PSN // PSNs before hi that are not done are lost
	lost    bool    // hi is set: a recovery is due
	due     bool    // srRecover must run (req.progress)
	// progressAt is when the requester last made progress: the short
	// timeouts count against retry_cnt once per local ACK timeout
	// without progress.
	progressAt time.Time
	// Round-trip time (RFC 6298's estimator): one PSN timed at a time,
	// never a resent one (Karn); the timeouts are at least
	// srtt + 4 rttvar, doubled per expiry without progress (backoff).
	// mark is the next PSN when the last resend went out (markOn): an
	// answer for a PSN at or past it, while a PSN resent before it is
	// still missing, means the resend was lost too: it goes again at
	// once instead of at the next timeout.
	mark   bth.PSN
	markOn bool
	// probe is the PSN a timeout resent alone (probeOn); probeMark the
	// next PSN then.
	probe, probeMark bth.PSN
	probeOn          bool
	// late: the expiry srTimeout handles came while this process was
	// behind on its input (onRetransTimer): it spends no retry.
	late bool
	// round is, per PSN (mod srRingBits), the srRecover call that last
	// resent it (0: not resent since the last timeout); rounds counts them.
	round        *[srRingBits]uint16
	rounds       uint16
	rttPSN       bth.PSN
	rttAt        time.Time
	rttOn        bool
	srtt, rttvar time.Duration
	backoff      uint8
}

// srEnable gives a QP moving to RTR with QPAttr.SelectiveRepeat its state,
// or drops it (go-back-N).
func (qp *QP) srEnable(on bool) {
	qp.srFree()
	if !on {
		qp.sr = nil
		return
	}
	if qp.sr == nil || len(qp.sr.slots) != qp.dev.cfg.SelectiveRepeat.Window {
		qp.sr = &srState{slots: make([]srSlot, qp.dev.cfg.SelectiveRepeat.Window), round: new([srRingBits]uint16)}
	}
}

// srFree gives the held packets back to the device's pool (the QP left
// RTR/RTS, or reset).
func (qp *QP) srFree() {
	s := qp.sr
	if s == nil {
		return
	}
	for i := range s.slots {
		if b := s.slots[i].buf; b != nil {
			qp.srRelease(b)
		}
		s.slots[i] = srSlot{}
	}
	s.held = 0
	s.toldOn = false
}

// srResetReq resets the requester's bitmaps for a QP entering RTS at psn.
func (qp *QP) srResetReq(psn bth.PSN) {
	if s := qp.sr; s != nil {
		// The responder's half (held packets) stays as RTR set it.
		*s = srState{slots: s.slots, held: s.held, round: s.round, base: psn, ackedTo: psn, hi: psn}
		*s.round = [srRingBits]uint16{}
	}
}

// SelectiveRepeat reports whether the QP runs selective repeat (both ends
// set QPAttr.SelectiveRepeat, or the CM negotiated it).
func (qp *QP) SelectiveRepeat() bool {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.sr != nil
}

// ---- responder ----

// srHold holds the request p, d PSNs ahead of the expected PSN, and answers
// with a selective NAK. Called with qp.mu held.
func (qp *QP) srHold(p *packetT, psn bth.PSN, d int32) {
	s, r := qp.sr, &qp.resp
	w := int32(len(s.slots))
	if !r.nakSent {
		r.nakSent = true
		inc(&qp.dev.ctr.OutOfSeqRequest)
	}
	if d >= w {
		inc(&qp.dev.ctr.SROutOfWindow)
		qp.srSendSACK(sackForce)
		return
	}
	sl := &s.slots[uint32(psn)%uint32(w)]
	if sl.buf != nil {
		if sl.psn == psn {
			inc(&qp.dev.ctr.DuplicateRequest)
			qp.srSendSACK(0)
			return
		}
		if sl.psn.Diff(r.psn) > 0 {
			// Another request ahead holds the slot: psn lies in the
			// response range of a held READ longer than the window (a
			// resent part of it). That READ answers it when it runs.
			inc(&qp.dev.ctr.SROutOfWindow)
			qp.srSendSACK(0)
			return
		}
		// A packet behind the expected PSN (a READ's range was skipped).
		qp.srRelease(sl.buf)
		*sl = srSlot{}
		s.held--
	}
	raw := p.BTH[:bth.Size+p.Info.HeaderLen+len(p.Payload)+int(p.BTH.PadCount())+packet.ICRCSize]
	span := int32(1)
	if p.Info.Kind == bth.KindReadRequest && qp.mtu > 0 {
		if n := p.RETH.DMALength(); n <= 1<<31 {
			span = int32(min(npkts(n, qp.mtu), int(w)))
		}
	}
	if qp.dev.srHeld.Add(1) > int64(qp.dev.cfg.SelectiveRepeat.MaxHeld) {
		qp.dev.srHeld.Add(-1)
		inc(&qp.dev.ctr.SRHoldFull)
		qp.srSendSACK(0)
		return
	}
	buf := qp.dev.getBuf()
	*sl = srSlot{buf: buf, n: int32(copy(buf[:], raw)), span: span, psn: psn}
	s.held++
	inc(&qp.dev.ctr.SRHeld)
	qp.srSendSACK(0)
}

// srRelease gives a held packet's buffer back to the device's pool.
func (qp *QP) srRelease(buf *[udp.MaxPacketSize]byte) {
	qp.dev.bufs.Put(buf)
	qp.dev.srHeld.Add(-1)
}

// srDrain executes the held packets that are now in sequence, after the
// request at prev was executed. Called with qp.mu held.
func (qp *QP) srDrain(prev bth.PSN) {
	s, r := qp.sr, &qp.resp
	if s.held == 0 || r.rd.active {
		// With a READ response under way, the rest waits for it
		// (responder.progress calls srDrain when it is complete).
		return
	}
	w := uint32(len(s.slots))
	var pk packetT
	for s.held > 0 && prev.Before(r.psn) {
		if st := qp.attr.State; st != QPSRTR && st != QPSRTS && st != QPSSQD {
			return
		}
		// Slots the executed request skipped (a READ's response PSNs)
		// hold nothing of use any more.
		for q, k := prev.Add(1), uint32(0); q != r.psn && k < w; q, k = q.Add(1), k+1 {
			if sl := &s.slots[uint32(q)%w]; sl.buf != nil && sl.psn == q {
				qp.srRelease(sl.buf)
				*sl = srSlot{}
				s.held--
			}
		}
		sl := &s.slots[uint32(r.psn)%w]
		if sl.buf == nil || sl.psn != r.psn {
			break
		}
		buf, n := sl.buf, sl.n
		*sl = srSlot{}
		s.held--
		prev = r.psn
		if pk.Decode(buf[:n]) == packet.FaultNone {
			r.nakSent = false
			qp.resp.execute(&pk, prev)
		}
		qp.srRelease(buf)
		if r.rd.active {
			return // a READ response under way: no SACK before its end
		}
		if r.psn == prev { // RNR NAK or an error: the requester resends
			break
		}
	}
	if s.held > 0 {
		if st := qp.attr.State; st == QPSRTR || st == QPSRTS || st == QPSSQD {
			qp.srSendSACK(0)
		}
	}
}

// srDuplicate answers a duplicate SEND/WRITE while packets are held: a
// selective NAK tells the requester the holes as well. It reports false
// when nothing is held (the caller re-ACKs as usual).
func (qp *QP) srDuplicate(p *packetT) bool {
	if qp.sr.held == 0 || (p.Info.Kind != bth.KindSend && p.Info.Kind != bth.KindWrite) {
		return false
	}
	return qp.srSendSACK(sackRepeat)
}

// srAtNext reports whether p, for the requester's next PSN (not an
// outstanding one), is a sequence NAK: the responder received everything
// sent, so it acknowledges every PSN before it.
func (qp *QP) srAtNext(p *packetT, psn bth.PSN) bool {
	return psn == qp.req.nextPSN() && p.Info.Kind == bth.KindAck && p.AETH.Syndrome() == aeth.NAK(aeth.NAKPSNSeqError)
}

// srSendSACK's flags.
const (
	// sackForce: send even with nothing held ahead of the expected PSN
	// (a packet beyond the window was dropped).
	sackForce = 1 << iota
	// sackRepeat: send even when the last selective NAK said the same
	// (the answer to a duplicate request, which go-back-N re-ACKs too).
	sackRepeat
)

// srSendSACK queues a selective NAK for the expected PSN with the bitmap of
// the held packets. A selective NAK queued last (in this batch) is
// rewritten instead: the newer one says all the older one did. Held
// packets the expected PSN passed are freed; when none is left ahead of it
// nothing is sent (unless sackForce: a packet beyond the window was
// dropped) and srSendSACK reports false.
//
// Unless sackRepeat, nothing is sent either when the last selective NAK
// said the same (PSN, MSN and bitmap): the requester knows it, and a
// stream of requests the responder drops or already holds (beyond the
// window or MaxHeld, copies of a held one) drew one selective NAK each —
// a reflection to whoever sent them, where go-back-N NAKs a gap once and
// then drops silently. A lost selective NAK is made up for by the next
// one the responder's progress or a newly held packet draws, or by the
// requester's timeout.
func (qp *QP) srSendSACK(flags int) bool {
	s, r := qp.sr, &qp.resp
	nw := (len(s.slots) + 31) / 32
	words := s.words[:nw]
	clear(words)
	ahead := 0
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.buf == nil {
			continue
		}
		d := int(sl.psn.Diff(r.psn))
		if d < 1 {
			qp.srRelease(sl.buf)
			*sl = srSlot{}
			s.held--
			continue
		}
		ahead++
		for j := d - 1; j >= 0 && j < d-1+int(sl.span) && j < 32*nw; j++ {
			words[j/32] |= 1 << (31 - uint(j%32))
		}
	}
	if ahead == 0 && flags&sackForce == 0 {
		return false
	}
	if s.toldOn && s.toldPSN == r.psn && s.toldMSN == r.msn && int(s.toldWords) == nw &&
		s.words == s.told && flags&sackRepeat == 0 {
		return true // said already
	}
	s.toldOn, s.toldPSN, s.toldMSN, s.toldWords, s.told = true, r.psn, r.msn, int8(nw), s.words
	sackLen := aeth.SACKSize(nw)
	if qp.nout > 0 {
		b := qp.out[qp.nout-1].Buf
		if len(b) == bth.Size+aeth.Size+sackLen+packet.ICRCSize && bth.BTH(b).Opcode() == bth.RCAck &&
			aeth.IsSACK(b[bth.Size+aeth.Size:bth.Size+aeth.Size+sackLen]) {
			bth.BTH(b).SetPSN(r.psn)
			aeth.AETH(b[bth.Size:]).SetMSN(r.msn)
			aeth.EncodeSACK(b[bth.Size+aeth.Size:], words)
			return true
		}
	}
	f := &qp.respF
	*f = packet.Fields{}
	f.BTH.Opcode = bth.RCAck
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qp.attr.DestQPN
	f.BTH.PSN = r.psn
	f.AETH.Syndrome = aeth.NAK(aeth.NAKPSNSeqError)
	f.AETH.MSN = r.msn
	f.Payload = s.sack[:aeth.EncodeSACK(s.sack[:], words)]
	buf := qp.outBufN(packet.Len(bth.RCAck, len(f.Payload)))
	if n, err := packet.Build(buf, f); err == nil {
		qp.commit(n)
		inc(&qp.dev.ctr.SRSACKSent)
	}
	return true
}

// ---- requester ----

func (s *srState) in(q bth.PSN) bool { d := q.Diff(s.base); return d >= 0 && d < srRingBits }
func srBit(q bth.PSN) (int, uint64)  { i := uint32(q) % srRingBits; return int(i / 64), 1 << (i % 64) }
func (s *srState) isDone(q bth.PSN) bool {
	if !s.in(q) {
		return s.inFar(q)
	}
	i, m := srBit(q)
	return s.done[i]&m != 0
}
func (s *srState) isPend(q bth.PSN) bool {
	if !s.in(q) {
		return false
	}
	i, m := srBit(q)
	return s.pend[i]&m != 0
}
func (s *srState) setDone(q bth.PSN) {
	if s.in(q) {
		i, m := srBit(q)
		s.done[i] |= m
	} else if s.beyond(q) {
		s.addFar(q)
	}
}

// beyond reports whether q is past the ring's end.
func (s *srState) beyond(q bth.PSN) bool { return q.Diff(s.base) >= srRingBits }

// farIndex returns the index of the run that holds q, or of the first run
// after q.
func (s *srState) farIndex(q bth.PSN) int {
	return sort.Search(len(s.far), func(i int) bool { return q.Before(s.far[i].to) })
}

// inFar reports whether q is in a run of far responses.
func (s *srState) inFar(q bth.PSN) bool {
	i := s.farIndex(q)
	return i < len(s.far) && !q.Before(s.far[i].from)
}

// addFar records the far response q in the runs, or drops it when that
// needs a run more than srFarRuns.
func (s *srState) addFar(q bth.PSN) {
	i := s.farIndex(q)
	if i < len(s.far) && !q.Before(s.far[i].from) {
		return // held already
	}
	if i > 0 && s.far[i-1].to == q { // extends run i-1 upward
		s.far[i-1].to = q.Add(1)
		if i < len(s.far) && s.far[i].from == s.far[i-1].to {
			s.far[i-1].to = s.far[i].to
			s.far = slices.Delete(s.far, i, i+1)
		}
		return
	}
	if i < len(s.far) && q.Add(1) == s.far[i].from {
		s.far[i].from = q
		return
	}
	if len(s.far) == srFarRuns {
		return
	}
	s.far = slices.Insert(s.far, i, srRun{q, q.Add(1)})
}

// foldFar moves the far responses the ring now covers into done, and
// drops the runs the ring passed.
func (s *srState) foldFar() {
	k := 0
	for ; k < len(s.far); k++ {
		r := &s.far[k]
		if r.from.Before(s.base) {
			r.from = s.base
		}
		for ; r.from.Before(r.to) && s.in(r.from); r.from = r.from.Add(1) {
			i, m := srBit(r.from)
			s.done[i] |= m
		}
		if r.from.Before(r.to) {
			break // the rest is past the ring
		}
	}
	if k > 0 {
		s.far = s.far[:copy(s.far, s.far[k:])]
	}
}

// settledFrom returns the first PSN from q on, before end and inside the
// ring, that is neither done nor pending; end, or the ring's end if that
// comes first, when there is none.
func (s *srState) settledFrom(q, end bth.PSN) bth.PSN { return s.scanFrom(q, end, true) }

// unsettledFrom returns the first PSN from q on, before end and inside
// the ring, that is done or pending; end, or the ring's end if that comes
// first, when there is none.
func (s *srState) unsettledFrom(q, end bth.PSN) bth.PSN { return s.scanFrom(q, end, false) }

// scanFrom skips the PSNs from q on that are settled (done or pending)
// when settled, unsettled otherwise, a word of the bitmaps at a time. The
// bits of a word past the ring's end belong to PSNs at its start, so no
// step goes past it, nor past end.
func (s *srState) scanFrom(q, end bth.PSN, settled bool) bth.PSN {
	if re := s.base.Add(srRingBits); re.Before(end) {
		end = re
	}
	for q.Before(end) {
		b := uint32(q) % srRingBits
		w := (s.done[b/64] | s.pend[b/64]) >> (b % 64)
		if settled {
			w = ^w // the PSNs to skip are the 0 bits of w
		}
		if w&1 != 0 {
			return q
		}
		q = q.Add(min(bits.TrailingZeros64(w), 64-int(b%64)))
	}
	return end
}

func (s *srState) setPend(q bth.PSN) {
	if s.in(q) {
		i, m := srBit(q)
		s.pend[i] |= m
	}
}

// anyDone reports whether a PSN of [from, to) is done.
func (s *srState) anyDone(from, to bth.PSN) bool {
	for q := from; q.Before(to) && !s.beyond(q); q = q.Add(1) {
		if s.isDone(q) {
			return true
		}
	}
	i := s.farIndex(from)
	return i < len(s.far) && s.far[i].from.Before(to)
}

// srSync trims the bitmaps to the oldest unacknowledged PSN: the bits of
// the PSNs it passed are cleared for the PSNs that reuse them.
func (qp *QP) srSync() {
	s := qp.sr
	to := qp.comp.psn
	d := to.Diff(s.base)
	if d <= 0 {
		return
	}
	if d >= srRingBits {
		s.done, s.pend = [srRingBits / 64]uint64{}, [srRingBits / 64]uint64{}
		*s.round = [srRingBits]uint16{}
	} else {
		for q := s.base; q != to; q = q.Add(1) {
			i, m := srBit(q)
			s.done[i] &^= m
			s.pend[i] &^= m
			s.round[uint32(q)%srRingBits] = 0
		}
	}
	s.base = to
	if s.ackedTo.Before(to) {
		s.ackedTo = to
	}
	if len(s.far) > 0 {
		s.foldFar()
	}
	if s.edgeOn && s.base.Add(srRingBits).Diff(s.edge) >= srRingBits/4 {
		// A recovery that stopped at the ring's end goes on.
		s.edgeOn = false
		s.due = true
	}
}

// srWindow is the requester's cap on PSNs in flight.
func (qp *QP) srWindow(w int32) int32 {
	return min(w, int32(qp.dev.cfg.SelectiveRepeat.MaxInflight))
}

// srAckEvery is how many packets a selective repeat requester sends at
// most without AckReq: half its window, so that a window smaller than a
// message still gets acknowledged as it fills.
func (qp *QP) srAckEvery() int {
	return max(1, min(qp.dev.cfg.MaxUnackedPSNs, qp.dev.cfg.SelectiveRepeat.MaxInflight)/2)
}

// srRTO is the retransmission timeout: RTOLow with few packets
// outstanding, RTOHigh otherwise, never above the local ACK timeout.
func (qp *QP) srRTO() time.Duration {
	c, s := &qp.dev.cfg.SelectiveRepeat, qp.sr
	to := c.RTOHigh
	if int(qp.req.nextPSN().Diff(qp.comp.psn)) <= c.LowThreshold {
		to = c.RTOLow
	}
	if s.srtt > 0 {
		to = max(to, s.srtt+4*s.rttvar)
	}
	to <<= min(s.backoff, 16)
	return min(to, qp.timeout)
}

// srTimeSent starts a round-trip sample on the newest PSN sent, unless
// one is running. Called by req.progress after it sent new packets.
func (qp *QP) srTimeSent() {
	if s := qp.sr; !s.rttOn && qp.req.nextPSN() != qp.comp.psn {
		s.rttPSN, s.rttAt, s.rttOn = qp.req.nextPSN().Add(-1), qp.now(), true
	}
}

// srRTTSample ends the running sample once comp.psn passed its PSN.
func (qp *QP) srRTTSample() {
	s := qp.sr
	if !s.rttOn || !s.rttPSN.Before(qp.comp.psn) {
		return
	}
	s.rttOn = false
	r := qp.now().Sub(s.rttAt)
	if r <= 0 {
		return
	}
	if s.srtt == 0 {
		s.srtt, s.rttvar = r, r/2
		return
	}
	d := s.srtt - r
	if d < 0 {
		d = -d
	}
	s.rttvar = (3*s.rttvar + d) / 4
	s.srtt = (7*s.srtt + r) / 8
}

// srLostAgain takes an answer for PSN seen: if it is past the last
// resend's mark, the PSNs resent before the mark that are still not done
// were lost again and may be resent.
//
// An answer for a resent PSN does the same for the PSNs resent before it
// (in an earlier or the same srRecover call, in PSN order): resends leave
// in order, so those still missing were lost again.
func (qp *QP) srLostAgain(seen bth.PSN) {
	s := qp.sr
	if !s.markOn {
		return
	}
	limit := s.mark
	var r uint16
	if seen.Before(s.mark) {
		if !s.in(seen) {
			return
		}
		if r = s.round[uint32(seen)%srRingBits]; r == 0 {
			return
		}
		limit = seen
	} else {
		s.markOn = false
	}
	again := false
	for q := qp.comp.psn; q.Before(limit) && s.in(q); q = q.Add(1) {
		i, m := srBit(q)
		if s.done[i]&m != 0 {
			continue
		}
		if qr := s.round[uint32(q)%srRingBits]; r == 0 || (qr != 0 && qr <= r) {
			s.pend[i] &^= m
			again = true
		}
	}
	if again || r == 0 {
		qp.srLost(limit)
	}
}

// srLost records that the PSNs before hi that are not done are lost.
func (qp *QP) srLost(hi bth.PSN) {
	s := qp.sr
	if hi.Before(qp.comp.psn) || hi == qp.comp.psn {
		return
	}
	if !s.lost || s.hi.Before(hi) {
		s.hi = hi
	}
	s.lost = true
	s.due = true
}

// srAcked applies a cumulative acknowledgement: the responder executed
// every request up to and including x. The SEND and WRITE packets up to x
// are done; a READ response or atomic ACK up to x that did not arrive is
// lost.
func (qp *QP) srAcked(x bth.PSN) {
	qp.srAckedBy(x, true)
}

// srAckedBy is srAcked; answers says whether the packet that implies the
// acknowledgement may be the answer to a timeout's probe (not a READ
// response: the READ's own stream, still coming, looks the same).
func (qp *QP) srAckedBy(x bth.PSN, answers bool) {
	s := qp.sr
	qp.srSync()
	if answers {
		qp.srProbeAnswered(x)
	}
	if x.Before(s.ackedTo) {
		return
	}
	end := x.Add(1)
	if !end.Before(qp.req.nextPSN()) {
		end = qp.req.nextPSN()
	}
	from := s.ackedTo
	missing := false
	for i := qp.sqHead; i != qp.sqEnd && qp.req.started(i); i++ {
		w := qp.sqAt(i)
		if !w.firstPSN.Before(end) {
			break
		}
		wend := w.firstPSN.Add(w.npkts)
		if !from.Before(wend) {
			continue
		}
		q := w.firstPSN
		if q.Before(from) {
			q = from
		}
		for ; q.Before(wend) && q.Before(end); q = q.Add(1) {
			if isRdAtomic(w.wr.Opcode) {
				if !s.isDone(q) {
					missing = true
				}
			} else {
				s.setDone(q)
			}
		}
	}
	s.ackedTo = end
	if missing {
		qp.srLostAgain(x)
		qp.srLost(end)
	}
	qp.srAdvance()
}

// srAdvance completes the head WQEs whose PSNs are all done, in order.
func (qp *QP) srAdvance() {
	s := qp.sr
	moved := false
	for {
		w := qp.comp.head()
		if w == nil {
			break
		}
		if w.npkts == 0 { // a local operation: done when reached
			qp.comp.completeHead(w)
			moved = true
			continue
		}
		// A READ or atomic is complete when its responses arrived; a
		// SEND or WRITE when the responder acknowledged it
		// cumulatively (held is not executed).
		end := w.firstPSN.Add(w.npkts)
		rd := isRdAtomic(w.wr.Opcode)
		for qp.comp.psn.Before(end) && qp.comp.psn.Before(qp.req.nextPSN()) {
			if c := qp.comp.psn; (rd && !s.isDone(c)) || (!rd && !c.Before(s.ackedTo)) {
				break
			}
			qp.comp.psn = qp.comp.psn.Add(1)
			moved = true
		}
		if qp.comp.psn != end {
			break
		}
		qp.comp.completeHead(w)
		moved = true
	}
	if moved {
		qp.srSync()
		qp.srRTTSample()
		s.backoff = 0
		if s.probeOn && s.probe.Before(qp.comp.psn) {
			s.probeOn = false // moot: the probed PSN came
		}
		qp.comp.progressed()
	}
}

// srOnAck handles an ACK or a sequence NAK (with its SACK block) in
// selective repeat. It reports false for the other NAKs and RNR NAKs,
// which take the usual path.
func (qp *QP) srOnAck(p *packetT, psn bth.PSN) bool {
	s := qp.sr
	syn := p.AETH.Syndrome()
	switch {
	case syn.Type() == aeth.TypeACK:
		qp.srAcked(psn)
		return true
	case syn.Type() == aeth.TypeNAK && syn.NAKCode() == aeth.NAKPSNSeqError:
	default:
		return false
	}
	inc(&qp.dev.ctr.RcvdSeqErr)
	qp.srAcked(psn.Add(-1))
	hi := psn.Add(1) // the expected PSN itself is missing
	if len(p.Payload) > 0 && aeth.IsSACK(p.Payload) {
		inc(&qp.dev.ctr.SRSACKRcvd)
		sk := aeth.SACK(p.Payload)
		if qp.trace != nil {
			qp.trace("sr sack base %v highest %d (comp.psn %v next %v)", psn, sk.Highest(), qp.comp.psn, qp.req.nextPSN())
		}
		if h := sk.Highest(); h >= 0 {
			// The newest resend the responder holds, then the newest
			// packet it holds.
			for j := h; j >= 0; j-- {
				if q := psn.Add(1 + j); sk.Has(j) && s.in(q) && s.round[uint32(q)%srRingBits] != 0 {
					qp.srLostAgain(q)
					break
				}
			}
			qp.srLostAgain(psn.Add(1 + h))
		}
		qp.srSync()
		// Walk the bits and the WQEs together: a held SEND/WRITE packet
		// is done; a held READ or atomic request is pending (its
		// responses will come; if they are lost, a timeout resends it).
		idx := qp.sqHead
		for j, nb := 0, sk.Bits(); j < nb; j++ {
			if !sk.Has(j) {
				continue
			}
			q := psn.Add(1 + j)
			if !q.Before(qp.req.nextPSN()) {
				break
			}
			for idx != qp.sqEnd && qp.req.started(idx) && !q.Before(qp.sqAt(idx).firstPSN.Add(qp.sqAt(idx).npkts)) {
				idx++
			}
			if idx == qp.sqEnd || !qp.req.started(idx) {
				break
			}
			if w := qp.sqAt(idx); q.Before(w.firstPSN) {
				continue
			} else if isRdAtomic(w.wr.Opcode) {
				s.setPend(q)
			} else {
				s.setDone(q)
			}
			if hi.Before(q) {
				hi = q
			}
		}
	}
	qp.srLost(hi)
	return true
}

// srWQE returns the index of the outstanding WQE that holds PSN q, or
// false.
func (qp *QP) srWQE(q bth.PSN) (uint64, bool) {
	for i := qp.sqHead; i != qp.sqEnd && qp.req.started(i); i++ {
		w := qp.sqAt(i)
		if q.Before(w.firstPSN) {
			return 0, false
		}
		if q.Before(w.firstPSN.Add(w.npkts)) {
			return i, true
		}
	}
	return 0, false
}

// srOnReadResponse places a READ response packet wherever it falls in its
// READ, in any order. Called with qp.mu held.
func (qp *QP) srOnReadResponse(p *packetT, psn bth.PSN) {
	s := qp.sr
	// The responder executes in PSN order: a response acknowledges
	// every earlier request.
	qp.srAckedBy(psn.Add(-1), false)
	i, ok := qp.srWQE(psn)
	if !ok {
		return
	}
	w := qp.sqAt(i)
	if w.wr.Opcode != WRRead || w.stalled() {
		return
	}
	if p.AETH != nil && p.AETH.Syndrome().Type() != aeth.TypeACK {
		return
	}
	k := int(psn.Diff(w.firstPSN))
	pos := p.Info.Pos
	lastPkt := k == w.npkts-1
	// A timeout's probe into a READ asks for one response; its answer is
	// a LAST where the READ's own stream has a MIDDLE (or FIRST). Any
	// other response may be that stream, late behind a busy responder or
	// a process that was not scheduled: taking it for the answer marked
	// everything not yet received lost, and a 4 MB READ went ~1.5 times.
	if psn == s.probe && !lastPkt && (pos == bth.PosLast || pos == bth.PosOnly) {
		qp.srProbeAnswered(psn)
	}
	// A resent READ for a run of missing responses is answered with its
	// own FIRST/MIDDLE/LAST: only the READ's own last packet is checked.
	if lastPkt && pos != bth.PosLast && pos != bth.PosOnly {
		return
	}
	off := uint64(k) * uint64(qp.mtu)
	want := min(uint64(w.length)-off, uint64(qp.mtu))
	if uint64(len(p.Payload)) != want {
		if i == qp.sqHead {
			qp.failWQE(w, WCBadRespErr)
		}
		return
	}
	if s.isDone(psn) {
		return // a duplicate
	}
	if len(p.Payload) > 0 {
		if err := w.rsl.Scatter(qp.rxPins(), off, p.Payload); err != nil {
			qp.req.failLocal(w, WCLocProtErr)
			return
		}
	}
	s.setDone(psn)
	if psn != qp.comp.psn {
		// A response beyond a gap, placed for the first time: the peer
		// is alive and sending what it was asked (a slow peer streams a
		// large READ's flight while the missing ones wait behind it).
		// It is progress for the retry count (srTimeout's full timeout);
		// each PSN counts once, so a peer that never fills the gap still
		// runs out of retries.
		s.progressAt = qp.now()
		qp.srLostAgain(psn)
		qp.srLost(psn)
	}
	qp.srAdvance()
}

// srOnAtomicAck places an atomic ACK, in any order.
func (qp *QP) srOnAtomicAck(p *packetT, psn bth.PSN) {
	s := qp.sr
	qp.srAcked(psn.Add(-1))
	qp.srProbeAnswered(psn)
	i, ok := qp.srWQE(psn)
	if !ok {
		return
	}
	w := qp.sqAt(i)
	if (w.wr.Opcode != WRCompareSwap && w.wr.Opcode != WRFetchAdd) || psn != w.firstPSN || p.AETH.Syndrome().Type() != aeth.TypeACK {
		return
	}
	if s.isDone(psn) {
		return
	}
	binary.NativeEndian.PutUint64(qp.comp.scratch[:], p.AtomicAck.OrigData())
	if err := qp.pd.Scatter(w.sges, 0, qp.comp.scratch[:]); err != nil {
		qp.req.failLocal(w, WCLocProtErr)
		return
	}
	s.setDone(psn)
	if psn != qp.comp.psn {
		qp.srLostAgain(psn)
		qp.srLost(psn)
	}
	qp.srAdvance()
}

// srTimeout is the retransmission timer's expiry: every outstanding PSN
// not done is resent. It counts against retry_cnt once per local ACK
// timeout without progress. Called with qp.mu held.
func (qp *QP) srTimeout() {
	s := qp.sr
	if qp.sqHead == qp.sqEnd {
		return
	}
	now := qp.dev.clock.Now()
	if s.progressAt.IsZero() {
		s.progressAt = now
	}
	full := now.Sub(s.progressAt) >= qp.timeout
	late := s.late
	s.late = false
	if full && late {
		s.progressAt = now // this process was behind: no retry spent
	} else if full {
		if qp.comp.retryCnt == 0 {
			if qp.trace != nil {
				qp.trace("sr retries exhausted: %s", qp.srDebugState())
			}
			inc(&qp.dev.ctr.RetryExceededErr)
			qp.failWQE(qp.sqAt(qp.sqHead), WCRetryExcErr)
			return
		}
		qp.comp.retryCnt--
		s.progressAt = now
	}
	inc(&qp.dev.ctr.CompleterRetryErr)
	qp.srSync()
	s.markOn = false
	s.rttOn = false // Karn: no sample across a resend
	if s.backoff < 16 {
		s.backoff++
	}
	// The oldest SEND/WRITE packet goes again even if the responder held
	// it: its acknowledgement may be what was lost.
	if w := qp.comp.head(); w != nil && !isRdAtomic(w.wr.Opcode) && s.in(qp.comp.psn) {
		i, m := srBit(qp.comp.psn)
		s.done[i] &^= m
	}
	if full {
		// A whole local ACK timeout without progress: resend everything
		// not done, as go-back-N would by now.
		s.pend = [srRingBits / 64]uint64{}
		*s.round = [srRingBits]uint16{}
		s.probeOn = false
		qp.srLost(qp.req.nextPSN())
	} else {
		// Probe with the oldest PSN (and what is known lost): a spurious
		// expiry (a stalled peer or scheduler) costs one packet. Its
		// answer comes after every packet sent before it, so the PSNs
		// before the mark still not done then are lost (srProbeAnswered).
		if s.in(qp.comp.psn) {
			i, m := srBit(qp.comp.psn)
			s.pend[i] &^= m
		}
		s.probe, s.probeMark, s.probeOn = qp.comp.psn, qp.req.nextPSN(), true
		qp.srLost(qp.comp.psn.Add(1))
	}
	qp.req.progress()
}

// srProbeAnswered takes an answer that covers PSN seen: once it covers a
// timeout's probe, the PSNs sent before the probe that are not done (nor
// held by the responder) are lost.
func (qp *QP) srProbeAnswered(seen bth.PSN) {
	s := qp.sr
	if !s.probeOn || seen.Before(s.probe) {
		return
	}
	s.probeOn = false
	// Resent or not, what is still missing was lost (a held READ request
	// is marked pending again by the selective NAK that says so).
	for q := qp.comp.psn; q.Before(s.probeMark) && s.in(q); q = q.Add(1) {
		if i, m := srBit(q); s.done[i]&m == 0 {
			s.pend[i] &^= m
		}
	}
	qp.srLost(s.probeMark)
}

// srRecover resends the lost PSNs: those before hi that are neither done
// nor pending, each once per round. Called from req.progress with qp.mu
// held.
func (qp *QP) srRecover() {
	s := qp.sr
	s.due = false
	if !s.lost {
		return
	}
	qp.srSync()
	end := s.hi
	if qp.req.nextPSN().Before(end) {
		end = qp.req.nextPSN()
	}
	started := false
	q := qp.comp.psn
	idx := qp.sqHead
	for q.Before(end) {
		if !s.in(q) {
			// Nothing beyond the ring is resent (it has no pending
			// bit to stop a second resend): the recovery goes on
			// as the ring moves (srSync).
			s.edge, s.edgeOn = s.base.Add(srRingBits), true
			return
		}
		if s.isDone(q) || s.isPend(q) {
			q = s.settledFrom(q, end)
			continue
		}
		for idx != qp.sqEnd && qp.req.started(idx) && !q.Before(qp.sqAt(idx).firstPSN.Add(qp.sqAt(idx).npkts)) {
			idx++
		}
		if idx == qp.sqEnd || !qp.req.started(idx) {
			break
		}
		w := qp.sqAt(idx)
		if q.Before(w.firstPSN) {
			q = w.firstPSN
			continue
		}
		if w.stalled() {
			break
		}
		if qp.paceHold() {
			s.due = true // the pacing timer's req.progress resumes
			return
		}
		k := int(q.Diff(w.firstPSN))
		span := 1
		var limit uint32
		if w.wr.Opcode == WRRead {
			wend := w.firstPSN.Add(w.npkts)
			lim := end
			if wend.Before(lim) {
				lim = wend
			}
			e := s.unsettledFrom(q.Add(1), lim)
			span = int(e.Diff(q))
			if !s.in(e) && e.Before(end) && e.Before(wend) && span < srRingBits/4 {
				// A short run at the ring's end, more of it beyond:
				// asked for in one piece once the ring has moved on.
				s.edge, s.edgeOn = s.base.Add(srRingBits), true
				return
			}
			// A READ's first PSN may reach the responder as the
			// original request (it was lost): it must ask for the
			// whole READ, or the responder would save, and later serve,
			// only a part. Once a response came, the READ ran.
			if e != wend && (k > 0 || s.anyDone(w.firstPSN, wend)) {
				limit = uint32(span) * uint32(qp.mtu)
			}
		}
		if !started {
			started = true
			if s.rounds++; s.rounds == 0 {
				s.rounds = 1
				*s.round = [srRingBits]uint16{}
			}
			inc(&qp.dev.ctr.SRRecoveries)
			s.rttOn = false // Karn: no sample across a resend
		}
		if qp.trace != nil {
			qp.trace("sr resend %v span %d (comp.psn %v hi %v next %v)", q, span, qp.comp.psn, end, qp.req.nextPSN())
		}
		if !qp.srResend(w, idx, k, limit) {
			return
		}
		qp.paceSent(qp.out[qp.nout-1].Len())
		for j := 0; j < span; j++ {
			s.setPend(q.Add(j))
			if s.in(q.Add(j)) {
				s.round[uint32(q.Add(j))%srRingBits] = s.rounds
			}
		}
		s.mark, s.markOn = qp.req.nextPSN(), true
		q = q.Add(span)
	}
	s.lost = false
}

// srResend sends packet k of w (the WQE at index idx) again, asking for an
// acknowledgement; a READ asks for at most limit bytes (0: the rest). The
// requester's position is left as it was.
func (qp *QP) srResend(w *sendWQE, idx uint64, k int, limit uint32) bool {
	r := &qp.req
	psn, cur, sqCur, noack := r.psn, r.curPkt, qp.sqCur, r.noack
	r.psn, r.curPkt, qp.sqCur = w.firstPSN.Add(k), k, idx
	r.forceAck, r.rdLimit = true, limit
	ok := qp.req.sendRequest(w)
	r.forceAck, r.rdLimit = false, 0
	if qp.attr.State != QPSErr {
		r.psn, r.curPkt, qp.sqCur, r.noack = psn, cur, sqCur, noack
	}
	return ok
}

// srProgress records forward progress for the retry count.
func (qp *QP) srProgress() {
	if qp.sr != nil {
		qp.sr.progressAt = qp.now()
	}
}

// srDebugState describes the selective repeat state (trace, tests).
func (qp *QP) srDebugState() string {
	s := qp.sr
	out := fmt.Sprintf("comp.psn %v next %v ackedTo %v hi %v lost %v due %v mark %v/%v probe %v/%v/%v backoff %d srtt %v held %d resp.psn %v retryCnt %d\n",
		qp.comp.psn, qp.req.nextPSN(), s.ackedTo, s.hi, s.lost, s.due, s.mark, s.markOn, s.probe, s.probeMark, s.probeOn, s.backoff, s.srtt, s.held, qp.resp.psn, qp.comp.retryCnt)
	for q := qp.comp.psn; q.Before(qp.req.nextPSN()) && s.in(q); q = q.Add(1) {
		out += fmt.Sprintf("%v:d%v/p%v/r%d ", q, s.isDone(q), s.isPend(q), s.round[uint32(q)%srRingBits])
	}
	for i := qp.sqHead; i != qp.sqEnd && i < qp.sqHead+6; i++ {
		w := qp.sqAt(i)
		out += fmt.Sprintf("\n  wqe %d: %v len %d first %v npkts %d done %v status %v started %v", w.wr.WRID, w.wr.Opcode, w.length, w.firstPSN, w.npkts, w.done, w.status, qp.req.started(i))
	}
	return out
}
