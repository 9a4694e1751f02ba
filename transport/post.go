package transport

import (
	"errors"
	"fmt"

	"github.com/gorocev2/rocev2/memreg"
)

// PostSend queues send work requests. Each WR is validated (opcode, SGE
// count, local keys and rights, atomic alignment); the first invalid WR
// stops posting and PostSend returns a *WRError naming its index and field
// (verbs' bad_wr): the WRs before it stay posted, it and the ones after it
// are not. A full send queue is a *WRError matching ErrQueueFull. The QP
// must be in RTS or SQD, or in ERR (then the WRs complete with
// WCWRFlushErr); on a closed device PostSend returns ErrClosed.
func (qp *QP) PostSend(wrs ...SendWR) error {
	// Unlocked on each return rather than deferred: the defer's record
	// and call were a tenth of a one-WR post (a panic in here is a bug
	// that ends the program; nothing of the stack recovers it).
	qp.mu.Lock()
	if st := qp.attr.State; qp.destroyed || qp.dev.closed.Load() || st != QPSRTS && st != QPSSQD && st != QPSErr {
		if err := qp.sendRefused(); err != nil {
			qp.mu.Unlock()
			return err
		}
	}
	// The usual WRs, then (out of the loop, which then carries no
	// error) the rest from the first that postFast leaves.
	i := 0
	for i < len(wrs) && qp.postFast(&wrs[i]) {
		i++
	}
	var err error
	if i < len(wrs) {
		err = qp.postRest(wrs, i)
	}
	qp.afterPost()
	qp.mu.Unlock()
	return err
}

// postRest posts wrs from index i on (postOne) until one fails, and
// returns its *WRError. Under qp.mu.
func (qp *QP) postRest(wrs []SendWR, i int) error {
	for ; i < len(wrs); i++ {
		if err := qp.postOne(i, &wrs[i]); err != nil {
			return err
		}
	}
	return nil
}

// sendRefused is PostSend's error for a closed device, a destroyed QP or
// a QP in a state that takes no send WR (nil if none holds by now). Out
// of line: built in PostSend, its errors' formatting made PostSend's
// frame several times what posting needs.
func (qp *QP) sendRefused() error {
	if err := qp.postable("PostSend"); err != nil {
		return err
	}
	if st := qp.attr.State; st != QPSRTS && st != QPSSQD && st != QPSErr {
		return fmt.Errorf("transport: PostSend qp %#x: state %v: %w", qp.qpn, st, ErrInvalidState)
	}
	return nil
}

// postable refuses posting on a closed device or a destroyed QP (Close
// destroys the QPs, but its callers are told ErrClosed).
func (qp *QP) postable(op string) error {
	if qp.destroyed || qp.dev.closed.Load() {
		return qp.unpostable(op)
	}
	return nil // inlined: every post asks
}

// unpostable is postable's error.
func (qp *QP) unpostable(op string) error {
	switch {
	case qp.dev.isClosed():
		return fmt.Errorf("transport: %s qp %#x: %w", op, qp.qpn, ErrClosed)
	case qp.destroyed:
		return fmt.Errorf("transport: %s qp %#x: %w", op, qp.qpn, qp.destroyedErr())
	}
	return nil
}

// postOne posts WR i of a PostSend or returns the *WRError that stops
// the post. Under qp.mu.
func (qp *QP) postOne(i int, wr *SendWR) error {
	if qp.postFast(wr) {
		return nil
	}
	return qp.postSlow(i, wr)
}

// postFast posts wr and reports true when it is a usual valid WR: known
// flags, room in the send queue, a SEND or RDMA WRITE (with or without
// immediate) on an RC or UC QP or an RDMA READ on an RC QP, with no SGE
// or one SGE of at most 2^31 bytes that memreg.PD.CheckSGE accepts
// (CreateQP makes max_sge at least 1). Every other WR it leaves alone
// (false), and postSlow checks it in full, naming the field at fault:
// what postFast posts, postSlow would have posted the same way, and
// what it leaves, postSlow checks from the start, so the errors stay
// postSlow's. Without postSlow's errors its frame is small, and it
// makes no call but CheckSGE's. Under qp.mu.
func (qp *QP) postFast(wr *SendWR) bool {
	var acc memreg.Access
	if op := wr.Opcode; op > WRSendImm {
		if op != WRRead || qp.init.Type != QPTypeRC {
			return false
		}
		acc = memreg.AccessLocalWrite
	}
	n := qp.sqEnd - qp.sqHead
	if wr.Flags&^knownSendFlags != 0 || qp.init.Type == QPTypeUD ||
		n-uint64(qp.probes) >= uint64(qp.init.MaxSendWR) || n == uint64(len(qp.sq)) {
		return false // n == len(qp.sq): postSlow grows the ring
	}
	var ref *memreg.Ref
	var total uint32
	switch len(wr.SGEs) {
	case 0:
	case 1:
		s := &wr.SGEs[0]
		if s.Length > 1<<31 {
			return false
		}
		if ref = qp.pd.CheckSGE(s, acc); ref == nil {
			return false
		}
		total = s.Length
	default:
		return false
	}
	w := qp.sqAt(qp.sqEnd)
	if cap(w.sges) == 0 {
		return false // not so (growRing gives each WQE max_sge), but postSlow copes
	}
	// Only the fields a SEND, WRITE or READ uses; the rest are cleared
	// when a WR of another kind left them set (w.extra).
	if w.extra {
		w.clearExtra()
	}
	if w.wr.Opcode == WRRead && wr.Opcode != WRRead {
		// Only a READ's WQE sets rsl (and its Scatter caches a region
		// in it): let go of it.
		w.rsl = memreg.ScatterList{}
	}
	if ref != nil {
		w.sges = w.sges[:1]
		w.sges[0] = wr.SGEs[0]
	} else {
		w.sges = w.sges[:0]
	}
	ww := &w.wr
	ww.WRID, ww.Opcode, ww.Flags, ww.Imm, ww.RemoteAddr, ww.RKey = wr.WRID, wr.Opcode, wr.Flags, wr.Imm, wr.RemoteAddr, wr.RKey
	w.ref, w.length, w.npkts, w.firstPSN = ref, total, 0, 0
	w.rdCounted, w.done, w.localDone, w.probe, w.status = false, false, false, false, 0
	if wr.Opcode == WRRead {
		w.rsl.InitRef(qp.pd, w.sges, ref)
	}
	w.signaled = qp.init.SigAll || wr.Flags&SendSignaled != 0
	qp.sqEnd++
	return true
}

// clearExtra clears the fields of w.wr that postFast does not write, as
// pushWQE may have set them (and SGEs, which nothing sets).
func (w *sendWQE) clearExtra() {
	ww := &w.wr
	ww.SGEs, ww.InvRKey, ww.CompareAdd, ww.Swap = nil, 0, 0, 0
	ww.AH, ww.RemoteQPN, ww.RemoteQKey, ww.MW, ww.Bind = nil, 0, 0, nil, MWBindInfo{}
	w.extra = false
}

// postSlow is postOne for a WR that postFast left: every check, in
// verbs' order, each failure a *WRError naming its field.
func (qp *QP) postSlow(i int, wr *SendWR) error {
	bad := func(field string, kind, err error, format string, args ...any) error {
		return qp.postErr(i, wr, field, kind, err, format, args...)
	}
	if bits := wr.Flags &^ knownSendFlags; bits != 0 {
		return bad("send_flags", ErrInvalidWR, nil, "unknown bits %#x in %#x (known: FENCE 1, SIGNALED 2, SOLICITED 4, NoAckReq 0x80; inline data, IBV_SEND_INLINE 8, is not supported)", uint8(bits), uint8(wr.Flags))
	}
	if qp.init.MaxSendWR == 0 {
		return bad("", ErrQueueFull, nil, "the QP has no send queue (max_send_wr 0)")
	}
	if qp.sqEnd-qp.sqHead-uint64(qp.probes) >= uint64(qp.init.MaxSendWR) {
		return bad("", ErrQueueFull, nil, "%d WRs outstanding (max_send_wr)", qp.init.MaxSendWR)
	}
	qp.sqRoom()
	var acc memreg.Access
	switch wr.Opcode {
	case WRBindMW, WRLocalInv:
		if err := qp.checkLocalWR(i, wr); err != nil {
			return err
		}
	case WRSend, WRSendImm, WRSendInv, WRWrite, WRWriteImm:
	case WRRead, WRCompareSwap, WRFetchAdd:
		acc = memreg.AccessLocalWrite
	default:
		return bad("opcode", ErrInvalidWR, nil, "%v not supported", wr.Opcode)
	}
	if qp.init.Type == QPTypeUC && (acc != 0 || wr.Opcode == WRSendInv) {
		return bad("opcode", ErrInvalidWR, nil, "%v on a UC QP (only SEND and RDMA WRITE, with or without immediate)", wr.Opcode)
	}
	total, ref, err := qp.checkSGEs("PostSend", i, wr.WRID, wr.SGEs, acc)
	if err != nil {
		return err
	}
	if total > 1<<31 {
		return bad("sg_list", ErrInvalidWR, nil, "length %d > 2^31", total)
	}
	if qp.init.Type == QPTypeUD {
		if err := qp.checkUDWR(i, wr, total); err != nil {
			return err
		}
	}
	if wr.Opcode == WRCompareSwap || wr.Opcode == WRFetchAdd {
		if total != 8 {
			return bad("sg_list", ErrInvalidWR, nil, "atomic length %d, want 8", total)
		}
		if wr.RemoteAddr&7 != 0 {
			return bad("remote_addr", ErrInvalidWR, nil, "%#x not 8-byte aligned", wr.RemoteAddr)
		}
	}
	qp.pushWQE(wr, ref, uint32(total))
	return nil
}

// pushWQE writes checked WR wr, whose single SGE (if it has one) was
// checked against ref, with total bytes, into the send queue's next
// WQE. The queue has room (sqRoom). Under qp.mu.
func (qp *QP) pushWQE(wr *SendWR, ref *memreg.Ref, total uint32) {
	w := qp.sqAt(qp.sqEnd)
	sges := copySGEs(w.sges, wr.SGEs)
	// Field by field, so that the caller's SGE slice is not retained
	// (and does not escape), and in place: a composite literal of the
	// whole WQE (~300 bytes) was built in a temporary, zeroed and copied
	// with its pointers' write barriers.
	prevRead := w.wr.Opcode == WRRead
	ww := &w.wr
	ww.WRID, ww.Opcode, ww.SGEs, ww.Flags, ww.Imm = wr.WRID, wr.Opcode, nil, wr.Flags, wr.Imm
	ww.InvRKey, ww.RemoteAddr, ww.RKey, ww.CompareAdd, ww.Swap = wr.InvRKey, wr.RemoteAddr, wr.RKey, wr.CompareAdd, wr.Swap
	ww.AH, ww.RemoteQPN, ww.RemoteQKey, ww.MW, ww.Bind = wr.AH, wr.RemoteQPN, wr.RemoteQKey, wr.MW, wr.Bind
	w.extra = true
	w.sges, w.ref, w.length, w.npkts, w.firstPSN = sges, ref, total, 0, 0
	w.rdCounted, w.done, w.localDone, w.probe, w.status = false, false, false, false, 0
	switch {
	case wr.Opcode == WRRead:
		w.rsl.InitRef(qp.pd, sges, ref)
	case prevRead:
		// Only a READ's WQE sets rsl (and its Scatter caches a region
		// in it): let go of it.
		w.rsl = memreg.ScatterList{}
	}
	w.signaled = qp.init.SigAll || wr.Flags&SendSignaled != 0
	qp.sqEnd++
}

// postErr is postOne's *WRError for WR i. Out of line: built inline at
// each of postOne's checks, the errors made its frame four times the size
// its work needs, spilled around every call.
//
//go:noinline
func (qp *QP) postErr(i int, wr *SendWR, field string, kind, err error, format string, args ...any) error {
	return &WRError{Op: "PostSend", QPN: qp.qpn, Index: i, WRID: wr.WRID, Field: field,
		Msg: fmt.Sprintf(format, args...), Kind: kind, Err: err}
}

// copySGEs copies src into dst's memory (reused from the WQE's last use;
// it has room for max_sge) and returns it. The usual list of one element
// is copied inline: append's call of memmove for 16 bytes cost more than
// the copy (two per posted message, PostSend's and PostRecv's).
func copySGEs(dst, src []memreg.SGE) []memreg.SGE {
	if len(src) == 1 && cap(dst) > 0 {
		dst = dst[:1]
		dst[0] = src[0]
		return dst
	}
	return append(dst[:0], src...)
}

// checkSGEs checks the SGE list of WR i (op's) against max_sge and
// its lkeys: in one call when it is valid (the usual case), element by
// element (checkSGEsSlow) when it is not, to name the element at fault.
func (qp *QP) checkSGEs(op string, i int, wrid uint64, sges []memreg.SGE, acc memreg.Access) (uint64, *memreg.Ref, error) {
	if len(sges) <= qp.init.MaxSGE {
		if total, ref, err := qp.pd.CheckSGEsRef(sges, acc); err == nil {
			return total, ref, nil
		}
	}
	return qp.checkSGEsSlow(op, i, wrid, sges, acc)
}

// checkSGEsSlow checks again, element by element, the SGE list of WR i
// that pd.CheckSGEsRef failed (or that is longer than max_sge), and
// returns the *WRError naming the SGE at fault (count, key, rights,
// bounds).
func (qp *QP) checkSGEsSlow(op string, i int, wrid uint64, sges []memreg.SGE, acc memreg.Access) (uint64, *memreg.Ref, error) {
	if len(sges) > qp.init.MaxSGE {
		return 0, nil, &WRError{Op: op, QPN: qp.qpn, Index: i, WRID: wrid, Field: "num_sge",
			Msg: fmt.Sprintf("%d SGEs > max_sge %d", len(sges), qp.init.MaxSGE), Kind: ErrInvalidWR}
	}
	// Checked again element by element, to name the element at fault
	// (the first that fails now, as before).
	var total uint64
	for j := range sges {
		n, err := qp.pd.CheckSGEs(sges[j:j+1], acc)
		if err != nil {
			return 0, nil, &WRError{Op: op, QPN: qp.qpn, Index: i, WRID: wrid, Field: sgeField(qp.pd, j, sges[j], acc, err),
				Msg:  fmt.Sprintf("lkey %#x addr %#x length %d", sges[j].LKey, sges[j].Addr, sges[j].Length),
				Kind: ErrInvalidWR, Err: err}
		}
		total += n
	}
	return total, nil, nil
}

// PostRecv queues receive work requests. The QP must not be in RESET.
// SGEs are checked for local write access; the first invalid WR stops
// posting and PostRecv returns a *WRError for it, as PostSend does. In ERR
// the WRs complete with WCWRFlushErr.
func (qp *QP) PostRecv(wrs ...RecvWR) error {
	qp.mu.Lock() // unlocked on each return, as in PostSend
	if qp.destroyed || qp.dev.closed.Load() || qp.attr.State == QPSReset || qp.srq != nil {
		if err := qp.recvRefused(); err != nil {
			qp.mu.Unlock()
			return err
		}
	}
	// The usual WRs in line: room in the ring (not full: recvSlow grows
	// it) and one SGE that memreg.PD.CheckSGE accepts (max_sge is at
	// least 1). From the first other WR on, recvRest checks each in
	// full, from the start, and names the field at fault.
	i := 0
	for ; i < len(wrs); i++ {
		wr := &wrs[i]
		n := qp.rqEnd - qp.rqHead
		if n >= uint64(qp.init.MaxRecvWR) || n == uint64(len(qp.rq)) || len(wr.SGEs) != 1 {
			break
		}
		ref := qp.pd.CheckSGE(&wr.SGEs[0], memreg.AccessLocalWrite)
		r, s := qp.rqAt(qp.rqEnd), &wr.SGEs[0]
		if ref == nil || cap(r.sges) == 0 {
			break
		}
		r.wrid = wr.WRID
		r.sges = r.sges[:1]
		r.sges[0] = *s
		r.ref = ref
		r.length = uint64(s.Length)
		qp.rqEnd++
	}
	var err error
	if i < len(wrs) {
		err = qp.recvRest(wrs, i)
	}
	if qp.attr.State == QPSErr {
		qp.toError()
	}
	qp.settle()
	qp.mu.Unlock()
	return err
}

// recvRest posts receive WRs wrs from index i on (recvSlow) until one
// fails, and returns its *WRError. Under qp.mu.
func (qp *QP) recvRest(wrs []RecvWR, i int) error {
	for ; i < len(wrs); i++ {
		if err := qp.recvSlow(i, &wrs[i]); err != nil {
			return err
		}
	}
	return nil
}

// recvRefused is PostRecv's error for a closed device, a destroyed QP, a
// QP in RESET or one with an SRQ (nil if none holds by now); out of line,
// as sendRefused.
func (qp *QP) recvRefused() error {
	if err := qp.postable("PostRecv"); err != nil {
		return err
	}
	if qp.attr.State == QPSReset {
		return fmt.Errorf("transport: PostRecv qp %#x: state %v: %w", qp.qpn, qp.attr.State, ErrInvalidState)
	}
	if qp.srq != nil {
		return fmt.Errorf("transport: PostRecv qp %#x: the QP takes its receives from an SRQ (SRQ.PostRecv): %w", qp.qpn, ErrInvalidWR)
	}
	return nil
}

// recvSlow posts receive WR i (wr) that PostRecv did not take in line, or
// returns the *WRError that stops the post: a full queue, or the SGE at
// fault.
func (qp *QP) recvSlow(i int, wr *RecvWR) error {
	if qp.rqEnd-qp.rqHead >= uint64(qp.init.MaxRecvWR) {
		msg := fmt.Sprintf("%d WRs outstanding (max_recv_wr)", qp.init.MaxRecvWR)
		if qp.init.MaxRecvWR == 0 {
			msg = "the QP has no receive queue (max_recv_wr 0)"
		}
		return &WRError{Op: "PostRecv", QPN: qp.qpn, Index: i, WRID: wr.WRID, Msg: msg, Kind: ErrQueueFull}
	}
	qp.rqRoom()
	total, ref, err := qp.checkSGEs("PostRecv", i, wr.WRID, wr.SGEs, memreg.AccessLocalWrite)
	if err != nil {
		return err
	}
	r := qp.rqAt(qp.rqEnd)
	r.wrid = wr.WRID
	r.sges = copySGEs(r.sges, wr.SGEs)
	r.ref = ref
	r.length = total
	qp.rqEnd++
	return nil
}

// checkLocalWR checks a bind or local invalidate WR: RC or UC only, a type
// 2 window of the QP's PD for a bind (type 1 windows are bound with
// BindMW), and no scatter/gather list.
func (qp *QP) checkLocalWR(i int, wr *SendWR) error {
	bad := func(field, format string, args ...any) error {
		return &WRError{Op: "PostSend", QPN: qp.qpn, Index: i, WRID: wr.WRID, Field: field,
			Msg: fmt.Sprintf(format, args...), Kind: ErrInvalidWR}
	}
	switch {
	case qp.init.Type == QPTypeUD:
		return bad("opcode", "%v on a UD QP", wr.Opcode)
	case len(wr.SGEs) != 0:
		return bad("num_sge", "%v carries no data", wr.Opcode)
	case wr.Opcode == WRLocalInv:
		return nil
	case wr.MW == nil:
		return bad("bind_mw.mw", "nil window")
	case wr.MW.Type() != memreg.MWType2:
		return bad("bind_mw.mw", "a type 1 window: bind it with QP.BindMW")
	case wr.MW.PD() != qp.pd:
		return bad("bind_mw.mw", "window of another PD")
	case wr.Bind.MR == nil || wr.Bind.MR.PD() != qp.pd:
		return bad("bind_mw.bind_info.mr", "nil region or region of another PD")
	}
	return nil
}

// BindMW binds the type 1 window mw (ibv_bind_mw) and returns its new
// rkey: the binding takes effect at once, and a completion (WCBindMW, with
// wrid) follows in the send queue's order when flags has SendSignaled. A
// zero info.Length unbinds the window. Type 2 windows are bound with a
// WRBindMW work request instead. A bind the QP refuses (not in RTS, SQD or
// ERR; send queue full) leaves the window as it was, as ibv_bind_mw, which
// posts the bind as a work request, does — unless another goroutine posts
// to the QP or moves it out of RTS while the window is being bound; then
// the window is bound and BindMW returns its rkey with the error. On a QP
// in ERR the bind is flushed, not executed, as verbs flush the BIND_MW WR:
// BindMW returns the window's current rkey (unchanged) and a nil error,
// the window stays as it was (unbound if it was), and the completion, if
// signaled, has status WCWRFlushErr. A QP that goes to ERR while the
// window is being bound flushes the bind the same way; the window is then
// left unbound.
func (qp *QP) BindMW(wrid uint64, mw *memreg.MW, info MWBindInfo, flags SendFlags) (uint32, error) {
	if mw == nil || mw.Type() != memreg.MWType1 {
		return 0, fmt.Errorf("transport: BindMW qp %#x: not a type 1 window: %w", qp.qpn, ErrInvalidWR)
	}
	if mw.PD() != qp.pd {
		return 0, fmt.Errorf("transport: BindMW qp %#x: window of another PD: %w", qp.qpn, ErrInvalidWR)
	}
	if bits := flags &^ knownSendFlags; bits != 0 {
		return 0, &WRError{Op: "BindMW", QPN: qp.qpn, WRID: wrid, Field: "send_flags",
			Msg: fmt.Sprintf("unknown bits %#x in %#x", uint8(bits), uint8(flags)), Kind: ErrInvalidWR}
	}
	// The QP's refusals first. The bind itself runs without qp.mu: it
	// waits for accesses through the window's old binding to finish, and
	// a received batch may hold one while it waits for qp.mu.
	qp.mu.Lock()
	err := qp.bindPostable(wrid)
	if err == nil && qp.attr.State == QPSErr {
		// A QP in ERR flushes the bind WR without executing it, as verbs
		// do (ibv_bind_mw returns 0, the WR completes with
		// WR_FLUSH_ERR): the window stays as it was.
		qp.queueBindWR(wrid, flags)
		qp.mu.Unlock()
		return mw.RKey(), nil
	}
	qp.mu.Unlock()
	if err != nil {
		return 0, err
	}
	rkey, err := mw.Bind(info.MR, info.Addr, info.Length, info.Access)
	if err != nil {
		return 0, fmt.Errorf("transport: BindMW qp %#x: %w: %w", qp.qpn, ErrInvalidWR, err)
	}
	// The completion travels through the send queue as a local invalidate
	// of nothing would: a local WR that is done when reached.
	qp.mu.Lock()
	if err := qp.bindPostable(wrid); err != nil {
		qp.mu.Unlock()
		return rkey, err
	}
	qp.queueBindWR(wrid, flags)
	if qp.attr.State != QPSErr {
		qp.mu.Unlock()
		return rkey, nil
	}
	// The QP went to ERR while the window was being bound: its bind WR
	// is flushed, so the bind must not stand (a window usable remotely
	// while the completion says flushed). Undone without qp.mu, as the
	// bind ran: the window is left unbound.
	qp.mu.Unlock()
	if _, err := mw.Bind(nil, 0, 0, 0); err != nil {
		return mw.RKey(), fmt.Errorf("transport: BindMW qp %#x: the QP went to ERR during the bind and the window could not be unbound: %w", qp.qpn, err)
	}
	return mw.RKey(), nil
}

// queueBindWR queues BindMW's completion WR, a local WR that is done when
// reached (flushed in ERR). Called with qp.mu held, after bindPostable.
func (qp *QP) queueBindWR(wrid uint64, flags SendFlags) {
	qp.sqRoom()
	w := qp.sqAt(qp.sqEnd)
	*w = sendWQE{wr: SendWR{WRID: wrid, Opcode: WRBindMW, Flags: flags}, sges: w.sges[:0], localDone: true}
	w.signaled = qp.init.SigAll || flags&SendSignaled != 0
	qp.sqEnd++
	if qp.attr.State == QPSErr {
		qp.toError()
	} else {
		qp.req.progress()
	}
	qp.settle()
	qp.flushOut()
}

// bindPostable reports whether BindMW may queue its completion WR: the QP
// exists, is in RTS, SQD or ERR, and has room in its send queue. Called
// with qp.mu held.
func (qp *QP) bindPostable(wrid uint64) error {
	if err := qp.postable("BindMW"); err != nil {
		return err
	}
	if st := qp.attr.State; st != QPSRTS && st != QPSSQD && st != QPSErr {
		return fmt.Errorf("transport: BindMW qp %#x: state %v: %w", qp.qpn, st, ErrInvalidState)
	}
	if qp.init.MaxSendWR == 0 {
		return &WRError{Op: "BindMW", QPN: qp.qpn, WRID: wrid, Msg: "the QP has no send queue (max_send_wr 0)", Kind: ErrQueueFull}
	}
	if qp.sqEnd-qp.sqHead-uint64(qp.probes) >= uint64(qp.init.MaxSendWR) {
		return &WRError{Op: "BindMW", QPN: qp.qpn, WRID: wrid, Msg: "send queue full (max_send_wr)", Kind: ErrQueueFull}
	}
	return nil
}

// sgeField names the field of SGE j that made pd.CheckSGEs fail with err:
// "sg_list[j].addr" when the SGE starts outside its region,
// "sg_list[j].length" when it starts inside but does not fit (or its end
// wraps the address space), else "sg_list[j].lkey" (the key is unknown,
// stale, of another PD, not a region, or lacks the right). Error path only.
func sgeField(pd *memreg.PD, j int, s memreg.SGE, acc memreg.Access, err error) string {
	f := "lkey"
	switch {
	case errors.Is(err, memreg.ErrAddressWrap), errors.Is(err, memreg.ErrLength):
		f = "length"
	case errors.Is(err, memreg.ErrOutOfBounds):
		f = "length"
		// Does the first byte fit? If not, the address is at fault.
		if _, e := pd.CheckSGEs([]memreg.SGE{{Addr: s.Addr, Length: 1, LKey: s.LKey}}, acc); e != nil {
			f = "addr"
		}
	}
	return fmt.Sprintf("sg_list[%d].%s", j, f)
}
