package transport

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// DeviceConfig configures a Device. The zero value of every field selects a
// default.
type DeviceConfig struct {
	// Addr is the local IP address (the GID). Zero means link.LocalAddr().
	Addr netip.Addr
	// Clock drives the protocol timers. Nil means the wall clock.
	Clock Clock
	// MaxQP bounds the number of QPs (default 1024).
	MaxQP int
	// FirstQPN is the first QP number handed out; the next ones count up
	// from it (wrapping to 0x11 after 0xfffffe: 0xffffff is the multicast
	// QPN, never handed out). Zero picks one at random
	// in [0x11, 0x800000), so that a process restarted on the same address
	// does not number its QPs as its previous life did and a peer that
	// still knows an old connection does not take the new one for it
	// (rxe's numbers survive its processes, the kernel's counter going on;
	// a device here lives as long as its process). Set it (0x11, as rxe
	// after boot) where a test needs fixed numbers. On a link that shares
	// its address the QPNs come from the link's leases (QPNs), each range
	// started at a random QPN; FirstQPN is then an error.
	FirstQPN uint32
	// Limits bounds the device's memory registration table.
	Limits memreg.Limits
	// MaxUnackedPSNs is the requester window: at most this many PSNs are
	// sent beyond the oldest unacknowledged one (default 128, like rxe).
	MaxUnackedPSNs int
	// MaxUnackedSmallPSNs is the requester window for small packets: a
	// SEND or WRITE packet (or an atomic) carrying at most
	// SmallPacketPayload bytes may go while fewer than this many PSNs are
	// unacknowledged; bigger packets and READ requests keep to
	// MaxUnackedPSNs. Default 4 × MaxUnackedPSNs: a window of 128 packets
	// of 64 bytes is 8 KiB in flight, which leaves a stream of small
	// messages waiting for ACKs (each end idle while the other works);
	// 512 such packets are still fewer bytes than 128 packets of the
	// smallest MTU. -1 turns it off (the same window for every packet).
	MaxUnackedSmallPSNs int
	// MaxPktsPerAck is how many packets a requester sends at most without
	// setting AckReq (default 64, like rxe).
	MaxPktsPerAck int
	// MaxRdAtomic is the device limit for max_rd_atomic and
	// max_dest_rd_atomic (default 16, like rxe's max_qp_rd_atom).
	MaxRdAtomic int
	// EventQueue is how many asynchronous events Events() holds before
	// newer ones are dropped (default 256).
	EventQueue int
	// PortMTU is the port's active MTU: the largest UD message (default
	// MTU1024, what rxe reports on a 1500-byte Ethernet link). PostSend
	// refuses a longer one; a longer one received is dropped
	// (ud_mtu_exceeded).
	PortMTU MTU
	// Congestion configures ECN, CNPs and DCQCN (cc.go). The zero value
	// sends ECT(0), answers CE marks with CNPs and runs DCQCN.
	Congestion CongestionConfig
	// QPNs supplies the QPNs the device hands out, each range from its
	// first QPN up. Nil means the link's leases when the link shares its
	// address (udp.SharedLink; each range from a random QPN on), else
	// every QPN from 0x11 up (from FirstQPN on).
	QPNs QPNSource
	// SelectiveRepeat configures selective repeat for the RC QPs that
	// negotiate it (QPAttr.SelectiveRepeat, sack.go).
	SelectiveRepeat SRConfig
	// CopySend turns zero-copy send off: payloads are copied from
	// registered memory into packet buffers even on a link that could
	// send them from where they lie (udp.CapZeroCopy). The wire bytes are
	// the same either way.
	CopySend bool
	// VerifyInLink keeps the ICRC check of received packets in the
	// link's Recv, for a whole batch at once, instead of right before
	// each packet is handled (udp.DeferVerifyLink). Either way no byte of
	// a packet whose ICRC fails reaches registered memory.
	VerifyInLink bool
	// SchedQPs is how many of the device's QPs must be busy (have sent
	// within their ACK timeout) for new requests to go through the
	// device's send scheduler (sched.go): QPs served round-robin, a
	// quantum of packets each, their packets sent together. Below it a
	// QP sends from the goroutine that posted. Zero means 64 on the wall
	// clock (RealClock) and never on another Clock; negative never.
	SchedQPs int
	// SchedInflight bounds the request packets the send scheduler lets
	// the device's RC QPs have unacknowledged in all (default 256): the
	// rest wait for their turn here, where no ACK timer runs, instead of
	// in the peer's receive queue, where theirs would. One QP counts a
	// quarter of it at most, and nothing once its oldest unacknowledged
	// PSN has waited a quarter of its ACK timeout (5 to 20 ms) for its
	// ACK: a slow or silent peer holds back its own QPs only.
	SchedInflight int
}

// Device is a RoCEv2 device bound to one udp.Link. It owns a memory
// registration table, its CQs, QPs and completion channels, and one receive
// goroutine that demultiplexes incoming packets by destination QPN.
//
// All methods are safe for concurrent use. Close flushes every QP, wakes
// every waiter and closes the link; the objects of a closed device return
// ErrClosed, with the exceptions Close's doc lists (calls that release
// memory keep working).
type Device struct {
	link    udp.Link
	cfg     DeviceConfig
	clock   Clock
	table   *memreg.Table
	addr    netip.Addr
	ctr     Counters
	ecnBits uint8 // the ECN codepoint of sent packets (Congestion.ECN)
	closed  atomic.Bool
	done    chan struct{}
	mu      sync.Mutex
	qps     map[uint32]*QP            // under mu
	cqs     map[*CQ]struct{}          // under mu
	chans   map[*CompChannel]struct{} // under mu
	srqs    map[*SRQ]struct{}         // under mu
	nextQPN uint32                    // the first QPN tried (of the default source)
	qpns    qpnAlloc                  // under mu

	gsi *GSI // QP1, opened by GSI(); under mu
	// closeHooks run when Close begins (OnClose); under mu, nil once
	// Close took them and set closing.
	closeHooks map[*closeHook]struct{}
	closing    bool
	hooksDone  chan struct{}

	tq *timerQueue // every QP's protocol timers, one Clock timer (timerq.go)

	sched txSched // the send scheduler of a busy device (sched.go)

	events   chan AsyncEvent
	evMu     sync.Mutex
	evClosed bool // under evMu
	// qpTab maps QPNs to QPs for the receive path without a lock: two
	// atomic loads per packet; set under mu, in O(1), whenever qps changes.
	qpTab qpTable

	// bufs holds the packet buffers QPs build their output in: a QP takes
	// them while it queues packets and gives them back once they are sent,
	// so an idle QP holds none.
	bufs sync.Pool
	// srHeld counts the out-of-order packets the device's selective
	// repeat QPs hold (SRConfig.MaxHeld).
	srHeld atomic.Int64

	lastRecvErr atomic.Pointer[error] // the link's last Recv error

	// rx is the receive state: the receive goroutine's batch buffers and
	// who drives the link (rxpoll.go). The batch state below (rxPending,
	// rxWake, rxPins) belongs to whoever holds rx.own (tryLock): the receive
	// goroutine, or a caller polling the link (Progress).
	rx rxDriver

	// rxPending lists the QPs that queued packets (ACKs, READ responses,
	// new requests) while the receive goroutine handled the current batch;
	// they are flushed once at the end of the batch. Receive goroutine only.
	rxPending []*QP
	// rxResp gathers the responses of the rxPending QPs for one
	// Link.Send (coalesce.go). Batch owner only.
	rxResp respBatch
	// respMu is held by flushPending from taking the responses out of
	// the QPs until they are on the link (QP.SendQueued waits for it).
	respMu sync.Mutex
	// respTook numbers flushPending's takes (under respMu); respSent is
	// the number of the last one whose responses were sent. A QP whose
	// zero-copy packets a take moved out (QP.zcTaken) has them between
	// it and the link while zcTaken > respSent (QP.zcInFlight).
	respTook uint64
	respSent atomic.Uint64
	// sending counts the Link.Send calls under way (Device.send). A
	// HandlePacket that finds a lock it needs taken while one is may be
	// called from inside that Send (a Link that hands packets to a peer
	// device's HandlePacket, which answers into ours): it leaves the
	// packet to the inbox instead of waiting (inbox.go).
	sending atomic.Int32
	// inbox holds the packets HandlePacket could not take without
	// waiting, in order, for a goroutine of its own (inbox.go).
	inbox inbox
	// respHeldBufs counts the pool buffers the QPs hold request packets
	// in behind READ responses under way (heldMaxDev, readresp.go).
	respHeldBufs atomic.Int64
	// rxDataQueued is set when an rxPending QP queued anything but bare
	// ACKs and NAKs (see pendingACKsOnly); cleared by flushPending.
	// Batch owner only.
	rxDataQueued bool
	// rxWake lists the CQs that received completions during the current
	// batch; their waiters are woken once, at the end of the batch, so
	// that a waiter finds every completion of the batch at once.
	// Receive goroutine only.
	rxWake []*CQ
	// rxPins holds the memory registrations the responders placed RDMA
	// WRITE and SEND data into during the current batch: one pin per region and
	// batch instead of a pin and unpin per packet. Released at the end of
	// every batch, before the waiters are woken, the queued packets are
	// sent and the next Recv blocks, and before a remote invalidation
	// (which waits for the window's pins). Inside a batch the goroutine
	// waits at most for a QP lock or a Link.Send, never for a
	// deregistration, so a Deregister waits at most for the batch in
	// progress. Receive goroutine only.
	rxPins memreg.Pins
	// rxNow is the clock reading of the current batch, taken when a QP
	// first needs the time in it (batchClock) and dropped at its end: a
	// READ response or ACK pushes its QP's ACK deadline out, and reading
	// the clock once per batch instead of once per packet saves a
	// clock_gettime per packet (a few percent of a 4 KiB READ stream
	// in a VM). Batch owner only.
	rxNow batchClock
	// rxBusy is when the batch being handled began (a busyMark, wall
	// clock only; 0 between batches): an ACK timer that expires while a
	// batch has been under way for longer than its timeout knows that
	// this process is behind on its input (onRetransTimer).
	rxBusy  atomic.Int64
	realClk bool
	// lazyPush: progress on a QP marks its armed ACK timer pushed instead
	// of reading the clock to move the deadline (QP.armRetrans). On the
	// wall clock, where a reading costs tens of nanoseconds per message.
	lazyPush bool
	// clkBase is a reading of the wall clock taken at NewDevice: on a
	// RealClock the device reads the time as clkBase plus the monotonic
	// time since (now), one clock read where time.Now makes two.
	clkBase time.Time
	// zc: the link sends payloads from registered memory (udp.CapZeroCopy
	// and not DeviceConfig.CopySend): WRITE and SEND requests and READ
	// responses whose payload lies in one SGE (one region) are queued
	// with Packet.Payload pointing into it (output.go).
	zc bool
	// backlog is the link (or the link it wraps) that can tell whether
	// datagrams wait unread in the kernel; nil if none can. An ACK timer
	// that expires while they do knows this process is behind on its
	// input (QP.behind).
	backlog udp.BacklogLink
	// outMax is how far a QP's output queue grows (output.go): outBatchMax
	// on a link that sends UDP GSO datagrams, where a bigger Link.Send
	// fills more of each and saves system calls, else outBatch.
	outMax int
}

// batchClock caches one clock reading for the batch in progress: taken
// when a QP first asks for the time in it (QP.now; most batches never
// do), forgotten by drop.
type batchClock struct {
	t  time.Time
	ok bool // t is the batch's reading
}

// drop forgets the batch's reading: the next QP.now reads the clock.
func (c *batchClock) drop() { c.ok = false }

// firstQPN is the first QPN handed out; rxe starts at 17 as well (0 and 1 are special).
// lastQPN is the last: 0xffffff is the multicast QPN (IBTA; Linux's
// IB_MULTICAST_QPN, which rxe's receive path takes for multicast), never
// a QP's number.
const (
	firstQPN = 0x11
	lastQPN  = bth.PSNMask - 1
)

// NewDevice creates a device on link and starts its receive goroutine.
func NewDevice(link udp.Link, cfg DeviceConfig) (*Device, error) {
	if link == nil {
		return nil, fmt.Errorf("transport: NewDevice: nil link: %w", ErrInvalidConfig)
	}
	if !cfg.Addr.IsValid() {
		cfg.Addr = link.LocalAddr()
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.MaxQP <= 0 {
		cfg.MaxQP = 1024
	}
	if cfg.MaxUnackedPSNs <= 0 {
		cfg.MaxUnackedPSNs = 128
	}
	if cfg.MaxUnackedPSNs > 1<<22 {
		return nil, fmt.Errorf("transport: NewDevice: MaxUnackedPSNs %d > %d: %w", cfg.MaxUnackedPSNs, 1<<22, ErrInvalidConfig)
	}
	switch {
	case cfg.MaxUnackedSmallPSNs == 0:
		cfg.MaxUnackedSmallPSNs = min(4*cfg.MaxUnackedPSNs, 1<<22)
	case cfg.MaxUnackedSmallPSNs < 0:
		cfg.MaxUnackedSmallPSNs = cfg.MaxUnackedPSNs
	case cfg.MaxUnackedSmallPSNs > 1<<22:
		return nil, fmt.Errorf("transport: NewDevice: MaxUnackedSmallPSNs %d > %d: %w", cfg.MaxUnackedSmallPSNs, 1<<22, ErrInvalidConfig)
	}
	if cfg.MaxPktsPerAck <= 0 {
		cfg.MaxPktsPerAck = 64
	}
	if cfg.MaxRdAtomic <= 0 {
		cfg.MaxRdAtomic = 16
	}
	if cfg.MaxRdAtomic > 255 {
		return nil, fmt.Errorf("transport: NewDevice: MaxRdAtomic %d > 255: %w", cfg.MaxRdAtomic, ErrInvalidConfig)
	}
	if cfg.EventQueue <= 0 {
		cfg.EventQueue = 256
	}
	if cfg.PortMTU == 0 {
		cfg.PortMTU = MTU1024
	}
	if cfg.PortMTU.Bytes() == 0 {
		return nil, fmt.Errorf("transport: NewDevice: PortMTU %d: %w", cfg.PortMTU, ErrInvalidConfig)
	}
	cc, err := cfg.Congestion.normalize()
	if err != nil {
		return nil, err
	}
	if cfg.SelectiveRepeat, err = cfg.SelectiveRepeat.normalize(); err != nil {
		return nil, err
	}
	cfg.Congestion = cc
	if cfg.FirstQPN > lastQPN || (cfg.FirstQPN != 0 && cfg.FirstQPN < firstQPN) {
		return nil, fmt.Errorf("transport: NewDevice: FirstQPN %#x outside [%#x, %#x]: %w", cfg.FirstQPN, firstQPN, lastQPN, ErrInvalidConfig)
	}
	if cfg.FirstQPN != 0 && cfg.QPNs == nil && sharedLinkOf(link) != nil {
		return nil, fmt.Errorf("transport: NewDevice: FirstQPN %#x on a link that shares its address: its QPNs come "+
			"from the link's leases (leave FirstQPN 0, or open the link unshared): %w", cfg.FirstQPN, ErrInvalidConfig)
	}
	if cfg.FirstQPN == 0 {
		cfg.FirstQPN = randomFirstQPN()
	}
	d := &Device{
		link:    link,
		cfg:     cfg,
		clock:   cfg.Clock,
		ecnBits: cfg.Congestion.ECN.bits(),
		table:   memreg.NewTable(cfg.Limits),
		addr:    cfg.Addr.Unmap(),
		done:    make(chan struct{}),
		qps:     make(map[uint32]*QP),
		cqs:     make(map[*CQ]struct{}),
		chans:   make(map[*CompChannel]struct{}),
		srqs:    make(map[*SRQ]struct{}),
		events:  make(chan AsyncEvent, cfg.EventQueue),
		nextQPN: cfg.FirstQPN,
	}
	d.qpns.src = cfg.QPNs
	if d.qpns.src == nil {
		if s := d.sharedLink(); s != nil {
			d.qpns.src = linkLeases{s}
			d.qpns.random = true
		} else {
			d.qpns.src = &wholeSpace{given: true}
			d.qpns.ranges = [][2]uint32{{firstQPN, lastQPN + 1 - firstQPN}}
			d.qpns.starts = []uint32{d.nextQPN - firstQPN}
		}
	}
	d.tq = newTimerQueue(d.clock, d.fireTimer)
	d.initSched()
	d.outMax = outBatch
	d.zc = udp.CapabilitiesOf(link)&udp.CapZeroCopy != 0 && !cfg.CopySend
	if udp.CapabilitiesOf(link)&udp.CapGSO != 0 {
		d.outMax = outBatchMax
	}
	d.initRx()
	_, d.realClk = cfg.Clock.(RealClock)
	d.lazyPush = d.realClk
	if c, ok := cfg.Clock.(*ManualClock); ok && c.lazyPush {
		d.lazyPush = true
	}
	d.clkBase = time.Now()
	if d.realClk {
		initBusyClock()
	}
	d.backlog = backlogLink(link)
	if er, ok := link.(udp.ErrorReporter); ok {
		er.SetErrorHandler(d.linkError)
	}
	d.registerBehind()
	go d.recvLoop()
	return d, nil
}

// GID returns the device's GID: the IPv6 address, or the IPv4-mapped IPv6
// address (::ffff:a.b.c.d) for IPv4.
func (d *Device) GID() [16]byte { return d.addr.As16() }

// Addr returns the local IP address.
func (d *Device) Addr() netip.Addr { return d.addr }

// Link returns the link the device is bound to.
func (d *Device) Link() udp.Link { return d.link }

// Clock returns the device clock.
func (d *Device) Clock() Clock { return d.clock }

// AllocPD allocates a protection domain in the device's registration
// table. Deallocate it with PD.Dealloc, which fails with ErrBusy (the
// same error as memreg.ErrBusy) while QPs, SRQs, regions or windows still
// use it.
func (d *Device) AllocPD() (*memreg.PD, error) {
	if d.isClosed() {
		return nil, ErrClosed
	}
	return d.table.AllocPD()
}

// Counters returns a snapshot of the device counters.
func (d *Device) Counters() Counters { return d.ctr.snapshot() }

func (d *Device) isClosed() bool { return d.closed.Load() }

// closeHook is one function registered with OnClose (a pointer, so
// that each registration is its own map key).
type closeHook struct{ f func() }

// OnClose registers f to run when Close begins, before the device's QPs
// go to the error state and its link closes, so that f may still send —
// as a connection manager does to tell its peers goodbye (a DREQ for each
// established connection) when the application closes the device with
// connections open. f runs once, on the goroutine that called Close,
// with no lock of the device held; it must not call Close. Functions
// registered with OnClose run in no particular order.
//
// The returned stop unregisters f and reports whether it did so before
// Close took it to run; on a device that is closing or closed f is not
// registered and stop reports false.
func (d *Device) OnClose(f func()) (stop func() bool) {
	h := &closeHook{f: f}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing || d.closed.Load() {
		return func() bool { return false }
	}
	if d.closeHooks == nil {
		d.closeHooks = map[*closeHook]struct{}{}
	}
	d.closeHooks[h] = struct{}{}
	return func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := d.closeHooks[h]
		delete(d.closeHooks, h)
		return ok
	}
}

// Close moves every QP to the error state (flushing their work requests
// with WCWRFlushErr), releases the QPs' and SRQs' hold on their PDs and
// CQs, closes the link and waits for the receive goroutine to exit. Then
// every CQ reports ErrClosed once its stored completions are polled
// (waiters return), the completion channels and Events() are closed.
//
// Afterwards the device's calls and its objects' calls return an error
// matching ErrClosed: creating anything, QP Destroy, Query, Modify,
// PostSend and PostRecv, CQ, SRQ and CompChannel Destroy, SRQ.PostRecv,
// and on its PDs RegisterMR, AllocMW and binding a window (these also
// match memreg.ErrTableClosed). Unlike verbs, which wants everything
// destroyed before the device is closed, the calls that give memory back
// keep working, so that it can be released in any order: MR.Deregister,
// MW.Dealloc, and PD.Dealloc, which succeeds once the PD's regions and
// windows are gone (Close released the QPs' hold). QP.State reports
// QPSErr, and accessors (QPN, PD, Depth, ...) keep answering.
//
// Before any of that, Close runs the functions registered with OnClose
// while the device still works: a connection manager sends its DREQs
// there.
func (d *Device) Close() error {
	d.mu.Lock()
	first := !d.closing
	hooks := d.closeHooks
	d.closeHooks, d.closing = nil, true
	if first {
		d.hooksDone = make(chan struct{})
	}
	done := d.hooksDone
	d.mu.Unlock()
	if first {
		for h := range hooks {
			h.f()
		}
		close(done)
	} else {
		<-done
	}
	d.mu.Lock()
	if d.closed.Swap(true) {
		d.mu.Unlock()
		return nil
	}
	d.unregisterBehind()
	d.table.Close(ErrClosed)
	// From here on no QP, CQ or channel is created (they check closed
	// under mu), so these snapshots are complete.
	qps := make([]*QP, 0, len(d.qps))
	for _, qp := range d.qps {
		qps = append(qps, qp)
	}
	cqs := make([]*CQ, 0, len(d.cqs))
	for cq := range d.cqs {
		cqs = append(cqs, cq)
	}
	chans := make([]*CompChannel, 0, len(d.chans))
	for ch := range d.chans {
		chans = append(chans, ch)
	}
	srqs := make([]*SRQ, 0, len(d.srqs))
	for s := range d.srqs {
		srqs = append(srqs, s)
	}
	d.mu.Unlock()
	for _, qp := range qps {
		qp.mu.Lock()
		if !qp.failed && qp.failErr == nil {
			qp.failErr = ErrClosed
		}
		qp.enterError(false)
		qp.stopTimersLocked()
		// The QP is destroyed by Close: its PD, CQs and SRQ are released
		// (unless a concurrent Destroy just did it). QP1 (GSI, no PD
		// and no CQs) stays: the GSI answers ErrClosed by itself.
		release := !qp.destroyed && qp.pd != nil
		qp.destroyed = qp.destroyed || release
		qp.mu.Unlock()
		if release {
			qp.detach()
		}
	}
	for _, s := range srqs {
		d.mu.Lock()
		release := !s.destroyed
		s.destroyed = true
		delete(d.srqs, s)
		d.mu.Unlock()
		if release {
			s.pd.Release()
		}
	}
	// A received batch's responses taken out of their QPs (flushPending)
	// are in neither the QPs, which toError flushed above, nor the link
	// until their send: wait for it, or the ACKs of messages the
	// application has seen complete are lost with the link and the peer
	// retries into a closed port (as QP.SendQueued waits for them).
	d.respMu.Lock()
	d.respMu.Unlock()
	d.sched.close()
	d.tq.close()
	err := d.link.Close()
	// The receive goroutine may sleep without a timer (rxDriver.deep).
	select {
	case d.rx.kick <- struct{}{}:
	default:
	}
	var werr error
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		werr = errors.New("transport: Close: receive goroutine did not exit")
	}
	for _, cq := range cqs {
		cq.fail(ErrClosed)
	}
	for _, ch := range chans {
		ch.close()
	}
	// Their Destroy answers ErrClosed from now on: Close has released
	// them, and Resources no longer counts them.
	d.mu.Lock()
	clear(d.cqs)
	clear(d.chans)
	d.mu.Unlock()
	d.closeEvents()
	if werr != nil {
		return werr
	}
	return err
}

func (d *Device) lookup(qpn uint32) *QP { return d.qpTab.get(qpn) }

// now returns the device clock's time. On a RealClock it is clkBase
// plus the monotonic time elapsed since (time.Since reads only the
// monotonic clock, where time.Now reads it and the wall clock): the
// same instant for every deadline and comparison the timers make, which
// use the monotonic reading; its wall part ignores steps of the system
// clock since NewDevice, which no timer looks at.
func (d *Device) now() time.Time {
	if d.realClk {
		return d.clkBase.Add(time.Since(d.clkBase))
	}
	return d.clock.Now()
}

// qpTable is a two-level table of the 2^24 QPNs: 4096 pages of 4096 QPs,
// a page allocated when its first QP is and let go when its last one is
// destroyed. QPNs go round the whole space on an unshared device, so pages
// kept for good grew the table by 32 KiB every 4096 QPs ever created, to
// 128 MiB with no QP alive (longev25 F1). One emptied page is kept as a
// spare for the next page needed, so a connection loop does not allocate
// one per QP. Readers need no lock: a reader may still hold a page that
// was emptied and reused for other QPNs, so get checks the QP's number.
type qpTable struct {
	pages [4096]atomic.Pointer[qpPage]
	live  [4096]uint16 // QPs per page; under the device's mu
	spare *qpPage      // an emptied page, all nil; under the device's mu
}

type qpPage [4096]atomic.Pointer[QP]

func (t *qpTable) get(qpn uint32) *QP {
	if p := t.pages[(qpn>>12)&0xfff].Load(); p != nil {
		if q := p[qpn&0xfff].Load(); q != nil && q.qpn == qpn {
			return q
		}
	}
	return nil
}

// set stores qp (nil removes) at qpn. Called with the device's mu held.
func (t *qpTable) set(qpn uint32, qp *QP) {
	i := (qpn >> 12) & 0xfff
	p := t.pages[i].Load()
	if p == nil {
		if qp == nil {
			return
		}
		p, t.spare = t.spare, nil
		if p == nil {
			p = new(qpPage)
		}
		t.pages[i].Store(p)
	}
	old := p[qpn&0xfff].Swap(qp)
	switch {
	case old == nil && qp != nil:
		t.live[i]++
	case old != nil && qp == nil:
		t.live[i]--
		if t.live[i] == 0 {
			t.pages[i].Store(nil)
			t.spare = p
		}
	}
}

// pageCount returns how many pages the table holds (tests).
func (t *qpTable) pageCount() int {
	n := 0
	for i := range t.pages {
		if t.pages[i].Load() != nil {
			n++
		}
	}
	return n
}

// getBuf returns a packet buffer of udp.MaxPacketSize bytes.
func (d *Device) getBuf() *[udp.MaxPacketSize]byte {
	if b, ok := d.bufs.Get().(*[udp.MaxPacketSize]byte); ok {
		return b
	}
	return new([udp.MaxPacketSize]byte)
}

// inputBatch handles the datagrams of one Link.Recv, then releases the
// memory pins the batch took (rxPins). Receive goroutine only.
//
// On the wall clock the batch marks itself busy (rxBusy) on the busy
// clock (busymark.go: a time-stamp counter read where the kernel keeps
// time with it); the clock proper is read by the first QP that needs the
// time (QP.now) and is then the batch clock every QP's timers use
// (rxNow), so that a batch costs at most one clock reading whatever its
// packets do — none in a ping-pong, whose ACK deadlines are pushed
// without one (Device.lazyPush).
func (d *Device) inputBatch(p *packet.Packet, pkts []udp.Packet) {
	if d.realClk {
		m := int64(0)
		if busyClk.tsc { // busyMark's usual case in line
			m = readTSC() | 1
		} else {
			m = busyMark()
		}
		d.rxBusy.Store(m)
	}
	d.rxNow.drop() // read by the first QP that asks (QP.now)
	// Consecutive packets for one QP (a message's packets, a window's
	// ACKs, a request and the ACK that came with it) are handed to it
	// under one take of its lock.
	var held *QP
	for i := range pkts {
		up := &pkts[i]
		// d.rx.verify read here, not kept in a local: one more value
		// live across the calls below was reloaded after each of them.
		if v := d.rx.verify; v != nil && !v.VerifyICRC(up) {
			continue // counted by the link; nothing of it was used
		}
		if p.DecodeNext(up.Buf) != packet.FaultNone { // p: only ever decoded into
			inc(&d.ctr.MalformedPkts)
			continue
		}
		bt := p.BTH
		_ = bt[bth.Size-1] // Decode's BTH is whole: the accessors below need no checks
		qpn := bt.DestQP()
		if held != nil && qpn == held.qpn &&
			(p.Info.Transport == held.transport || p.Info.Transport == bth.TransportCNP) {
			held.inputLocked(p, up, true)
			continue
		}
		if held != nil {
			held.endBatchInput()
			held = nil
		}
		// route's usual case in line: a QP of the packet's transport.
		qp := d.lookup(qpn)
		if qp == nil || p.Info.Transport != qp.transport {
			var err error
			if qp, err = d.route(p); err != nil {
				continue
			}
		}
		held = qp
		qp.beginBatchInput()
		qp.inputLocked(p, up, true)
	}
	if held != nil {
		held.endBatchInput()
	}
	d.rxNow.drop()
	d.rxPins.Release()
	// Not deferred (a defer's record and call per batch): a panic in
	// here, which would leave rxBusy set, is a bug in the handling of
	// network input (which never panics); Progress does not release the
	// receive driver on one either.
	if d.realClk {
		d.rxBusy.Store(0)
	}
}

// route finds the QP a parsed packet is for, counting the packets it
// drops: unknown_qp for a QPN the device does not have,
// transport_mismatch for a transport (UC, UD) the QP does not run. A CNP
// goes to any QP, whose reaction point takes or ignores it.
func (d *Device) route(p *packet.Packet) (*QP, error) {
	qp := d.lookup(p.BTH.DestQP())
	if qp == nil && p.BTH.DestQP() == 1 {
		qp = d.openGSIForInput()
	}
	if qp == nil {
		inc(&d.ctr.UnknownQP)
		return nil, ErrUnknownQP
	}
	if p.Info.Transport != qp.transport && p.Info.Transport != bth.TransportCNP {
		inc(&d.ctr.TransportMismatch)
		return nil, ErrTransportMismatch
	}
	return qp, nil
}

// LastRecvError returns the last error the link's Recv returned (counted
// in Counters.RecvErr), or nil.
func (d *Device) LastRecvError() error {
	if e := d.lastRecvErr.Load(); e != nil {
		return *e
	}
	return nil
}

// deferWake records that cq got a completion during the current batch,
// for wakePending to wake its waiters — if it has any to wake: a CQ
// nobody waits on (a polling application's) is left alone. The
// completion is stored (cq.full set) before this looks at the waiters,
// and a waiter counts itself (cq.sleeping) before it looks at full a
// last time, so a waiter this does not see finds the completion itself.
// Receive goroutine only.
func (d *Device) deferWake(cq *CQ) {
	if !cq.wakeQueued && cq.hasWaiters() {
		cq.wakeQueued = true
		d.rxWake = append(d.rxWake, cq)
	}
}

// wakePending wakes the waiters of the CQs that got completions during the
// last batch, and reports whether there were any. Inlined: a polled
// batch's CQs usually have no waiters (a polling application's), and the
// call of an empty list cost ~20 instructions per batch.
func (d *Device) wakePending() bool {
	if len(d.rxWake) == 0 {
		return false
	}
	d.wakeAll()
	return true
}

// wakeAll is wakePending's work for a list that is not empty.
func (d *Device) wakeAll() {
	for i, cq := range d.rxWake {
		cq.wakeQueued = false
		cq.wake()
		d.rxWake[i] = nil
	}
	d.rxWake = d.rxWake[:0]
}

// flushPending sends what the QPs touched by the last received batch
// queued: one Link.Send per QP and batch instead of one per packet, and
// the responses of all the QPs together in one (coalesce.go).
//
// A QP whose queue is empty by now (a ping-pong's: the application
// answered the batch's message with PostSend, and the ACK the batch
// queued left with the answer) only has its mark cleared: respMu, the
// take and the send are for a batch that still has something queued.
func (d *Device) flushPending() {
	d.rxDataQueued = false
	if len(d.rxPending) == 0 {
		return
	}
	for i, qp := range d.rxPending {
		qp.mu.Lock()
		if qp.nout != 0 {
			qp.mu.Unlock()
			d.flushPendingFrom(i)
			return
		}
		qp.rxQueued = false
		qp.mu.Unlock()
		d.rxPending[i] = nil
	}
	d.rxPending = d.rxPending[:0]
}

// flushPendingFrom is flushPending's take and send, from the QP
// rxPending[i] on (those before it had nothing queued).
func (d *Device) flushPendingFrom(i int) {
	// From the first take to the send, what the batch took out of its
	// QPs is on its way to the link but in neither: QP.SendQueued waits
	// on respMu for it, or a DREQ sent after it could overtake an ACK.
	d.respMu.Lock()
	defer d.respMu.Unlock()
	d.respTook++
	for j, qp := range d.rxPending[i:] {
		qp.mu.Lock()
		qp.rxQueued = false
		if took, zc := qp.takeResponses(&d.rxResp); !took {
			qp.flushOut()
		} else if zc {
			qp.zcTaken = d.respTook
		}
		qp.mu.Unlock()
		d.rxPending[i+j] = nil
	}
	d.rxPending = d.rxPending[:0] // those before i were cleared by flushPending
	if h := testHookRespTaken.Load(); h != nil {
		(*h)(d)
	}
	d.rxResp.send(d)
	d.respSent.Store(d.respTook)
}

// testHookRespTaken, when a test sets it, runs in flushPending between
// taking the responses out of the QPs and sending them.
var testHookRespTaken atomic.Pointer[func(d *Device)]

// HandlePacket feeds one RoCEv2 UDP payload (BTH .. ICRC) from src into the
// device as if the link had received it. Tests and tools use it to replay
// captured packets, and a Link may use it to deliver packets in process,
// even from inside its Send (an in-process pipe whose Send calls the peer
// device's HandlePacket, whose answers come back into this one). What
// the packet makes the QP send leaves before it returns, after what the
// received packets before it made the QP send — unless it is called
// from inside a Link.Send (of this device or another) and finds the QP
// busy while a Send of this device is under way (the holder may be
// waiting for that Send): then the packet is copied and handled by the
// device right after, in the order HandlePacket got it, and so are
// those given to HandlePacket until that is done (a caller inside no
// Send waits for its own to be handled). It returns ErrClosed on a closed device, ErrMalformed (wrapping packet's
// error), ErrUnknownQP or ErrTransportMismatch for a packet no QP takes;
// protocol-level drops by the QP are counted, not returned.
func (d *Device) HandlePacket(buf []byte, src netip.Addr) error {
	if d.isClosed() {
		return fmt.Errorf("transport: HandlePacket: %w", ErrClosed)
	}
	var p packet.Packet
	if err := p.Parse(buf); err != nil {
		inc(&d.ctr.MalformedPkts)
		return fmt.Errorf("transport: HandlePacket: %w: %w", ErrMalformed, err)
	}
	qp, err := d.route(&p)
	if err != nil {
		return fmt.Errorf("transport: HandlePacket: %v qp %#x: %w", p.BTH.Opcode(), p.BTH.DestQP(), err)
	}
	if d.inbox.busy() {
		// Behind the packets left there, to keep their order; a caller
		// inside no Send waits for its own, as for a QP's lock.
		if seq := d.inbox.put(d, buf, src); seq != 0 && !calledFromSend() {
			d.inbox.wait(seq)
		}
		return nil
	}
	if !qp.inputNoWait(&p, &udp.Packet{Buf: buf, Addr: src}) {
		d.inbox.put(d, buf, src)
	}
	return nil
}

// pendingACKsOnly reports whether the QPs of the last received batch
// queued bare ACKs (or NAKs) and nothing else. Called by the batch's owner.
//
// The QPs note it themselves as their input queues packets (rxDataQueued,
// under their locks), so that this costs no lock per QP. A request a
// PostSend or a timer adds to one of these QPs afterwards is not seen
// here, but it is not kept back either: PostSend and the timer send
// everything the QP has queued, ACKs included, themselves.
func (d *Device) pendingACKsOnly() bool {
	return len(d.rxPending) > 0 && !d.rxDataQueued
}

// send hands a batch to the link and counts it.
func (d *Device) send(pkts []udp.Packet) {
	if len(pkts) == 0 {
		return
	}
	held := false
	if d.zc {
		pkts, held = d.acquireViews(pkts)
		if len(pkts) == 0 {
			return
		}
	}
	d.sending.Add(1)
	err := d.link.Send(pkts)
	d.sending.Add(-1)
	if held {
		for i := range pkts {
			if h := pkts[i].Hold; h != nil {
				h.Release()
			}
		}
	}
	if err != nil {
		inc(&d.ctr.SendErr)
		return
	}
	atomic.AddUint64(&d.ctr.SentPkts, uint64(len(pkts)))
}

// acquireViews acquires the Hold of every zero-copy packet in pkts, so
// that the memory its payload lies in stays registered while the link
// reads it, and leaves out the packets whose memory was deregistered (its
// MR deregistered, its window unbound or invalidated) since they were
// built: sent, they would carry memory the application owns again, and
// read memory that may be unmapped. Such a packet is as good as lost: a
// READ response's requester asks again and gets the rkey's NAK, a
// request's is resent from the work request, whose gather then fails.
// It returns the packets to send (pkts, compacted in place: the callers
// clear every slot after the send) and whether any Hold is held.
func (d *Device) acquireViews(pkts []udp.Packet) ([]udp.Packet, bool) {
	held := false
	n := 0
	for i := range pkts {
		if h := pkts[i].Hold; h != nil {
			if !h.Acquire() {
				inc(&d.ctr.ZeroCopyDropped)
				continue
			}
			held = true
		}
		if n != i {
			pkts[n] = pkts[i]
		}
		n++
	}
	return pkts[:n], held
}

// randomFirstQPN returns a QPN in [firstQPN, 0x800000): room for 8M QPs
// before the numbers wrap.
func randomFirstQPN() uint32 {
	var b [4]byte
	crand.Read(b[:])
	return firstQPN + binary.BigEndian.Uint32(b[:])%(0x800000-firstQPN)
}

// backlogLink returns link, or a link it wraps (Unwrap), as a
// udp.BacklogLink; nil if none is one.
func backlogLink(link udp.Link) udp.BacklogLink {
	l := link
	for range 8 {
		if b, ok := l.(udp.BacklogLink); ok {
			return b
		}
		u, ok := l.(interface{ Unwrap() udp.Link })
		if !ok {
			return nil
		}
		l = u.Unwrap()
	}
	return nil
}
