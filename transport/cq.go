package transport

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// CQ is a completion queue of fixed depth. Completions of the send and
// receive queues of any number of QPs of its device may be directed to one
// CQ.
//
// A CQ that would have to hold more than depth completions overflows: the
// completion is lost, the CQ enters an error state (Err reports
// ErrCQOverflow), the device raises EventCQErr, and every QP that then
// fails to store a completion in it moves to the error state (EventQPFatal),
// as verbs does. Completions stored before the overflow can still be
// polled.
//
// All methods are safe for concurrent use: any number of goroutines may
// Poll and Wait on one CQ; each completion is returned to exactly one of
// them.
type CQ struct {
	dev *Device
	ch  *CompChannel // nil without a completion channel

	mu     sync.Mutex
	ring   []WC // grows (doubling) up to depth as completions pile up
	depth  int  // the capacity asked for
	head   int  // next to poll
	n      int  // stored entries
	err    error
	armed  notifyMode // ReqNotify: the next (solicited) completion fires a channel event
	fire   bool       // a channel event is due at the next wake
	notify chan struct{}

	users     int  // send and receive queues of QPs using the CQ (under dev.mu)
	destroyed bool // under dev.mu

	wakeQueued bool // on dev.rxWake (dev's receive goroutine only)

	driving atomic.Bool // a waiter of this CQ is in the link's blocking Recv (Device.waitRecv)

	// full mirrors n > 0 || err != nil, written under mu: Poll of an
	// empty CQ (a polling loop's usual case, and the send CQ of a
	// ping-pong every round) returns without taking mu.
	full atomic.Bool
	// sleeping counts the waiters about to sleep, or asleep, on notify:
	// signal sends on notify only when there is one. A waiter counts
	// itself before it looks at full a last time, and store sets full
	// before it signals, so either the waiter sees the completion or
	// the signal sees the waiter.
	sleeping atomic.Int32
}

type notifyMode uint8

const (
	notifyOff notifyMode = iota
	notifyNext
	notifySolicited
)

// CQAttr are the creation parameters of a CQ (CreateCQWith).
type CQAttr struct {
	// Depth is how many completions the CQ holds (1..4194304).
	Depth int
	// Channel, if not nil, receives the CQ when a completion arrives
	// after ReqNotify armed it (ibv_comp_channel).
	Channel *CompChannel
}

// CreateCQ creates a completion queue that holds up to depth completions.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	return d.CreateCQWith(CQAttr{Depth: depth})
}

// CreateCQWith creates a completion queue with the attributes a.
func (d *Device) CreateCQWith(a CQAttr) (*CQ, error) {
	if a.Depth <= 0 || a.Depth > 1<<22 {
		return nil, errorf(ErrInvalidConfig, "CreateCQ: depth %d out of range 1..%d", a.Depth, 1<<22)
	}
	if a.Channel != nil && a.Channel.dev != d {
		return nil, errorf(ErrWrongDevice, "CreateCQ: channel")
	}
	cq := &CQ{dev: d, ch: a.Channel, ring: make([]WC, min(a.Depth, cqRingStart)), depth: a.Depth, notify: make(chan struct{}, 1)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isClosed() {
		return nil, ErrClosed
	}
	if a.Channel != nil {
		if err := a.Channel.attach(); err != nil {
			return nil, err
		}
	}
	d.cqs[cq] = struct{}{}
	return cq, nil
}

// cqRingStart is how many completions a new CQ's ring holds before it
// first grows: an idle CQ of depth 256 holds 0.6 KB of ring, not 10 KB (a
// server with a CQ per connection keeps thousands of them).
const cqRingStart = 16

// Depth returns the capacity of the CQ.
func (cq *CQ) Depth() int { return cq.depth }

// grow doubles the ring (at most to depth), its entries moved to the
// front in order. Under cq.mu, with the ring full.
func (cq *CQ) grow() {
	r := make([]WC, min(2*len(cq.ring), cq.depth))
	k := copy(r, cq.ring[cq.head:])
	copy(r[k:], cq.ring[:cq.head])
	cq.ring, cq.head = r, 0
}

// Destroy removes the CQ. It fails with ErrBusy while QPs use it (verbs'
// EBUSY): destroy them first. Waiters return ErrDestroyed. On a closed
// device it returns ErrClosed.
func (cq *CQ) Destroy() error { return cq.destroy(nil) }

// DestroyCause destroys the CQ like Destroy; its waiters and later calls
// see an error that matches both ErrDestroyed and cause (a connection
// manager passes its ErrClosed: a goroutine waiting on the CQ of a
// closed connection learns it in the manager's words).
func (cq *CQ) DestroyCause(cause error) error { return cq.destroy(cause) }

func (cq *CQ) destroy(cause error) error {
	d := cq.dev
	d.mu.Lock()
	switch {
	case d.isClosed():
		d.mu.Unlock()
		return errorf(ErrClosed, "CQ.Destroy")
	case cq.destroyed:
		d.mu.Unlock()
		return errorf(ErrDestroyed, "CQ.Destroy")
	case cq.users > 0:
		// users counts queues (a QP with this CQ for both its send
		// and receive queue counts twice): name the QPs.
		n := 0
		for _, qp := range d.qps {
			if qp.sendCQ == cq || qp.recvCQ == cq {
				n++
			}
		}
		d.mu.Unlock()
		return errorf(ErrBusy, "CQ.Destroy: %d QPs use the CQ (as send or receive CQ)", n)
	}
	cq.destroyed = true
	delete(d.cqs, cq)
	d.mu.Unlock()
	if cq.ch != nil {
		cq.ch.detach()
	}
	if cause != nil {
		cq.fail(fmt.Errorf("%w (%w)", ErrDestroyed, cause))
	} else {
		cq.fail(ErrDestroyed)
	}
	return nil
}

// fail puts the CQ in an error state (if it is not in one) and wakes every
// waiter.
func (cq *CQ) fail(err error) {
	cq.mu.Lock()
	if cq.err == nil {
		cq.err = err
	}
	cq.full.Store(true)
	cq.mu.Unlock()
	cq.wake()
}

// push stores one completion and wakes a waiter; it reports false on
// overflow.
func (cq *CQ) push(wc *WC, solicited bool) bool {
	ok, wake := cq.store(wc, solicited)
	if wake {
		cq.wake()
	}
	return ok
}

// store is storeLocked with cq.mu taken and released (and an overflow
// raised); it does not wake a waiter.
func (cq *CQ) store(wc *WC, solicited bool) (ok, wake bool) {
	cq.mu.Lock()
	ok, wake = cq.storeLocked(wc, solicited)
	cq.mu.Unlock()
	if wake && !ok {
		cq.overflowed()
	}
	return ok, wake
}

// storeLocked stores one completion; the caller holds cq.mu and wakes a
// waiter after unlocking it. ok is false when the completion was lost
// (overflow, or a CQ in error); wake reports whether a waiter must be
// woken (a completion was stored, or the CQ just overflowed: then ok is
// false, and the caller calls overflowed after unlocking). solicited
// marks a receive completion of a message with the solicited event bit.
func (cq *CQ) storeLocked(wc *WC, solicited bool) (ok, wake bool) {
	slot, over := cq.slotLocked()
	if slot == nil {
		return false, over
	}
	*slot = *wc
	if cq.armed != notifyOff {
		cq.armedLocked(solicited, wc.Status)
	}
	return true, true
}

// slotFast is slotLocked's usual case, in line (the receive completions
// and an ACK's run of completions take it first): room in the ring and
// no error; it sets full with the first completion, as slotLocked does.
// nil means slotLocked must decide (a full ring grows or overflows; a
// CQ in error loses the completion).
func (cq *CQ) slotFast() *WC {
	if n, r := cq.n, cq.ring; n < len(r) && cq.err == nil {
		i := cq.head + n
		if i >= len(r) {
			i -= len(r)
		}
		cq.n = n + 1
		if n == 0 {
			cq.full.Store(true)
		}
		return &r[i]
	}
	return nil
}

// slotLocked takes the ring entry the next completion goes to, under
// cq.mu: the caller writes the whole entry before it unlocks, calls
// armedLocked if cq.armed is set, and wakes a waiter after unlocking
// (storeLocked does all that for a WC built elsewhere; the hot callers
// write the entry in place). nil means the completion is lost
// (overflow, or a CQ in error); over reports that this one overflowed
// the CQ: the caller then calls overflowed after unlocking, and wakes
// the waiters too.
func (cq *CQ) slotLocked() (slot *WC, over bool) {
	if cq.err != nil {
		return nil, false
	}
	if cq.n == len(cq.ring) && len(cq.ring) < cq.depth {
		cq.grow()
	}
	if cq.n == len(cq.ring) {
		cq.err = ErrCQOverflow
		cq.full.Store(true)
		return nil, true
	}
	i := cq.head + cq.n
	if i >= len(cq.ring) {
		i -= len(cq.ring)
	}
	cq.n++
	if cq.n == 1 {
		cq.full.Store(true)
	}
	return &cq.ring[i], false
}

// armedLocked applies ReqNotify's arming to a completion just stored
// with status st (solicited: a receive completion of a solicited
// message): the next channel event is due. Under cq.mu.
func (cq *CQ) armedLocked(solicited bool, st WCStatus) {
	if cq.armed == notifyNext || (cq.armed == notifySolicited && (solicited || st != WCSuccess)) {
		cq.armed = notifyOff
		cq.fire = true
	}
}

// overflowed counts the overflow storeLocked reported and raises
// EventCQErr. Without cq.mu.
func (cq *CQ) overflowed() {
	inc(&cq.dev.ctr.CQOverflow)
	cq.dev.raise(AsyncEvent{Type: EventCQErr, CQ: cq, Err: ErrCQOverflow})
}

// wake delivers a due channel event and lets one waiter run; a waiter that
// leaves completions (or an error) behind passes the wake on.
func (cq *CQ) wake() {
	if cq.ch != nil {
		cq.mu.Lock()
		f := cq.fire
		cq.fire = false
		cq.mu.Unlock()
		if f {
			cq.ch.deliver(cq)
		}
	}
	cq.signal()
}

func (cq *CQ) signal() {
	if cq.sleeping.Load() > 0 {
		select {
		case cq.notify <- struct{}{}:
		default:
		}
	}
	if cq.driving.Load() {
		// The waiter is in the link's Recv (Device.waitRecv), not on
		// notify: make it look.
		cq.dev.rx.wl.WakeRecv()
	}
}

// hasWaiters reports whether a completion stored in the CQ has someone to
// wake (wake): a waiter asleep or about to sleep on notify, one in the
// link's Recv, or a completion channel that may be armed.
func (cq *CQ) hasWaiters() bool {
	return cq.ch != nil || cq.sleeping.Load() > 0 || cq.driving.Load()
}

// ready reports whether a waiter would return: completions or an error.
func (cq *CQ) ready() bool {
	return cq.full.Load()
}

// Poll copies up to len(wc) completions into wc, oldest first, and returns
// how many it copied. It never blocks. On a device whose link busy-polls
// (udp.SocketOptions.BusyPoll), Poll on an empty CQ first receives and
// handles what the link has, in the caller's goroutine (Device.Progress),
// so a polling loop drives the link itself; on a socket link that does
// not, a loop that keeps polling does too, once Device.Progress takes it
// for one (spinAfter polls with no Wait in between).
func (cq *CQ) Poll(wc []WC) int {
	// poll's look at full, made here: an empty CQ (a polling loop's
	// usual case) costs no call.
	if cq.full.Load() {
		if k, _ := cq.poll(wc); k > 0 {
			return k
		}
	}
	if len(wc) == 0 || cq.dev.rx.pl != nil && cq.dev.skipAfterACKs() { // Progress's first case, without its call
		return 0
	}
	if cq.dev.progressable() && cq.dev.Progress() > 0 {
		k, _ := cq.poll(wc)
		return k
	}
	return 0
}

// poll is Poll that also reports whether completions or an error remain,
// so that another waiter must be woken.
func (cq *CQ) poll(wc []WC) (k int, more bool) {
	if !cq.full.Load() {
		return 0, false
	}
	cq.mu.Lock()
	for k < len(wc) && cq.n > 0 {
		wc[k] = cq.ring[cq.head]
		cq.head++
		if cq.head == len(cq.ring) {
			cq.head = 0
		}
		cq.n--
		k++
	}
	more = cq.n > 0 || cq.err != nil
	if !more {
		cq.full.Store(false)
	}
	cq.mu.Unlock()
	return k, more
}

// Err returns ErrCQOverflow once the CQ has overflowed, ErrClosed once its
// device is closed, ErrDestroyed once it is destroyed, else nil.
func (cq *CQ) Err() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.err
}

// Wait blocks until at least one completion is available and polls it
// like Poll; wc must hold at least one WC (else ErrInvalidArgument). It returns ctx.Err() when ctx ends first, and the CQ's error
// (ErrCQOverflow, ErrClosed, ErrDestroyed) when the CQ has one and holds no
// more stored completions. Any number of goroutines may wait on one CQ.
//
// On a udp.SocketLink, Wait receives in the caller's goroutine: it waits
// in the link's Recv, as a goroutine reading a plain UDP socket does, and
// handles what arrives right there (see Device.Progress). When the link
// busy-polls (udp.SocketOptions.BusyPoll), Wait first polls for up to
// that long, driving the link with non-blocking receives and yielding the
// processor between tries.
func (cq *CQ) Wait(ctx context.Context, wc []WC) (int, error) {
	if len(wc) == 0 {
		// Nothing could be returned, so Wait could only spin or block
		// for nothing: refuse it.
		return 0, errorf(ErrInvalidArgument, "CQ.Wait: wc is empty (pass at least one WC)")
	}
	cq.dev.rx.resetPolls() // a waiter is no polling loop (Device.Progress)
	if cq.dev.polling() {
		if n, err, done := cq.spin(ctx, wc); done {
			return n, err
		}
	}
	for {
		n, more := cq.poll(wc)
		if more {
			// Completions (or an error) are left for another waiter:
			// pass the wake on, or it would sleep on a signal this
			// waiter consumed.
			cq.signal()
		}
		if n > 0 {
			return n, nil
		}
		if err := cq.Err(); err != nil {
			return 0, err
		}
		if cq.dev.waitRecv(ctx, cq) {
			continue
		}
		cq.sleeping.Add(1)
		if cq.full.Load() {
			// Stored since the poll above, maybe without a signal
			// (it found nobody sleeping).
			cq.sleeping.Add(-1)
			continue
		}
		cq.dev.rx.sleepers.Add(1)
		select {
		case <-cq.notify:
			cq.sleeping.Add(-1)
			cq.dev.rx.sleepers.Add(-1)
		case <-ctx.Done():
			cq.sleeping.Add(-1)
			cq.dev.rx.sleepers.Add(-1)
			if n, more := cq.poll(wc); n > 0 {
				if more {
					cq.signal()
				}
				return n, nil
			}
			return 0, ctx.Err()
		}
	}
}

// spin is Wait's busy-polling phase: it polls the CQ and drives the link
// for up to the link's busy-poll budget. done reports that it has Wait's
// result; otherwise Wait goes on waiting in the link's Recv, or asleep.
func (cq *CQ) spin(ctx context.Context, wc []WC) (n int, err error, done bool) {
	d := cq.dev
	var deadline time.Time
	for i := 0; ; i++ {
		n, more := cq.poll(wc)
		if more {
			cq.signal()
		}
		if n > 0 {
			return n, nil, true
		}
		if d.Progress() > 0 {
			continue
		}
		if err := cq.Err(); err != nil {
			return 0, err, true
		}
		if i&63 == 63 && ctx.Err() != nil {
			return 0, ctx.Err(), true
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(d.rx.spin)
		} else if now.After(deadline) {
			// Wait goes on in the link's Recv (Device.waitRecv),
			// keeping the link.
			return 0, nil, false
		}
		runtime.Gosched()
	}
}

// ReqNotify arms the CQ's completion channel (ibv_req_notify_cq): the next
// completion stored in the CQ — with solicitedOnly, the next receive
// completion of a message sent with SendSolicited, or any completion with
// an error — sends the CQ once on the channel. Completions already in the
// CQ do not fire; poll after arming so none is missed. It fails without a
// channel.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if cq.ch == nil {
		return errorf(ErrInvalidConfig, "ReqNotify: the CQ has no completion channel")
	}
	// Arming is what an application does before it sleeps on the
	// channel: it is no polling loop now, and a poll lease it holds
	// would keep the receive goroutine off the link until it lapsed
	// (rxLeaseMin), every message of a ReqNotify-Poll-sleep loop
	// waiting for that (see Device.Progress).
	cq.dev.rx.stopPolling()
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.err != nil {
		return fmt.Errorf("transport: ReqNotify: %w", cq.err)
	}
	if solicitedOnly {
		if cq.armed != notifyNext {
			cq.armed = notifySolicited
		}
	} else {
		cq.armed = notifyNext
	}
	return nil
}

// CompChannel is a completion channel (ibv_comp_channel): CQs created
// with it send themselves on C() when a completion arrives after
// CQ.ReqNotify, so one goroutine can select over many CQs, and over other
// channels, at once. Each arming yields at most one event. C() is closed
// when the channel is destroyed or its device is closed.
//
// All methods are safe for concurrent use.
type CompChannel struct {
	dev *Device
	c   chan *CQ

	mu     sync.Mutex
	ncq    int
	max    int
	closed bool
}

// CreateCompChannel creates a completion channel for up to maxCQs CQs
// (1..65536): each of them can have one event waiting in C() at a time.
func (d *Device) CreateCompChannel(maxCQs int) (*CompChannel, error) {
	if maxCQs <= 0 || maxCQs > 1<<16 {
		return nil, errorf(ErrInvalidConfig, "CreateCompChannel: maxCQs %d out of range 1..%d", maxCQs, 1<<16)
	}
	ch := &CompChannel{dev: d, c: make(chan *CQ, maxCQs), max: maxCQs}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isClosed() {
		return nil, ErrClosed
	}
	d.chans[ch] = struct{}{}
	return ch, nil
}

// C returns the channel on which armed CQs are delivered.
func (ch *CompChannel) C() <-chan *CQ { return ch.c }

// Destroy closes the channel. It fails with ErrBusy while CQs use it,
// with ErrDestroyed once destroyed, and with ErrClosed on a closed device
// (whose Close closed the channel).
func (ch *CompChannel) Destroy() error {
	if ch.dev.isClosed() {
		return errorf(ErrClosed, "CompChannel.Destroy")
	}
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return errorf(ErrDestroyed, "CompChannel.Destroy")
	}
	if ch.ncq > 0 {
		n := ch.ncq
		ch.mu.Unlock()
		return errorf(ErrBusy, "CompChannel.Destroy: %d CQs use the channel", n)
	}
	ch.mu.Unlock()
	ch.dev.mu.Lock()
	delete(ch.dev.chans, ch)
	ch.dev.mu.Unlock()
	ch.close()
	return nil
}

func (ch *CompChannel) close() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.closed {
		ch.closed = true
		close(ch.c)
	}
}

func (ch *CompChannel) attach() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	switch {
	case ch.closed:
		return errorf(ErrDestroyed, "CreateCQ: completion channel")
	case ch.ncq >= ch.max:
		return errorf(ErrLimit, "CreateCQ: completion channel has its %d CQs", ch.max)
	}
	ch.ncq++
	return nil
}

func (ch *CompChannel) detach() {
	ch.mu.Lock()
	ch.ncq--
	ch.mu.Unlock()
}

// deliver sends cq on the channel. It never blocks: the channel holds one
// event per CQ, and a CQ whose earlier event is still unread (re-armed
// before it was received) needs no second one.
func (ch *CompChannel) deliver(cq *CQ) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return
	}
	select {
	case ch.c <- cq:
	default:
	}
}
