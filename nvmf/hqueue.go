package nvmf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

// ErrDisconnected: the queue a command was on went down before its
// completion arrived (the command may or may not have executed).
var ErrDisconnected = errors.New("nvmf: controller connection lost")

// ErrIOTimeout: the controller did not answer a command on an I/O queue
// within HostConfig.IOTimeout, and the host ended the association (it
// comes wrapped with ErrDisconnected). The command may or may not have
// executed.
var ErrIOTimeout = errors.New("nvmf: I/O timeout")

// ErrAdminTimeout: the controller did not answer a command on the admin
// queue within HostConfig.AdminTimeout, and the host ended the
// association (it comes wrapped with ErrDisconnected). The command may or
// may not have executed.
var ErrAdminTimeout = errors.New("nvmf: admin command timeout")

// RejectedError is a connection request the target refused with NVMe-RDMA
// reject private data.
type RejectedError struct {
	QID    uint16
	Status nvme.CMStatus
}

// Error names the queue and the target's status, e.g. "nvmf: queue 1
// rejected: ...".
func (e *RejectedError) Error() string {
	return fmt.Sprintf("nvmf: queue %d rejected: %v", e.QID, e.Status)
}

// completion is what a command ends with.
type completion struct {
	status nvme.Status
	result uint64
	err    error
	inv    uint32 // the R_Key the response invalidated (SEND with Invalidate), else 0
	more   bool   // the status had the More bit (status has it cleared)
}

// hslot is one command slot of a host queue.
type hslot struct {
	idx        int
	gen        uint16
	cmd        []byte // SQE + in-capsule data (a slice of the queue's command buffer)
	data       []byte
	dataMR     *memreg.MR
	done       chan completion
	busy       bool // a command is out (under hqueue.mu), until the three below
	sendDone   bool // its SEND completed (the command buffer may be reused)
	resp       *completion
	callerDone bool // the caller took the result (or gave up)
	orphan     bool // its caller gave up: nobody reads done
	sent       time.Time
	timeout    time.Duration // this command's timeout, if not the queue's
	timedOut   bool          // unanswered past its timeout: it ends with ErrIOTimeout or ErrAdminTimeout

	// Remote invalidation (hqueue.remoteInv): a type 2 window on the data
	// buffer, bound for one command with a fresh key byte; rkey is the
	// key of the command out (0: none), keyByte the last byte used.
	mw         *memreg.MW
	rkey       uint32
	keyByte    uint8
	bindAccess memreg.Access
	wrs        [2]transport.SendWR
	sge        [1]memreg.SGE
}

// invCounters count how the keys of commands that asked for remote
// invalidation ended.
type invCounters struct {
	remote atomic.Uint64 // the response was a SEND with Invalidate of the key
	local  atomic.Uint64 // the target did not invalidate: the host did
}

// hqueue is one queue of a host controller.
type hqueue struct {
	qid     uint16
	depth   int // commands outstanding at most
	inline  int // in-capsule data bytes (I/O queues)
	conn    *rdmacm.Conn
	qp      *transport.QP
	pd      *memreg.PD
	cq      *transport.CQ
	cmdBuf  []byte
	cmdMR   *memreg.MR
	respBuf []byte
	respMR  *memreg.MR
	nresp   int
	slots   []hslot
	free    chan int
	dead    chan struct{}
	dieOnce sync.Once
	err     error

	mu      sync.Mutex
	closing bool           // under mu: close has begun; no new commands
	users   sync.WaitGroup // do calls in progress (close waits for them before freeing memory)
	wg      sync.WaitGroup
	subs    atomic.Int64 // commands submitted
	logf    func(format string, args ...any)
	timeout time.Duration // how long a command may go unanswered (≤ 0: forever); set before the first command

	lastInv  uint32 // tests: the R_Key the last raw command's response invalidated
	lastMore bool   // tests: the last raw command's completion had the More bit
	canary   uint64 // ErrNoData

	// remoteInv: data commands use a per-command key (a type 2 window
	// bound before the command) and ask the target to invalidate it
	// (keyed SGL subtype 0xF), as Linux's host does with its fast
	// registrations. Set before the first command.
	remoteInv bool
	invs      *invCounters // may be nil
}

const cidIdxBits = 10

// testHooks let the package's tests play a broken or hostile target from
// the host's side of the wire; nil outside tests.
var testHooks atomic.Pointer[hostHooks]

type hostHooks struct {
	// identify rewrites Identify data as the host receives it.
	identify func(cns uint8, b []byte)
	// response returns true to lose a completion (the target's answer
	// never comes).
	response func(q *hqueue, c *nvme.CQEFields) bool
	// readSGL rewrites the keyed SGL of a read on an I/O queue (to have
	// its data written elsewhere).
	readSGL func(q *hqueue, g *nvme.SGLFields)
	// closing runs as a queue's close starts (to hold a teardown).
	closing func(q *hqueue)
}

// hostACKTimeout is the local ACK timeout exponent of the host's queues
// (16, 268 ms: see dialQueue); tests shorten it.
var hostACKTimeout uint8 = 16

// dialQueue connects queue qid: rdma_cm connection with the NVMe-RDMA
// request, receive buffers for the completions posted before it.
// sr offers selective repeat (HostConfig.SelectiveRepeat).
func dialQueue(ctx context.Context, dev *transport.Device, addr netip.AddrPort, qid uint16, size, inline int, mtu transport.MTU, sr bool) (*hqueue, error) {
	q := &hqueue{qid: qid, depth: size - 1, inline: inline, nresp: size, dead: make(chan struct{}), canary: rand.Uint64()}
	if qid == 0 {
		q.inline = 0
	}
	cmdSize := nvme.SQESize + q.inline
	var err error
	if q.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if q.cq, err = dev.CreateCQ(4*size + 16); err != nil {
		q.pd.Dealloc()
		return nil, err
	}
	q.cmdBuf = make([]byte, q.depth*cmdSize)
	q.respBuf = make([]byte, q.nresp*nvme.CQESize)
	if q.cmdMR, err = q.pd.RegisterMR(q.cmdBuf, memreg.AccessLocalWrite); err == nil {
		q.respMR, err = q.pd.RegisterMR(q.respBuf, memreg.AccessLocalWrite)
	}
	if err != nil {
		q.release()
		return nil, err
	}
	q.slots = make([]hslot, q.depth)
	q.free = make(chan int, q.depth)
	for i := range q.slots {
		q.slots[i] = hslot{idx: i, cmd: q.cmdBuf[i*cmdSize : (i+1)*cmdSize], done: make(chan completion, 1)}
		q.free <- i
	}
	pd := make([]byte, nvme.CMReqSize)
	nvme.CMReq(pd).Encode(&nvme.CMReqFields{RecFmt: nvme.RecFmt10, QID: qid, HRQSize: uint16(size), HSQSize: uint16(size - 1)})
	// Local ACK timeout 16 (268 ms) with 7 retries: about 2 s without an
	// answer before a queue is declared lost. (Linux's nvme-rdma host
	// sends 19 on RoCE through rdma_cm; the default 14, 67 ms, gave up on
	// healthy connections of a loaded machine.)
	retry := transport.DefaultRetry
	retry.Timeout = hostACKTimeout
	conn, err := rdmacm.Dial(ctx, dev, addr, &rdmacm.Options{SelectiveRepeat: sr, PD: q.pd, Retry: &retry, PathMTU: mtu, SendCQ: q.cq, RecvCQ: q.cq, MaxSendWR: 2*size + 8,
		MaxRecvWR: size, MaxSGE: 2, PrivateData: pd, Prepare: func(qp *transport.QP) error {
			for i := 0; i < q.nresp; i++ {
				if err := q.postRecvOn(qp, i); err != nil {
					return err
				}
			}
			return nil
		}})
	if err != nil {
		q.release()
		var rej *rdmacm.RejectError
		if errors.As(err, &rej) && len(rej.PrivateData) >= nvme.CMRejSize {
			if r, _ := nvme.ParseCMRej(rej.PrivateData); r.Fields().Status != 0 {
				return nil, &RejectedError{QID: qid, Status: r.Fields().Status}
			}
		}
		if errors.Is(err, rdmacm.ErrUnreachable) || errors.Is(err, rdmacm.ErrTimeout) {
			return nil, fmt.Errorf("nvmf: queue %d: %w", qid, err) // rdmacm named the address
		}
		// A REJ (no listener on the port: "invalid service ID") or the
		// end of ctx (nothing answered in time) says nothing of where.
		return nil, fmt.Errorf("nvmf: queue %d to %v: %w", qid, addr, withCause(ctx, err))
	}
	q.conn, q.qp = conn, conn.QP()
	q.wg.Add(1)
	go q.loop()
	return q, nil
}

// withCause adds ctx's cause to err when ctx ended with one of its own
// (the host's connection-step timeout), keeping err's chain.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
		return err
	}
	if c := context.Cause(ctx); c != nil && c != ctx.Err() && !strings.Contains(err.Error(), c.Error()) {
		return fmt.Errorf("%w (%v)", err, c)
	}
	return err
}

func (q *hqueue) postRecvOn(qp *transport.QP, i int) error {
	return qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{q.respMR.SGE(uint64(i*nvme.CQESize), nvme.CQESize)}})
}

// die marks the queue down (once) and fails every outstanding command.
// Only a loss is logged: a queue that close is tearing down (the host's
// own Close, or the teardown of an association already found lost) dies
// of that teardown — its receives flushed, its connection closed — and
// that is no news.
func (q *hqueue) die(err error) {
	q.dieOnce.Do(func() {
		q.mu.Lock()
		closing := q.closing
		q.mu.Unlock()
		if q.logf != nil && err != ErrClosed && !closing {
			q.logf("nvmf: host queue %d down: %v", q.qid, err)
		}
		q.mu.Lock()
		q.err = err
		close(q.dead)
		for i := range q.slots {
			s := &q.slots[i]
			if !s.busy {
				continue
			}
			s.sendDone = true // never now
			if s.resp == nil {
				s.resp = &completion{err: fmt.Errorf("%w: %v", ErrDisconnected, err)}
				if s.timedOut {
					s.resp.err = fmt.Errorf("%w: %w", ErrDisconnected, err)
				}
				if !s.orphan {
					s.done <- *s.resp
				}
			}
			q.maybeFree(s)
		}
		q.mu.Unlock()
	})
}

// expire marks the commands unanswered for longer than their timeout
// (the request's, else the queue's) and returns the error that ends the
// queue for them (wrapping ErrAdminTimeout on the admin queue,
// ErrIOTimeout on an I/O queue), or nil when there are none. The caller
// lets the queue die of it: a slot whose command the target may still
// answer, or write data into, is freed only then, and never reused (the
// queue is dead; its memory goes with its teardown).
func (q *hqueue) expire(now time.Time) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var oldest *hslot
	for i := range q.slots {
		s := &q.slots[i]
		d := q.timeout
		if s.timeout != 0 {
			d = s.timeout // negative: none (an AER)
		}
		if d > 0 && s.busy && s.resp == nil && now.Sub(s.sent) > d {
			s.timedOut = true
			if oldest == nil || s.sent.Before(oldest.sent) {
				oldest = s
			}
		}
	}
	if oldest == nil {
		return nil
	}
	why := ErrIOTimeout
	if q.qid == 0 {
		why = ErrAdminTimeout
	}
	cid := uint16(oldest.gen)<<cidIdxBits | uint16(oldest.idx)
	op := nvme.SQE(oldest.cmd[:nvme.SQESize]).Opcode()
	return fmt.Errorf("queue %d: command %#x (opcode %#x) unanswered for %v: %w", q.qid, cid, op,
		now.Sub(oldest.sent).Round(time.Millisecond), why)
}

// loop receives completions until the queue goes down.
func (q *hqueue) loop() {
	defer q.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-q.conn.Done():
			q.die(q.conn.Err())
			cancel()
		case <-q.dead:
			cancel()
		}
	}()
	var wcs [32]transport.WC
	for {
		n, err := q.cq.Wait(ctx, wcs[:])
		if err != nil {
			q.die(err)
			return
		}
		for i := 0; i < n; i++ {
			wc := &wcs[i]
			if wc.Status != transport.WCSuccess {
				q.die(wc.Err())
				return
			}
			if wc.Opcode == transport.WCRecv {
				q.onResponse(int(wc.WRID), wc)
			} else {
				q.onSent(int(wc.WRID))
			}
		}
	}
}

func (q *hqueue) onResponse(ri int, wc *transport.WC) {
	if ri >= q.nresp {
		return
	}
	var c nvme.CQEFields
	ok := wc.ByteLen >= nvme.CQESize
	if ok {
		c = nvme.CQE(q.respBuf[ri*nvme.CQESize : (ri+1)*nvme.CQESize]).Fields()
	}
	if err := q.postRecvOn(q.qp, ri); err != nil {
		q.die(err)
		return
	}
	if !ok {
		return
	}
	if hk := testHooks.Load(); hk != nil && hk.response != nil && hk.response(q, &c) {
		return
	}
	idx, gen := int(c.CID&(1<<cidIdxBits-1)), c.CID>>cidIdxBits
	q.mu.Lock()
	defer q.mu.Unlock()
	if idx >= len(q.slots) {
		return
	}
	s := &q.slots[idx]
	if !s.busy || s.gen&(1<<(16-cidIdxBits)-1) != gen || s.resp != nil {
		return // stale or bogus
	}
	withInv := wc.Flags&transport.WCWithInv != 0
	if withInv && wc.InvalidatedRKey != s.rkey {
		// The target invalidated a key this command did not offer (or
		// none was offered): the association cannot be trusted, as
		// Linux's host resets it.
		q.mu.Unlock()
		q.die(fmt.Errorf("nvmf: the response to cid %#x invalidated rkey %#x, the command's key is %#x", c.CID, wc.InvalidatedRKey, s.rkey))
		q.mu.Lock()
		return
	}
	if s.rkey != 0 {
		if withInv {
			if q.invs != nil {
				q.invs.remote.Add(1)
			}
		} else if s.mw == nil {
			// a raw test command's own window: nothing of the slot's
		} else if err := s.mw.Invalidate(); err == nil {
			// The target answered with a plain SEND: the key must not
			// outlive the command, so the host ends it itself.
			if q.invs != nil {
				q.invs.local.Add(1)
			}
		}
		s.rkey = 0
	}
	// The More bit only says the controller logged the error (its Error
	// Information log has more): the status is the rest, as Linux's
	// host takes it (nvme_error_status).
	s.resp = &completion{status: c.Status &^ nvme.StatusMore, result: c.Result, more: c.Status&nvme.StatusMore != 0}
	if withInv {
		s.resp.inv = wc.InvalidatedRKey
	}
	if !s.orphan {
		s.done <- *s.resp // the caller goes on; the slot stays out until its SEND completed too
	}
	q.maybeFree(s)
}

func (q *hqueue) onSent(idx int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if idx >= len(q.slots) || !q.slots[idx].busy {
		return
	}
	q.slots[idx].sendDone = true
	q.maybeFree(&q.slots[idx])
}

// maybeFree returns a slot to the free list once its SEND completed, its
// response arrived and its caller is done with its data buffer (only then
// may its buffers be reused). Under q.mu.
func (q *hqueue) maybeFree(s *hslot) {
	if s.busy && s.sendDone && s.resp != nil && (s.callerDone || s.orphan) {
		s.busy = false
		q.free <- s.idx
	}
}

// finish: the caller is done with the slot.
func (q *hqueue) finish(s *hslot) {
	q.mu.Lock()
	s.callerDone = true
	q.maybeFree(s)
	q.mu.Unlock()
}

// acquire takes a free slot.
func (q *hqueue) acquire(ctx context.Context) (*hslot, error) {
	select {
	case i := <-q.free:
		return &q.slots[i], nil
	case <-q.dead:
		return nil, fmt.Errorf("%w: %v", ErrDisconnected, q.err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ensureData gives the slot a registered data buffer of at least n bytes.
func (q *hqueue) ensureData(s *hslot, n int) error {
	if q.remoteInv && s.mw == nil {
		mw, err := q.pd.AllocMW(memreg.MWType2)
		if err != nil {
			return err
		}
		s.mw = mw
	}
	if len(s.data) >= n {
		return nil
	}
	if s.dataMR != nil {
		s.dataMR.Deregister()
		s.dataMR = nil
	}
	size := 4096
	for size < n {
		size <<= 1
	}
	buf := make([]byte, size)
	acc := memreg.AccessLocalWrite | memreg.AccessRemoteRead | memreg.AccessRemoteWrite
	if q.remoteInv {
		// Only the per-command windows grant remote access.
		acc = memreg.AccessLocalWrite | memreg.AccessMWBind
	}
	mr, err := q.pd.RegisterMR(buf, acc)
	if err != nil {
		s.data = nil
		return err
	}
	s.data, s.dataMR = buf, mr
	return nil
}

// request is one command to submit.
type request struct {
	build func(sqe nvme.SQE)
	out   []byte // data to the controller
	in    []byte // where data from the controller goes
	inLen int    // bytes expected from the controller (len(in) if zero)
	// timeout, if positive, replaces the queue's (hqueue.timeout) for
	// this command; negative: none (an Asynchronous Event Request, which
	// the controller answers only when an event happens).
	timeout time.Duration
}

// do submits r on the queue and waits for its completion. A status other
// than success comes back as the nvme.Status error.
func (q *hqueue) do(ctx context.Context, r *request) (uint64, error) {
	q.mu.Lock()
	if q.closing {
		q.mu.Unlock()
		return 0, fmt.Errorf("%w: queue %d closed", ErrDisconnected, q.qid)
	}
	q.users.Add(1)
	q.mu.Unlock()
	defer q.users.Done()
	s, err := q.acquire(ctx)
	if err != nil {
		return 0, err
	}
	q.subs.Add(1)
	sqe := nvme.SQE(s.cmd[:nvme.SQESize])
	clear(sqe)
	r.build(sqe)
	s.gen++
	sqe.SetCID(uint16(s.gen)<<cidIdxBits | uint16(s.idx))
	sqe.SetFlags(nvme.FlagSGLMetabuf)
	n := nvme.SQESize
	var g nvme.SGLFields
	var bind, canary bool
	switch {
	case len(r.out) > 0 && len(r.out) <= q.inline:
		copy(s.cmd[nvme.SQESize:], r.out)
		g = nvme.InCapsule(0, uint32(len(r.out)))
		n += len(r.out)
	case len(r.out) > 0:
		if err := q.ensureData(s, len(r.out)); err != nil {
			q.free <- s.idx
			return 0, q.lost(err)
		}
		copy(s.data, r.out)
		g, bind = q.keyed(s, len(r.out), memreg.AccessRemoteRead)
	case len(r.in) > 0:
		if err := q.ensureData(s, len(r.in)); err != nil {
			q.free <- s.idx
			return 0, q.lost(err)
		}
		g, bind = q.keyed(s, len(r.in), memreg.AccessRemoteWrite)
		if q.qid != 0 && len(r.in) >= canarySize {
			// Bytes the read's data must overwrite: the end of every
			// canaryStride bytes.
			canary = true
			putCanaries(s.data[:len(r.in)], q.canary)
			if hk := testHooks.Load(); hk != nil && hk.readSGL != nil {
				hk.readSGL(q, &g)
			}
		}
	default:
		g = nvme.Keyed(0, 0, 0, false)
	}
	sqe.SGL().Encode(&g)
	q.mu.Lock()
	select {
	case <-q.dead:
		q.mu.Unlock()
		q.free <- s.idx
		return 0, fmt.Errorf("%w: %v", ErrDisconnected, q.err)
	default:
	}
	s.busy, s.sendDone, s.resp, s.orphan, s.callerDone = true, false, nil, false, false
	s.sent, s.timeout, s.timedOut = time.Now(), r.timeout, false
	if !bind {
		s.rkey = 0
	}
	q.mu.Unlock()
	// The window's bind (when the command asks for invalidation) runs
	// in send-queue order before the command goes out.
	wrs := s.wrs[:0]
	if bind {
		wrs = append(wrs, transport.SendWR{WRID: bindWRID, Opcode: transport.WRBindMW, MW: s.mw, RKey: s.rkey,
			Bind: transport.MWBindInfo{MR: s.dataMR, Addr: g.Addr, Length: uint64(g.Length), Access: s.bindAccess}})
	}
	s.sge[0] = q.cmdMR.SGE(uint64(s.idx*len(s.cmd)), uint32(n))
	wrs = append(wrs, transport.SendWR{WRID: uint64(s.idx), Opcode: transport.WRSend, Flags: transport.SendSignaled, SGEs: s.sge[:]})
	err = q.qp.PostSend(wrs...)
	if err != nil {
		q.die(err)
	}
	var c completion
	select {
	case c = <-s.done:
	case <-ctx.Done():
		q.mu.Lock()
		if s.resp == nil {
			s.orphan = true // freed when its completion (or the queue's end) comes
			q.mu.Unlock()
			return 0, ctx.Err()
		}
		q.mu.Unlock()
		c = <-s.done
	}
	defer q.finish(s)
	if c.err != nil {
		return 0, c.err
	}
	if !c.status.OK() {
		return c.result, c.status
	}
	if len(r.in) > 0 {
		if canary {
			if at := findCanary(s.data[:len(r.in)], q.canary); at >= 0 {
				return c.result, fmt.Errorf("%w: queue %d, cid %#x, %d bytes: nothing written at byte %d", ErrNoData, q.qid, sqe.CID(),
					len(r.in), at)
			}
		}
		copy(r.in, s.data)
	}
	return c.result, nil
}

// ErrNoData: the controller answered a read with success but did not
// write its data (all of it) into the host's buffer. The host reads
// into a buffer of the command's slot and copies from there, so such a
// read would return what the slot's previous command left there — data
// of another read, another block, another caller.
//
// Each read puts a canary (canarySize bytes of the queue's random value,
// never sent) at the end of every canaryStride (512) bytes of the region
// the target must write, and of the region itself, and checks them
// before it copies the data out. What it guarantees: a read whose
// response says success fails with ErrNoData when any 512-byte granule
// of it (counted from its start: each logical block, whatever the block
// size, is one or more) was left without its last 8 bytes — in
// particular a transfer that never came, one cut short by 8 bytes or
// more, one that skipped or lost any whole block, in any place. What it
// does not: a gap within a granule that leaves the granule's last 8
// bytes written (a target that writes parts of blocks) passes, and
// those bytes are the slot buffer's previous content; data that really
// holds the canary at a granule's end (one chance in 2^64 each) is
// taken for a missing transfer; a target that writes a read's data after
// its response (only possible with the slot's long-lived key, without
// HostConfig.RemoteInvalidate) can still corrupt a later command's.
//
// The trade-off: knowing that every byte was written needs a mark on
// every byte before the transfer — filling or clearing the whole region,
// a pass over the data on top of the copy out, for every read — because
// RDMA WRITEs tell the receiver nothing about what they covered. The
// canaries cost one 8-byte store and one load per 512 bytes (1/64 of
// the data, no pass over it) and catch every failure that loses whole
// blocks, which is how a target drops data: per RDMA WRITE, each whole
// blocks or pages.
var ErrNoData = errors.New("nvmf: read completed without its data")

const (
	canarySize   = 8
	canaryStride = 512
)

// putCanaries writes v into the canaries of b (len(b) ≥ canarySize):
// the last canarySize bytes of every canaryStride bytes and of b itself
// (a stride's that would overlap b's is left out).
func putCanaries(b []byte, v uint64) {
	last := len(b) - canarySize
	for off := canaryStride - canarySize; off+canarySize <= last; off += canaryStride {
		binary.LittleEndian.PutUint64(b[off:], v)
	}
	binary.LittleEndian.PutUint64(b[last:], v)
}

// findCanary returns the offset of the first canary of b (putCanaries)
// still holding v, or -1.
func findCanary(b []byte, v uint64) int {
	last := len(b) - canarySize
	for off := canaryStride - canarySize; off+canarySize <= last; off += canaryStride {
		if binary.LittleEndian.Uint64(b[off:]) == v {
			return off
		}
	}
	if binary.LittleEndian.Uint64(b[last:]) == v {
		return last
	}
	return -1
}

// bindWRID marks the (unsignaled) window binds in the send queue.
const bindWRID = 1 << 62

// keyed returns the keyed SGL of the slot's first n data bytes: the data
// region's key, or with remote invalidation a fresh key of the slot's
// window (bound by the WR do posts before the command) and the invalidate
// subtype.
func (q *hqueue) keyed(s *hslot, n int, access memreg.Access) (nvme.SGLFields, bool) {
	if !q.remoteInv {
		return nvme.Keyed(s.dataMR.IOVA(), uint32(n), s.dataMR.RKey(), false), false
	}
	if s.mw.Bound() { // never after a response; a window left bound is ended first
		s.mw.Invalidate()
	}
	s.keyByte++
	s.rkey = s.mw.RKey()&^0xff | uint32(s.keyByte)
	s.bindAccess = access
	return nvme.Keyed(s.dataMR.IOVA(), uint32(n), s.rkey, true), true
}

// lost returns err as ErrDisconnected when the queue is down (a failure
// caused by its teardown), else err.
func (q *hqueue) lost(err error) error {
	select {
	case <-q.dead:
		return fmt.Errorf("%w: %v", ErrDisconnected, err)
	default:
		return err
	}
}

// stop ends the queue without disconnecting it (close does that): no
// new command is accepted, the QP goes to the error state, so that the
// peer can no longer read or write the queue's buffers and nothing more
// completes, and the commands in flight end with ErrDisconnected (err).
// The queue is being torn down: its end is not logged as a loss.
func (q *hqueue) stop(err error) {
	q.mu.Lock()
	q.closing = true
	q.mu.Unlock()
	if q.qp != nil {
		q.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	}
	q.die(err)
}

// close disconnects the queue and frees its memory once no command uses it.
func (q *hqueue) close() {
	if hk := testHooks.Load(); hk != nil && hk.closing != nil {
		hk.closing(q)
	}
	q.mu.Lock()
	q.closing = true
	q.mu.Unlock()
	if q.conn != nil {
		q.conn.Close()
	}
	q.die(ErrClosed)
	q.users.Wait()
	q.wg.Wait()
	q.release()
}

func (q *hqueue) release() {
	for i := range q.slots {
		if q.slots[i].mw != nil {
			q.slots[i].mw.Dealloc()
		}
	}
	for i := range q.slots {
		if q.slots[i].dataMR != nil {
			q.slots[i].dataMR.Deregister()
		}
	}
	for _, mr := range []*memreg.MR{q.cmdMR, q.respMR} {
		if mr != nil {
			mr.Deregister()
		}
	}
	if q.cq != nil {
		q.cq.Destroy()
	}
	if q.pd != nil {
		q.pd.Dealloc()
	}
}
