package nvmf

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

// Work request IDs: the kind in the top byte, an index below.
const (
	wrRecv = 1 << 56
	wrRead = 2 << 56
	wrSend = 3 << 56
	wrKind = 0xff << 56
)

// maxBatchWRs is the most send work requests a queue gathers before it
// posts them (flushSends): two per completion handled (an RDMA WRITE and
// its response) for a full CQ batch, and the responses that waited.
const maxBatchWRs = 128

// numClasses: data buffers come in 4 KiB << class sizes up to MaxTransfer.
const numClasses = MDTS + 1

// dbuf is a registered data buffer.
type dbuf struct {
	buf   []byte
	mr    *memreg.MR
	class int
}

// tstage is where a command waits.
type tstage uint8

const (
	tsIdle tstage = iota
	tsNeedBuf
	tsReading
	tsNeedResp
)

// treq is the command in one receive buffer, from its arrival until its
// response is posted (the receive buffer is posted again then).
type treq struct {
	idx     int
	stage   tstage
	length  int // capsule bytes received
	sqe     nvme.SQE
	sgl     nvme.SGLFields
	dir     nvme.Direction
	xfer    int // data bytes to move (SGL length)
	data    *dbuf
	inData  []byte // in-capsule data
	status  nvme.Status
	result  uint64
	out     int  // bytes to RDMA WRITE to the host before the response
	inv     bool // answer with SEND with Invalidate of sgl.Key
	cid     uint16
	pending bool
}

// lateResp is a response owed to a command that no longer holds a
// receive buffer: a parked Asynchronous Event Request the controller
// aborts.
type lateResp struct {
	cid    uint16
	st     nvme.Status
	result uint64
}

// tqueue is one NVMe queue of the target: an rdma_cm connection, its
// receive buffers (one command capsule each), response buffers and data
// buffers, served by one goroutine.
type tqueue struct {
	t         *Target
	qid       uint16
	depth     int // receive buffers = host SQ size
	hostDepth int
	sendDepth int
	slot      int // bytes per receive buffer
	pd        *memreg.PD
	cq        *transport.CQ
	ch        *transport.CompChannel // the admin queue's (waitCQ)
	conn      *rdmacm.Conn
	qp        *transport.QP

	recvBuf  []byte
	recvMR   *memreg.MR
	respBuf  []byte
	respMR   *memreg.MR
	respFree []int
	respData []*dbuf
	reqs     []treq
	pending  []int
	spare    []int      // runPending's other list
	late     []lateResp // responses of commands that hold no receive buffer

	free_     [numClasses][]*dbuf
	poolBytes int

	// The send work requests of the completions being handled: posted
	// together when the batch is done (flushSends), so that one
	// PostSend — one Link.Send, one sendmmsg — carries the data and
	// responses of every command the batch finished, instead of one
	// system call per command. Outside a batch (inBatch false) each
	// post goes out at once.
	inBatch bool
	wrs     []transport.SendWR
	sges    []memreg.SGE // wrs[i].SGEs is sges[i:i+1]
	recvSGE [1]memreg.SGE

	ctrl      *tctrl      // set by Connect
	connected atomic.Bool // ctrl is set (read by the connect timer)

	wake chan struct{} // the admin queue: asynchronous events to answer (kick)

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	why    error
}

func (t *Target) newQueue(f nvme.CMReqFields) (*tqueue, error) {
	q := &tqueue{t: t, qid: f.QID, depth: int(f.HSQSize) + 1, hostDepth: int(f.HRQSize), wake: make(chan struct{}, 1)}
	q.slot = nvme.SQESize
	if q.qid != 0 {
		q.slot += t.inline
	}
	nresp := 2*q.depth + aerLimit
	q.sendDepth = 2*nresp + q.depth
	pd, err := t.dev.AllocPD()
	if err != nil {
		return nil, err
	}
	q.pd = pd
	cqa := transport.CQAttr{Depth: q.sendDepth + q.depth + 16}
	if q.qid == 0 {
		// The admin queue waits on a completion channel, not in
		// CQ.Wait: see waitCQ.
		if q.ch, err = t.dev.CreateCompChannel(1); err != nil {
			pd.Dealloc()
			return nil, err
		}
		cqa.Channel = q.ch
	}
	if q.cq, err = t.dev.CreateCQWith(cqa); err != nil {
		if q.ch != nil {
			q.ch.Destroy()
		}
		pd.Dealloc()
		return nil, err
	}
	q.recvBuf = make([]byte, q.depth*q.slot)
	q.respBuf = make([]byte, nresp*nvme.CQESize)
	if q.recvMR, err = pd.RegisterMR(q.recvBuf, memreg.AccessLocalWrite); err == nil {
		q.respMR, err = pd.RegisterMR(q.respBuf, memreg.AccessLocalWrite)
	}
	if err != nil {
		q.free()
		return nil, err
	}
	q.respFree = make([]int, nresp)
	for i := range q.respFree {
		q.respFree[i] = nresp - 1 - i
	}
	q.respData = make([]*dbuf, nresp)
	q.wrs = make([]transport.SendWR, 0, maxBatchWRs)
	q.sges = make([]memreg.SGE, maxBatchWRs)
	q.reqs = make([]treq, q.depth)
	for i := range q.reqs {
		q.reqs[i].idx = i
	}
	q.ctx, q.cancel = context.WithCancel(t.ctx)
	return q, nil
}

// prepare posts every receive buffer before the REP goes out, as nvmet does.
func (q *tqueue) prepare(qp *transport.QP) error {
	for i := 0; i < q.depth; i++ {
		if err := q.postRecvOn(qp, i); err != nil {
			return err
		}
	}
	return nil
}

func (q *tqueue) postRecvOn(qp *transport.QP, i int) error {
	// PostRecv copies the SGE: one array serves every post (a slice
	// literal here cost an allocation per command).
	q.recvSGE[0] = q.recvMR.SGE(uint64(i*q.slot), uint32(q.slot))
	return qp.PostRecv(transport.RecvWR{WRID: wrRecv | uint64(i), SGEs: q.recvSGE[:]})
}

// free releases the queue's memory (after its connection is closed).
func (q *tqueue) free() {
	for _, mr := range []*memreg.MR{q.recvMR, q.respMR} {
		if mr != nil {
			mr.Deregister()
		}
	}
	for c := range q.free_ {
		for _, d := range q.free_[c] {
			d.mr.Deregister()
		}
		q.free_[c] = nil
	}
	for _, d := range q.respData {
		if d != nil {
			d.mr.Deregister()
		}
	}
	for i := range q.reqs {
		if d := q.reqs[i].data; d != nil {
			d.mr.Deregister()
			q.reqs[i].data = nil
		}
	}
	if q.cq != nil {
		q.cq.Destroy()
	}
	if q.ch != nil {
		q.ch.Destroy()
	}
	if q.pd != nil {
		q.pd.Dealloc()
	}
}

// shutdown ends the queue (any goroutine).
func (q *tqueue) shutdown() { q.stop(errors.New("shut down")) }

// reason returns why the queue ended (nil while it runs).
func (q *tqueue) reason() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.why
}

func (q *tqueue) stop(why error) {
	q.mu.Lock()
	if q.why == nil {
		q.why = why
	}
	q.mu.Unlock()
	q.cancel()
}

// run serves the queue until its connection ends, then tears it down.
func (q *tqueue) run() {
	go func() {
		select {
		case <-q.conn.Done():
			q.stop(fmt.Errorf("host disconnected: %w", q.conn.Err()))
		case <-q.ctx.Done():
		}
	}()
	idle := time.AfterFunc(q.t.cfg.ConnectTimeout, func() {
		if !q.connected.Load() {
			q.stop(errors.New("no Fabrics Connect in time"))
		}
	})
	defer idle.Stop()
	var wcs [32]transport.WC
	for q.ctx.Err() == nil {
		n, err := q.waitCQ(wcs[:])
		if err != nil {
			q.stop(err)
			break
		}
		i := 0
		q.inBatch = true
		for ; i < n && q.ctx.Err() == nil; i++ {
			q.handle(&wcs[i])
		}
		if q.ctx.Err() == nil {
			q.serveEvents()
		}
		q.inBatch = false
		q.flushSends()
		q.countErrors(wcs[i:n])
	}
	// The completions still queued when the queue stopped (a DREQ can
	// overtake the handling of the error that made the host send it) are
	// counted too.
	for {
		n := q.cq.Poll(wcs[:])
		if n == 0 {
			break
		}
		q.countErrors(wcs[:n])
	}
	if c := q.ctrl; c != nil {
		c.detach(q)
	}
	q.conn.Close()
	q.free()
}

// waitCQ waits for the queue's next completions. An I/O queue waits in
// CQ.Wait, which receives from the link in this goroutine. The admin
// queue, mostly idle (a Keep Alive every few seconds), waits on its
// completion channel instead: a goroutine asleep in CQ.Wait is one the
// device must keep a receiver for, so each time the I/O queue's goroutine
// left the link with a batch it handed the link to the device's receive
// goroutine and took it back in its next Wait — two goroutine switches
// and a wake-up of the blocked receive per batch, for nothing. (Whoever
// receives delivers the admin queue's completions to its channel.)
func (q *tqueue) waitCQ(wcs []transport.WC) (int, error) {
	if q.ch == nil {
		return q.cq.Wait(q.ctx, wcs)
	}
	for {
		if n := q.cq.Poll(wcs); n > 0 {
			return n, nil
		}
		if err := q.cq.Err(); err != nil {
			return 0, err
		}
		if err := q.cq.ReqNotify(false); err != nil {
			return 0, err
		}
		if n := q.cq.Poll(wcs); n > 0 { // stored before the arming
			return n, nil
		}
		select {
		case _, ok := <-q.ch.C():
			if !ok {
				return 0, transport.ErrClosed
			}
		case <-q.wake:
			return 0, nil // serveEvents
		case <-q.ctx.Done():
			return 0, q.ctx.Err()
		}
	}
}

// countErrors counts the error completions among wcs that the queue does
// not handle any more (it is stopping): each is a transport error.
func (q *tqueue) countErrors(wcs []transport.WC) {
	for i := range wcs {
		if wcs[i].Status != transport.WCSuccess && wcs[i].Status != transport.WCWRFlushErr {
			q.t.st.transportErrs.Add(1)
		}
	}
}

func (q *tqueue) handle(wc *transport.WC) {
	if wc.Status != transport.WCSuccess {
		if wc.Status != transport.WCWRFlushErr {
			q.t.st.transportErrs.Add(1)
		}
		q.stop(wc.Err())
		return
	}
	idx := int(wc.WRID &^ wrKind)
	switch wc.WRID & wrKind {
	case wrRecv:
		if idx < q.depth {
			q.onRecv(&q.reqs[idx], int(wc.ByteLen))
		}
	case wrRead:
		if idx < q.depth && q.reqs[idx].stage == tsReading {
			q.onReadDone(&q.reqs[idx])
		}
	case wrSend:
		if idx < len(q.respData) {
			if d := q.respData[idx]; d != nil {
				q.putBuf(d)
				q.respData[idx] = nil
			}
			q.respFree = append(q.respFree, idx)
			q.runPending()
		}
	}
}

// classOf returns the buffer class for n bytes.
func classOf(n int) int {
	if n <= 4096 {
		return 0
	}
	return bits.Len(uint((n - 1) >> 12))
}

// getBuf returns a data buffer of at least n bytes, or nil when the
// queue's buffer budget is spent.
func (q *tqueue) getBuf(n int) *dbuf {
	c := classOf(n)
	if l := q.free_[c]; len(l) > 0 {
		d := l[len(l)-1]
		q.free_[c] = l[:len(l)-1]
		return d
	}
	size := 4096 << c
	for k := range q.free_ { // make room by dropping idle buffers of other sizes
		for q.poolBytes+size > q.t.cfg.QueueBufferBytes && len(q.free_[k]) > 0 {
			d := q.free_[k][len(q.free_[k])-1]
			q.free_[k] = q.free_[k][:len(q.free_[k])-1]
			d.mr.Deregister()
			q.poolBytes -= len(d.buf)
		}
	}
	if q.poolBytes+size > q.t.cfg.QueueBufferBytes {
		return nil
	}
	buf := make([]byte, size)
	mr, err := q.pd.RegisterMR(buf, memreg.AccessLocalWrite)
	if err != nil {
		return nil
	}
	q.poolBytes += size
	return &dbuf{buf: buf, mr: mr, class: c}
}

func (q *tqueue) putBuf(d *dbuf) { q.free_[d.class] = append(q.free_[d.class], d) }

// onRecv starts the command that arrived in receive buffer r.idx.
func (q *tqueue) onRecv(r *treq, n int) {
	q.t.st.commands.Add(1)
	*r = treq{idx: r.idx, length: n}
	b := q.recvBuf[r.idx*q.slot : r.idx*q.slot+min(n, q.slot)]
	if n < nvme.SQESize {
		q.t.st.malformed.Add(1)
		if n < 4 {
			// Not even a command ID to answer: the queue is broken (as
			// nvmet-rdma treats a short capsule); the host sees the
			// disconnect instead of waiting for an answer.
			q.stop(fmt.Errorf("capsule of %d bytes", n))
			return
		}
		r.cid = uint16(b[2]) | uint16(b[3])<<8
		q.finish(r, nvme.StatusInvalidField|nvme.StatusDNR)
		return
	}
	r.sqe = nvme.SQE(b[:nvme.SQESize])
	r.cid = r.sqe.CID()
	if r.sqe.Flags()&nvme.FlagFuseMask != 0 {
		// Fused operations are not supported (Identify's FUSES is 0).
		// Run on its own, the second half of a Compare and Write would
		// write although the compare failed: refused, as nvmet_req_init
		// refuses any command with FUSE set.
		q.finish(r, nvme.StatusInvalidField|nvme.StatusDNR)
		return
	}
	r.sgl = r.sqe.SGL().Fields()
	op := r.sqe.Opcode()
	if op == nvme.OpcodeFabrics {
		r.dir = r.sqe.FCType().DataDirection()
	} else {
		r.dir = op.DataDirection()
	}
	if q.ctrl == nil && !(op == nvme.OpcodeFabrics && r.sqe.FCType() == nvme.FCConnect) {
		q.finish(r, nvme.StatusCmdSeqError|nvme.StatusDNR)
		return
	}
	if st := q.parseSGL(r, b); st != 0 {
		q.finish(r, st)
		return
	}
	if st := q.check(r); st != 0 {
		q.finish(r, st)
		return
	}
	q.start(r)
}

// parseSGL checks the data descriptor and finds in-capsule data.
func (q *tqueue) parseSGL(r *treq, capsule []byte) nvme.Status {
	if r.sqe.Flags()&nvme.FlagPSDTMask != nvme.FlagSGLMetabuf && r.dir != nvme.DirNone {
		return nvme.StatusInvalidField | nvme.StatusDNR // PRPs mean nothing on a fabric
	}
	g := &r.sgl
	switch {
	case r.dir == nvme.DirNone:
		return 0
	case r.dir == nvme.DirBidirectional:
		return nvme.StatusInvalidOpcode | nvme.StatusDNR
	case g.Type == nvme.SGLTypeDataBlock && g.Subtype == nvme.SGLSubOffset:
		if r.dir != nvme.DirHostToCtrl {
			return nvme.StatusSGLInvalidType | nvme.StatusDNR
		}
		have := len(capsule) - nvme.SQESize
		if g.Addr > uint64(have) || uint64(g.Length) > uint64(have)-g.Addr {
			return nvme.StatusSGLInvalidOffset | nvme.StatusDNR
		}
		r.inData = capsule[nvme.SQESize+int(g.Addr) : nvme.SQESize+int(g.Addr)+int(g.Length)]
		r.xfer = int(g.Length)
	case g.Type == nvme.SGLTypeKeyedDataBlock && (g.Subtype == nvme.SGLSubAddress || g.Subtype == nvme.SGLSubInvalidate):
		if g.Length > MaxTransfer {
			return nvme.StatusSGLInvalidData | nvme.StatusDNR
		}
		r.xfer = int(g.Length)
		r.inv = g.Subtype == nvme.SGLSubInvalidate && g.Length > 0
	default:
		return nvme.StatusSGLInvalidType | nvme.StatusDNR
	}
	return 0
}

// start moves a command on: fetch its data, or execute it.
func (q *tqueue) start(r *treq) {
	if r.xfer > 0 && r.inData == nil {
		if r.data = q.getBuf(r.xfer); r.data == nil {
			q.t.st.waits.Add(1)
			r.stage = tsNeedBuf
			q.pend(r)
			return
		}
		if r.dir == nvme.DirHostToCtrl {
			r.stage = tsReading
			q.post(transport.SendWR{WRID: wrRead | uint64(r.idx), Opcode: transport.WRRead, Flags: transport.SendSignaled,
				RemoteAddr: r.sgl.Addr, RKey: r.sgl.Key}, r.data.mr.SGE(0, uint32(r.xfer)))
			return
		}
	}
	q.exec(r)
}

func (q *tqueue) onReadDone(r *treq) {
	r.stage = tsIdle
	q.exec(r)
}

// exec executes the command with its data and finishes it.
func (q *tqueue) exec(r *treq) {
	var in, out []byte
	if r.dir == nvme.DirHostToCtrl {
		in = r.inData
		if in == nil && r.data != nil {
			in = r.data.buf[:r.xfer]
		}
	} else if r.dir == nvme.DirCtrlToHost && r.data != nil {
		out = r.data.buf[:r.xfer]
	}
	st, res, n := q.execute(r, in, out)
	if r.dir == nvme.DirHostToCtrl && r.data != nil {
		q.putBuf(r.data)
		r.data = nil
	}
	r.result = res
	r.out = min(n, r.xfer)
	q.finish(r, st)
}

// finish posts the response (after the data, for a read), once a
// response buffer is free.
func (q *tqueue) finish(r *treq, st nvme.Status) {
	r.status = st
	if st == parked {
		if r.data != nil {
			q.putBuf(r.data)
			r.data = nil
		}
		r.stage = tsIdle
		if err := q.postRecvOn(q.qp, r.idx); err != nil {
			q.stop(err)
		}
		return
	}
	if len(q.respFree) == 0 {
		q.t.st.waits.Add(1)
		r.stage = tsNeedResp
		q.pend(r)
		return
	}
	q.respond(r)
}

func (q *tqueue) respond(r *treq) {
	ri := q.respFree[len(q.respFree)-1]
	q.respFree = q.respFree[:len(q.respFree)-1]
	r.stage = tsIdle
	if !r.status.OK() {
		q.t.st.errs.Add(1)
		r.out = 0
		if q.ctrl != nil {
			// Before the receive buffer (r.sqe) is posted again.
			q.ctrl.logError(q.qid, r.cid, r.status, r.sqe)
		}
		if q.t.cfg.Log != nil && r.sqe != nil {
			op := fmt.Sprintf("opcode %#x", uint8(r.sqe.Opcode()))
			if r.sqe.Opcode() == nvme.OpcodeFabrics {
				op = fmt.Sprintf("fabrics %#x", uint8(r.sqe.FCType()))
			}
			q.t.logf("nvmf: qid %d cid %d %s (cdw10 %#x nsid %d): %v", q.qid, r.cid, op, r.sqe.CDW(10), r.sqe.NSID(), r.status)
		}
	}
	st := r.status
	if !st.OK() && q.ctrl != nil {
		// Logged in the Error Information log: the More bit says so,
		// as nvmet_set_error sets it.
		st |= nvme.StatusMore
	}
	cqe := nvme.CQE(q.respBuf[ri*nvme.CQESize : (ri+1)*nvme.CQESize])
	cqe.Encode(&nvme.CQEFields{Result: r.result, SQID: q.qid, CID: r.cid, Status: st})
	// The host may send its next command as soon as it sees this
	// response: its receive buffer goes back first.
	if err := q.postRecvOn(q.qp, r.idx); err != nil {
		q.stop(err)
		return
	}
	if r.out > 0 {
		// The response right behind asks for the ACK that covers
		// both: the host sends one ACK per read, not two.
		q.post(transport.SendWR{Opcode: transport.WRWrite, Flags: transport.SendNoAckReq, RemoteAddr: r.sgl.Addr, RKey: r.sgl.Key}, r.data.mr.SGE(0, uint32(r.out)))
	}
	wr := transport.SendWR{WRID: wrSend | uint64(ri), Opcode: transport.WRSend, Flags: transport.SendSignaled}
	if r.inv && !q.t.cfg.testNoInvalidate {
		wr.Opcode, wr.InvRKey = transport.WRSendInv, r.sgl.Key
		q.t.st.invalidates.Add(1)
	}
	q.respData[ri] = r.data // freed when the SEND completes (the WRITE before it is done then)
	r.data = nil
	q.post(wr, q.respMR.SGE(uint64(ri*nvme.CQESize), nvme.CQESize))
}

// post queues the send work request wr with its one SGE: for the end of
// the batch being handled (flushSends), or at once outside a batch.
// A full queue is posted first; the QP keeps the order of its WRs either
// way (a response never overtakes its data).
func (q *tqueue) post(wr transport.SendWR, sge memreg.SGE) {
	if len(q.wrs) == cap(q.wrs) {
		q.flushSends()
	}
	i := len(q.wrs)
	q.sges[i] = sge
	wr.SGEs = q.sges[i : i+1 : i+1]
	q.wrs = append(q.wrs, wr)
	if !q.inBatch {
		q.flushSends()
	}
}

// flushSends posts the queued send work requests in one PostSend.
func (q *tqueue) flushSends() {
	if len(q.wrs) == 0 {
		return
	}
	err := q.qp.PostSend(q.wrs...)
	for i := range q.wrs {
		q.wrs[i] = transport.SendWR{}
	}
	q.wrs = q.wrs[:0]
	if err != nil {
		q.stop(err)
	}
}

// pend queues a command that waits for a buffer; runPending retries.
func (q *tqueue) pend(r *treq) {
	if !r.pending {
		r.pending = true
		q.pending = append(q.pending, r.idx)
	}
}

// runPending serves the commands that wait, after a SEND completed and
// gave back its response buffer and, for a read, its data buffer.
//
// A command waiting for a response buffer (tsNeedResp) has executed and
// holds its data buffer; one waiting for a data buffer (tsNeedBuf) holds
// nothing. The first kind is served whenever a response buffer is free,
// wherever it stands in the list: served strictly in order, a command at
// the head waiting for a data buffer could wait for the very buffer a
// command behind it holds until its response goes out, and neither would
// ever complete. The data buffer waiters are served in their order, the
// first one that still finds no buffer stopping the others (a large
// transfer is not overtaken for ever by small ones). NVMe orders no
// commands of a queue against each other (but fused pairs, which the
// target refuses), so nothing else is owed.
func (q *tqueue) runPending() {
	for len(q.late) > 0 && len(q.respFree) > 0 {
		l := q.late[0]
		q.late = q.late[1:]
		q.answerResult(l.cid, l.st, l.result)
	}
	if len(q.pending) == 0 {
		return
	}
	// Served commands can queue themselves again (a command given its
	// data buffer may find no response buffer): they go to a new list.
	waiting := q.pending
	q.pending = q.spare[:0]
	bufBlocked := false
	for _, idx := range waiting {
		r := &q.reqs[idx]
		switch {
		case r.stage == tsNeedResp && len(q.respFree) > 0:
			r.pending = false
			q.respond(r)
		case r.stage == tsNeedBuf && !bufBlocked:
			d := q.getBuf(r.xfer)
			if d == nil {
				bufBlocked = true
				q.pending = append(q.pending, idx)
				continue
			}
			q.putBuf(d)
			r.pending = false
			q.start(r)
		case r.stage == tsNeedResp, r.stage == tsNeedBuf:
			q.pending = append(q.pending, idx)
		default:
			r.pending = false
		}
	}
	q.spare = waiting[:0]
}

// answer posts the response of a command that holds no receive buffer
// (a parked AER the controller aborts, or one an event completes); without a free response buffer
// it waits in q.late, which runPending serves first.
func (q *tqueue) answer(cid uint16, st nvme.Status) { q.answerResult(cid, st, 0) }

// answerResult is answer with the completion's result (DW0): an AER's
// event.
func (q *tqueue) answerResult(cid uint16, st nvme.Status, result uint64) {
	if len(q.respFree) == 0 {
		q.late = append(q.late, lateResp{cid: cid, st: st, result: result})
		return
	}
	ri := q.respFree[len(q.respFree)-1]
	q.respFree = q.respFree[:len(q.respFree)-1]
	if !st.OK() {
		q.t.st.errs.Add(1)
	}
	nvme.CQE(q.respBuf[ri*nvme.CQESize : (ri+1)*nvme.CQESize]).Encode(&nvme.CQEFields{SQID: q.qid, CID: cid, Status: st, Result: result})
	q.respData[ri] = nil
	q.post(transport.SendWR{WRID: wrSend | uint64(ri), Opcode: transport.WRSend, Flags: transport.SendSignaled},
		q.respMR.SGE(uint64(ri*nvme.CQESize), nvme.CQESize))
}
