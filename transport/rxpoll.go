package transport

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// Receiving: who drives the link.
//
// The device's receive goroutine (recvLoop) reads the link and handles
// each batch: the QPs take their packets, completions are stored and the
// CQ waiters woken, and what the QPs queued (ACKs, responses) is sent.
// A waiter that blocks therefore pays two goroutine hand-offs per message
// on top of what a plain UDP socket costs: the poller wakes the receive
// goroutine, which then wakes the waiter.
//
// A link that busy-polls (udp.SocketOptions.BusyPoll) also lets a polling
// application drive it in its own goroutine, run to completion, the way a
// kernel-bypass NIC driver's poll_cq does: CQ.Poll on an empty CQ, CQ.Wait
// while it spins and Device.Progress receive what the link has (a
// non-blocking TryRecv) and handle the batch right there (a link that can
// be polled but does not busy-poll lets CQ.Poll and Progress do the same
// once they are seen in a polling loop: spinAfter calls with no CQ.Wait
// in between), so the
// completion is in the CQ when the call returns and no other goroutine
// runs on the way. While such a caller keeps polling it holds a lease
// (rxLease, renewed by every poll) and the receive goroutine stays parked;
// the lease lapses a little after the last poll (or at once when CQ.Wait
// stops spinning and goes to sleep), and the receive goroutine takes the
// link back. One lock (rxOwner.holder, only ever tried) makes sure a
// single goroutine receives and handles a batch at a time, so the batch
// state (rxPending, rxWake, rxPins) keeps a single owner. Who holds the
// lock and whom the
// link is leased to is rxOwner's state (rxowner.go), changed only by its
// methods.

// rxDriver is the device's receive state: the batch buffers and who
// drives the link.
type rxDriver struct {
	own  rxOwner // who drives the link: the batch lock's holder and the lease
	pkts []udp.Packet
	bufs [][]byte
	k    int // slots the next receive is given, 1..len(pkts) (freshPkts, received)
	// dirty is how many of the first slots may not hold their own
	// buffer (bufs[i], whole capacity): those the last receive was given;
	// on a link that changes no others (udp.CapRecvPrefix) only those it
	// returned in place, none when not in place. Every slot from dirty on
	// holds its own.
	dirty   int
	prefix  bool // the link has udp.CapRecvPrefix
	inPlace bool // the link was asked to receive in place (SetRecvInPlace)
	p       packet.Packet

	// verify is the link when it leaves the ICRC check of received
	// packets to the device (udp.DeferVerifyLink); nil when Recv checks.
	verify udp.DeferVerifyLink

	pl   udp.PollLink  // nil: only the receive goroutine receives (until idlePolls says spinning)
	spin time.Duration // pl's busy-poll budget
	wl   udp.PollLink  // the link, when waiters may drive it in a blocking Recv (CQ.Wait)
	// idlePolls counts the Progress calls (CQ.Poll on an empty CQ
	// included) since the last CQ.Wait, on a link that does not
	// busy-poll (pl nil, wl set). From spinAfter on the caller is taken
	// for a polling loop and Progress drives the link through wl as it
	// would a busy-polling one (see Progress).
	idlePolls atomic.Uint32
	base      time.Time // lease times are nanoseconds since base
	// renewSkip counts down the Progress calls that renew the lease
	// without reading the clock (renew).
	renewSkip atomic.Int32
	kick      chan struct{} // wakes the receive goroutine when the lease ends early
	// park is the receive goroutine's sleep timer. While waiters have
	// the link (rxLeaseWaiter, rxLeaseLeft) the receive goroutine arms it
	// itself for each look (see rxLookMax); waiters coming in only
	// count themselves in entries.
	park *time.Timer
	// entries counts waiters coming in to drive the link (waitRecv).
	// Pushing park out on every entry instead (as this once did) cost a
	// ping-pong a timer update per message, which often woke the thread
	// in the network poller or another one (the runtime's wakeNetPoller),
	// and kept a timer due within rxLeaseMin at all times:
	// BenchmarkLatency8B SEND blocking 1.33-1.42x raw UDP with it,
	// 1.25-1.38x without (4 alternating runs).
	entries atomic.Uint64
	// deep is set while the receive goroutine sleeps without its timer:
	// its timer fired while a waiter held the link (a waiter that waits
	// longer than rxLeaseMin: a slow peer, a slow machine, an idle link),
	// and looking again every rxLeaseMin would cost a timer expiry and two
	// goroutine switches each time for nothing. Then a waiter coming in
	// leaves the timer alone (never stops it: see waitRecv), and a waiter
	// leaving arms it (rxLeaseMin), so that the link is taken back if none
	// comes back; a kick (a waiter that leaves while others sleep, Close)
	// ends it too.
	deep atomic.Bool
	// deepEntry is when a waiter last came in while deep was set (the
	// lease clock, rx.now); under the batch lock.
	deepEntry int64

	// afterDone and afterStop are the context.AfterFunc that wakes a
	// waiter's Recv when its context ends, kept across waits for the
	// same Done channel (registering one per wait cost an allocation
	// and a lock per message); under the batch lock. afterLast is the Done channel
	// of the last wait and afterNew says it was not the one before:
	// when two waits in a row come with a new context, the application
	// makes one per wait (context.WithTimeout around each CQ.Wait), and
	// the registration is stopped as each such wait ends (waitRecv).
	afterDone <-chan struct{}
	afterStop func() bool
	afterLast <-chan struct{}
	afterNew  bool

	// stats counts what the receive driver did, for tests only: nil
	// outside test binaries (rxStatsOn), where counting costs one nil
	// check per event instead of an atomic add.
	stats *rxStats

	// after says what the next Progress call does, set by the Progress
	// call that handled a batch (see progressLocked): afterBatch, it
	// sends what the batch queued and does not receive; afterACKs (the
	// batch queued bare ACKs only), it does neither, and takes no lock
	// for that. Set under the batch lock; the afterACKs call takes it without.
	after atomic.Uint32

	sleepers atomic.Int32 // goroutines asleep in CQ.Wait (they need someone to receive)
}

// Values of rxDriver.after.
const (
	afterNone  = iota
	afterBatch // right after a polled batch: send what it queued, do not receive
	afterACKs  // right after a polled batch that queued bare ACKs only: do nothing
)

// rxStatsOn makes new devices count their receive driver's events
// (rxDriver.stats); only test binaries set it.
var rxStatsOn bool

// rxStats are the receive driver's event counts that tests read.
type rxStats struct {
	polls     atomic.Uint64 // batches handled by pollers
	skips     atomic.Uint64 // Progress calls that did not receive, right after a batch
	deferred  atomic.Uint64 // Progress calls that kept ACKs back
	heldLooks atomic.Uint64 // park timer fires that found a waiter holding the link
	waited    atomic.Uint64 // batches handled by waiters in a blocking Recv
	looped    atomic.Uint64 // batches handled by the receive goroutine
	looks     atomic.Uint64 // park timer fires while waiters held or had left the link
	ctxWakes  atomic.Uint64 // WakeRecv calls made because a waiter's context ended (ctxWake)
	// The longest wait in the link's Recv and the longest handling of
	// one batch (with its size), in nanoseconds.
	maxWait, maxBusy, maxBusyN atomic.Int64
}

// While waiters have the link (rxLeaseWaiter, rxLeaseLeft), the receive
// goroutine looks (its park timer) whether the last one has gone: every
// rxLeaseMin, and less often (up to rxLookMax) while every look finds a
// waiter in Wait that came in since the last one — a ping-pong between
// waiters, whose next waiter takes the link back at once from a look that
// found it gone. Waiters neither read the clock nor touch a timer on the
// way in or out of Wait, which lie between a message's arrival and the
// answer the application sends.

// testHookDeepEntry, when set (tests only), is called by a waiter that
// comes in while the receive goroutine sleeps in quiet mode (rxDriver.deep),
// before it touches the receive goroutine's timer.
var testHookDeepEntry atomic.Pointer[func(d *Device)]

// rxLeaseMin is the shortest lease a poll takes: the receive goroutine,
// parked while a poller drives the link, wakes at most this often to look
// whether the poller is still there.
const rxLeaseMin = 200 * time.Microsecond

// rxLookMax is the longest the receive goroutine sleeps between looks
// while waiters keep coming in to drive the link: its look interval starts
// at rxLeaseMin and doubles up to this while each look finds a waiter came
// in since the last.
const rxLookMax = 8 * rxLeaseMin

// initRx sets up the batch buffers and the polling mode of the link.
// Called by NewDevice before the receive goroutine starts.
func (d *Device) initRx() {
	rx := &d.rx
	bs := d.link.BatchSize()
	if bs <= 0 {
		bs = 1
	}
	if bs > 256 {
		bs = 256
	}
	rx.pkts = make([]udp.Packet, bs)
	rx.bufs = make([][]byte, bs)
	for i := range rx.pkts {
		rx.bufs[i] = make([]byte, udp.MaxPacketSize)
		rx.pkts[i].Buf = rx.bufs[i]
	}
	rx.k = bs
	rx.dirty = 0 // all hold their own buffers
	rx.kick = make(chan struct{}, 1)
	rx.park = time.NewTimer(time.Hour)
	rx.park.Stop()
	rx.base = time.Now()
	if rxStatsOn {
		rx.stats = new(rxStats)
	}
	// Every batch is handled before the next receive and nothing keeps a
	// received buffer past its batch (what is kept — a MAD, a UD message
	// — is copied), so a link that can hand packets out of its own
	// receive memory may (udp.SocketLink with GRO: no copy per packet).
	// The link's capabilities are asked for by name (udp.CapabilitiesOf),
	// so a wrapper that forwards them (udp.Wrap: a capture, a test
	// double) keeps the paths of the link it wraps.
	caps := udp.CapabilitiesOf(d.link)
	if ip, ok := d.link.(udp.InPlaceRecvLink); ok && caps&udp.CapRecvInPlace != 0 {
		ip.SetRecvInPlace(true)
		rx.inPlace = true
	}
	// Verify-then-place per packet: a link that can leave the ICRC check
	// to its caller (udp.DeferVerifyLink) does, and inputBatch checks
	// each packet right before it handles it, so that a payload placed in
	// registered memory is copied from bytes the check has just brought
	// into L1, and a packet whose ICRC fails is dropped before anything
	// of it is used (docs/PERFORMANCE.md, "Zero-copy send and
	// verify-then-place").
	if dv, ok := d.link.(udp.DeferVerifyLink); ok && caps&udp.CapDeferVerify != 0 && !d.cfg.VerifyInLink {
		dv.SetDeferVerify(true)
		rx.verify = dv
	}
	if _, ok := d.link.(udp.PrefixRecvLink); ok && caps&udp.CapRecvPrefix != 0 {
		rx.prefix = true
	}
	if pl, ok := d.link.(udp.PollLink); ok && caps&udp.CapPoll != 0 {
		rx.wl = pl
		if pl.BusyPoll() > 0 {
			rx.pl, rx.spin = pl, pl.BusyPoll()
		}
	}
}

// freshPkts returns the slots for the next receive, k of them (see
// received), with the driver's own buffers: a link that hands packets out
// in place (SetRecvInPlace) leaves slices of its memory in them. Called
// with the batch lock held.
//
// The slots the last receive was given are reset, not only the n it
// returned: a link may rearrange slots past n — the socket link once
// moved the packets it accepted to the front by swapping whole slots, so
// a rejected datagram's slot (past n) kept the buffer of a slot then
// reset, and two slots shared one buffer: the next recvmmsg wrote two
// datagrams into the same memory. Seen as bad ICRCs on genuine packets in
// TestVethRC (12-05) when only pkts[:n] were reset. A link that says it
// changes no slot past n and keeps the n in their own memory unless in
// place (udp.CapRecvPrefix) has only the n it returned in place reset
// (rx.dirty, set by received), and none when not in place: a ping-pong's
// receive of one packet, or a poll that finds none, then costs one slot's
// reset or none instead of eight. A link only touches the slots it is
// given, so those past k need nothing.
func (rx *rxDriver) freshPkts() []udp.Packet {
	if n := rx.dirty; n > 0 {
		pkts, bufs := rx.pkts[:n], rx.bufs[:n]
		for i := range pkts {
			pkts[i].Buf = bufs[i]
		}
	}
	return rx.pkts[:rx.k]
}

// rxSlotsMin is the fewest slots a receive is given (freshPkts).
const rxSlotsMin = 8

// received records that the receive on freshPkts' slots returned n
// packets and err, and sizes the next receive: twice the slots after one
// that filled them all (up to the batch size), half after one that filled
// less than a quarter (down to rxSlotsMin). A ping-pong, which receives a
// packet or two at a time, resets 8 slots per receive instead of the
// whole batch (a few percent of a polled round trip's CPU); a stream
// grows back to full batches within a few receives. It also records which
// slots the receive may have changed (rx.dirty, for freshPkts): on a link
// with udp.CapRecvPrefix the n it returned in place (none when not in
// place), else all it was given. Called with the batch lock held, right after a
// receive on freshPkts' slots.
func (rx *rxDriver) received(n int, err error) {
	switch {
	case !rx.prefix:
		rx.dirty = rx.k
	case rx.inPlace && n > 0:
		rx.dirty = min(n, rx.k)
	default:
		rx.dirty = 0 // resliced within their own buffers, or none returned
	}
	if err != nil || n <= 0 {
		return
	}
	switch k := rx.k; {
	case n >= k:
		rx.k = min(2*k, len(rx.pkts))
	case 4*n < k:
		rx.k = min(max(k/2, rxSlotsMin), len(rx.pkts))
	}
}

// now returns the lease clock.
func (rx *rxDriver) now() int64 { return int64(time.Since(rx.base)) + 1 }

// leaseLeft returns how long the current poller's lease still runs.
func (rx *rxDriver) leaseLeft() time.Duration {
	if rx.pl == nil && rx.wl == nil {
		return 0
	}
	switch k, until := rx.own.state(); k {
	case rxLeaseWaiter, rxLeaseLeft:
		return rxLeaseMin // until rx.park fires
	case rxLeasePoll:
		return time.Duration(until - rx.now())
	}
	return 0
}

// renew takes or extends the lease for the calling poller. Taking a lapsed
// lease wakes the receive goroutine out of a waiting Recv, so that it lets
// go of the link.
//
// It reads the clock on one call in renewEvery while a poll lease
// stands: a polling loop calls Progress back to back (a ping-pong's
// round trip is a handful of calls per device), far more often than the
// lease (at least rxLeaseMin) lapses, and a clock reading on each call
// was a fair part of the round trip's CPU. A poller that polls so
// slowly that the lease lapses between two readings loses the link to
// the receive goroutine for a while (it goes on receiving and handling
// everything; Progress returns 0 meanwhile) and takes it back at its
// next reading.
func (rx *rxDriver) renew(pl udp.PollLink) {
	if rx.renewSkip.Add(-1) >= 0 && rx.own.pollStands() {
		return
	}
	rx.renewSkip.Store(renewEvery - 1)
	now := rx.now()
	if rx.own.pollUntil(now, now+int64(max(2*rx.spin, rxLeaseMin))) {
		pl.WakeRecv()
	}
}

// spinAfter is how many Progress calls (CQ.Poll on an empty CQ
// included) with no CQ.Wait in between make a caller on a link that does
// not busy-poll a polling loop, which Progress then lets drive the link
// (see Progress). An application that polls a CQ once after each Wait
// (for unsignaled sends, say) never gets there; a loop of Poll and
// runtime.Gosched gets there within a few microseconds.
const spinAfter = 64

// renewEvery is how many Progress calls share one clock reading of the
// poll lease (renew).
const renewEvery = 8

// Progress receives and handles, in the calling goroutine, what the link
// has received — completions land in their CQs, ACKs and responses are
// sent — and returns how many packets it handled. It never blocks on the
// network. It works on links that busy-poll (udp.SocketOptions.BusyPoll),
// and on other links that can be polled (udp.PollLink, as
// udp.SocketLink) once the caller is seen polling: from the spinAfter-th
// call (CQ.Poll on an empty CQ counts) with no CQ.Wait on the device in
// between. Before that, and on links that cannot be polled, it returns 0
// and the device's receive goroutine does the work.
//
// CQ.Poll and CQ.Wait call it themselves; an application that waits for
// an RDMA WRITE by polling memory (as ib_write_lat does) calls it in its
// polling loop, so that the arriving packet is handled right there and not
// in a goroutine it would have to share the processor with.
//
// Without the polling-loop rule, a loop of CQ.Poll and runtime.Gosched on
// a link that does not busy-poll (ibv_poll_cq's idiom, the default
// socket options) waited about a millisecond per message: the Go
// scheduler always found the polling goroutine runnable, so it looked at
// the network poller — where the receive goroutine waited for the
// packet — only when sysmon did (an 8-byte ping-pong between two
// processes, both polling so: 7.6 ms per round trip instead of 13-21 µs).
func (d *Device) Progress() int {
	rx := &d.rx
	pl := rx.pl
	if pl == nil {
		if rx.wl == nil {
			return 0
		}
		if rx.idlePolls.Load() < spinAfter {
			rx.idlePolls.Add(1) // not a polling loop yet
			return 0
		}
		pl = rx.wl
	}
	if d.isClosed() {
		return 0
	}
	if d.skipAfterACKs() {
		return 0
	}
	rx.renew(pl)
	if !rx.own.tryLock(rxHolderPoller) {
		return 0 // another goroutine is handling a batch (or leaving Recv)
	}
	// Unlocked here rather than deferred: a polling loop makes this call
	// several times per message, and the defer's record and call were a
	// tenth of what a call that finds nothing costs. A panic in here is
	// a bug that ends the program (nothing of the stack recovers it).
	n := d.progressLocked(pl)
	rx.own.unlock()
	return n
}

// skipAfterACKs is Progress's usual case right after a polled batch that
// left only ACKs (progressLocked): nothing to receive or send, so the call
// returns 0 without the batch lock and the lease's renewal (a tenth of a
// polled round trip's instructions). It reports whether it took the mark.
// Small enough to be inlined: CQ.Poll of an empty CQ on a busy-polling
// link (rx.pl, where Progress takes this case before anything but its
// closed check, which returns 0 as well) takes it before it calls
// Progress, and saves the call.
func (d *Device) skipAfterACKs() bool {
	rx := &d.rx
	if rx.after.Load() != afterACKs || !rx.after.CompareAndSwap(afterACKs, afterNone) {
		return false
	}
	if st := rx.stats; st != nil {
		st.deferred.Add(1)
		st.skips.Add(1)
	}
	return true
}

// progressLocked is Progress with the receive driver held.
func (d *Device) progressLocked(pl udp.PollLink) int {
	rx := &d.rx
	// What the previous polled batch queued and the caller did not send
	// with requests of its own since — except bare ACKs queued by the
	// call just before this one: they wait for one more call. A polling
	// application often polls another CQ (its send CQ) between the
	// completion and the PostSend that answers it, and sending the ACK
	// alone there would cost the peer a datagram and the answer a system
	// call's delay; one Progress call later they go anyway. (Progress
	// itself takes the usual case, rx.after afterACKs, without the lock;
	// one that finds it here lost the race for it to a goroutine that
	// had the lock meanwhile.)
	//
	// The call right after one that handled a batch does not look at the
	// socket either: it is the application's poll of another CQ (or of
	// the same one, once more) between a completion and its answer, and
	// a receive that finds nothing there is a system call on the round
	// trip's path. The call after it looks again.
	switch rx.after.Swap(afterNone) {
	case afterACKs:
		if st := rx.stats; st != nil {
			st.deferred.Add(1)
			st.skips.Add(1)
		}
		return 0
	case afterBatch:
		d.flushPending()
		if st := rx.stats; st != nil {
			st.skips.Add(1)
		}
		return 0
	}
	d.flushPending()
	pkts := rx.freshPkts()
	n, err := pl.TryRecv(pkts)
	rx.received(n, err)
	if err != nil || n == 0 {
		if err != nil && !errors.Is(err, net.ErrClosed) {
			d.recvFailed(err)
		}
		return 0
	}
	if st := rx.stats; st != nil {
		st.polls.Add(1)
	}
	d.inputBatch(&rx.p, pkts[:n])
	if d.pendingACKsOnly() {
		rx.after.Store(afterACKs)
	} else {
		rx.after.Store(afterBatch)
	}
	// The completions are in their CQs now (and sleeping waiters woken).
	// What the batch queued is not sent yet: a caller that answers a
	// completion with PostSend sends it together with its request, in
	// one Link.Send; whatever is left goes at the next Progress, or when
	// the receive goroutine takes the link back.
	d.wakePending()
	return n
}

// waitRecv is CQ.Wait's sleep on a device whose link does not busy-poll:
// instead of sleeping until the receive goroutine wakes it, the waiter
// receives itself, in a blocking Recv (the goroutine parks in Go's poller
// just as one reading a plain UDP socket does), and handles each batch
// until cq has a completion or an error, or ctx ends. The batch's ACKs
// are left for the caller's next PostSend (or the next Wait); an
// application that does neither (a slow backend) does not hold them: the
// receive goroutine sends them when it takes the link back, at its first
// or second look after the waiter left (at most about 2×rxLookMax later;
// TestACKNotHeldByBusyApp, nvmf's TestSlowBackendNoRetransmit). It
// reports false, having done nothing, when another
// waiter is receiving already (then the caller sleeps as before: that one
// wakes it); the caller then counts itself in sleepers while it sleeps.
func (d *Device) waitRecv(ctx context.Context, cq *CQ) bool {
	rx := &d.rx
	if rx.wl == nil || d.isClosed() || ctx.Err() != nil {
		return false // the caller's select sees the end
	}
	if !rx.own.tryLock(rxHolderWaiter) {
		if rx.own.heldBy() == rxHolderWaiter {
			return false
		}
		// The receive goroutine has the link: take it (it leaves its
		// Recv and parks while the lease is held). Never block on the batch lock:
		// the lease can be cut short (a waiter leaving sets its own) and
		// the receive goroutine go back into a Recv that nothing ends, so
		// the claim and the wake are repeated until the batch lock is free — or the
		// wait has what it waited for, and the claim is given back.
		for tries := 0; !rx.own.tryLock(rxHolderWaiter); tries++ {
			if rx.own.heldBy() == rxHolderWaiter {
				return false // another waiter took it: it holds the lease and wakes us
			}
			if cq.ready() || ctx.Err() != nil || d.isClosed() {
				rx.own.release()
				select {
				case rx.kick <- struct{}{}:
				default:
				}
				return false
			}
			rx.own.hold()
			rx.wl.WakeRecv()
			if tries < 64 {
				runtime.Gosched()
			} else {
				time.Sleep(20 * time.Microsecond)
			}
		}
	}
	rx.after.Store(afterNone) // Progress's skip is for the call right after its own batch
	rx.entries.Add(1)
	if rx.deep.Load() {
		// Waits are long (see rxDriver.deep): the receive goroutine
		// sleeps, and the timer the last waiter to leave armed wakes it
		// once, rxLeaseMin after that leave, to find this waiter holding
		// the link and sleep again. Unless waiters come back quickly
		// again: then arming it on every leave would add an earlier timer
		// for a sleeping scheduler thread each time (a wake-up of that
		// thread per message): back to the receive goroutine's own
		// rxLeaseMin looks.
		//
		// The timer is never stopped here. A waiter that did (to spare
		// that one wake-up) could stop the receive goroutine's own timer
		// instead: the leave's timer fired between this waiter's look at
		// deep and its Stop, the receive goroutine left quiet mode and
		// armed the timer for its next look, and the Stop took that away.
		// It then slept with neither a timer nor deep set, so no waiter
		// leaving armed it again, and once the application stopped
		// waiting nothing received at all: the peer's requests went
		// unacknowledged until its retry count ran out
		// (TestLeaveAfterDeepEntryRace; TestPerfBidi under load).
		if h := testHookDeepEntry.Load(); h != nil {
			(*h)(d)
		}
		now := rx.now()
		if now-rx.deepEntry <= int64(2*rxLeaseMin) {
			rx.deep.Store(false)
			rx.park.Reset(rxLeaseMin)
		}
		rx.deepEntry = now
	}
	rx.own.hold()
	done := ctx.Done()
	perWait := done != nil && done != rx.afterLast && rx.afterNew
	rx.afterNew = done != nil && done != rx.afterLast
	rx.afterLast = done
	if done != nil && done != rx.afterDone {
		// A spurious WakeRecv, when a context waited with once ends
		// later, costs whoever is in Recv then one early return.
		if rx.afterStop != nil {
			rx.afterStop()
		}
		rx.afterDone, rx.afterStop = done, context.AfterFunc(ctx, rx.ctxWake)
	}
	for {
		cq.driving.Store(true)
		if cq.ready() || ctx.Err() != nil || d.isClosed() {
			cq.driving.Store(false)
			break
		}
		// Nothing for this waiter yet: what the last batch queued
		// cannot wait for its PostSend.
		d.flushPending()
		pkts := rx.freshPkts()
		n, err := d.link.Recv(pkts)
		rx.received(n, err)
		cq.driving.Store(false)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && !d.isClosed() {
				d.recvFailed(err)
			}
			break
		}
		if n > 0 {
			if st := rx.stats; st != nil {
				st.waited.Add(1)
			}
			d.inputBatch(&rx.p, pkts[:n])
			got := cq.ready() // the batch stored a completion in cq (it had none before)
			woke := d.wakePending()
			if got {
				// cq is ready (unless another goroutine polled it
				// meanwhile: then Wait comes back), no need to look.
				break
			}
			if woke {
				// The batch woke other waiters (completions on their
				// CQs): let them run here and now, before this one
				// receives again. Each answers with PostSend while the
				// ACK its message queued is still in its QP, and the
				// two leave in one Link.Send; otherwise the loop's
				// flushPending sends the ACKs alone first (1.45 Link.Sends
				// per message against 1.18 with 8 waiters,
				// TestWaitersAnswerWithACK; between two processes 33,000
				// round trips/s of 8 pairs against 48,000-61,000).
				runtime.Gosched()
			}
		}
	}
	if perWait {
		// A context per wait: its cancel, right after this wait
		// returns, would otherwise run the AfterFunc — a new goroutine,
		// often a sleeping thread woken for it, and a spurious WakeRecv
		// that makes the next waiter's Recv return early and enter
		// again: an 8-byte ping-pong of 19 µs per round trip took 36 µs
		// that way. Stopped here it costs a lock and no goroutine.
		rx.afterStop()
		rx.afterDone, rx.afterStop = nil, nil
	}
	// Keep the link for a moment: a ping-pong is back in Wait soon. If
	// others sleep in Wait, the receive goroutine must take over now.
	if rx.sleepers.Load() > 0 {
		rx.own.release()
		select {
		case rx.kick <- struct{}{}:
		default:
		}
	} else {
		rx.own.leave()
		if rx.deep.Load() {
			// The receive goroutine sleeps without its timer: arm it,
			// or nobody takes the link back if no waiter comes. (It
			// sets deep before it looks at the lease once more, so
			// either it sees this leave or this sees its deep.)
			rx.park.Reset(rxLeaseMin)
		}
	}
	rx.own.unlock()
	return true
}

// ctxWake is the context.AfterFunc of a waiter's context (waitRecv): it
// makes the Recv waiting return, so that the waiter sees its context end.
func (rx *rxDriver) ctxWake() {
	if st := rx.stats; st != nil {
		st.ctxWakes.Add(1)
	}
	rx.wl.WakeRecv()
}

// stopPolling says the application stops polling for now (it sleeps on a
// completion channel): the count of polls that makes a polling loop
// starts over, and a poll lease ends at once, the receive goroutine
// woken to take the link.
func (rx *rxDriver) stopPolling() {
	rx.resetPolls()
	if rx.own.endPoll() && rx.kick != nil {
		select {
		case rx.kick <- struct{}{}:
		default:
		}
	}
}

// resetPolls starts the count of polls that makes a polling loop over
// (a waiter, or an application about to sleep, is no polling loop).
func (rx *rxDriver) resetPolls() {
	if rx.idlePolls.Load() != 0 {
		rx.idlePolls.Store(0) // no store, and no cache line taken, when it is 0
	}
}

// polling reports whether callers drive the link (Progress works).
func (d *Device) polling() bool { return d.rx.pl != nil }

// progressable reports whether Progress may drive the link: it busy-polls,
// or it can be polled and a polling loop is seen (Progress).
func (d *Device) progressable() bool { return d.rx.pl != nil || d.rx.wl != nil }

// recvFailed counts a failed Recv and keeps its error for LastRecvError.
func (d *Device) recvFailed(err error) {
	inc(&d.ctr.RecvErr)
	e := err // a copy: taking err's address would move it to the heap on every Recv
	d.lastRecvErr.Store(&e)
}

// lookLeft is the receive goroutine's look at a link its last waiter
// left since the previous look, with waiters having come in since: it
// receives and handles what is waiting, without blocking, and leaves the
// link to the waiters (a ping-pong's next waiter is back any moment; an
// application that stopped waiting is found out at the next look, which
// finds no waiter came in). It reports whether it handled a batch.
func (d *Device) lookLeft() bool {
	rx := &d.rx
	if !rx.own.tryLock(rxHolderLoop) {
		return false // a waiter is back
	}
	defer rx.own.unlock()
	pkts := rx.freshPkts()
	n, err := rx.wl.TryRecv(pkts)
	rx.received(n, err)
	if err != nil || n == 0 {
		if err != nil && !errors.Is(err, net.ErrClosed) && !d.isClosed() {
			d.recvFailed(err)
		}
		return false
	}
	if st := rx.stats; st != nil {
		st.looped.Add(1)
	}
	rx.after.Store(afterNone)
	d.inputBatch(&rx.p, pkts[:n])
	d.wakePending()
	d.flushPending()
	return true
}

// recvLoop is the device's receive goroutine.
func (d *Device) recvLoop() {
	defer close(d.done)
	rx := &d.rx
	backoff := time.Millisecond
	// deepSleep parks until rx.park fires (it reports true) or a kick;
	// in quiet mode the timer is armed by a waiter that leaves (see
	// rxDriver.deep). sleep sets rx.park to dt first.
	deepSleep := func() bool {
		select {
		case <-rx.park.C:
			return true
		case <-rx.kick:
			return false
		}
	}
	sleep := func(dt time.Duration) bool {
		rx.park.Reset(dt)
		return deepSleep()
	}
	busy := 0
	look := rxLeaseMin // the next look while waiters hold the link
	for {
		if d.isClosed() {
			return
		}
		if rx.own.waiters() {
			// Waiters drive the link. Look now and then (every
			// rxLeaseMin, less often while waiters keep coming): take
			// the link when the last one has left.
			seen := rx.entries.Load()
			var fired bool
			if rx.deep.Load() {
				fired = deepSleep()
			} else {
				fired = sleep(look)
			}
			if !fired {
				rx.deep.Store(false)
				look = rxLeaseMin
				continue
			}
			if st := rx.stats; st != nil {
				st.looks.Add(1)
			}
			if rx.own.kind() == rxLeaseLeft && rx.entries.Load() != seen {
				// Waiters came and went since the last look: the last
				// one may be back any moment (a ping-pong), or gone to
				// poll memory. Leave them the link, but handle what
				// waits to be received; look again soon if something
				// did (an application that polls memory between its
				// waits), later if not.
				rx.deep.Store(false)
				if d.lookLeft() {
					look = rxLeaseMin
				} else {
					look = min(2*look, rxLookMax)
				}
				continue
			}
			if !rx.own.reclaim() {
				if rx.entries.Load() != seen {
					// Waiters keep coming: look again later, and
					// less often while they do (each look is a
					// timer expiry and a wake-up on some thread, in
					// the middle of their exchange). Out of quiet
					// mode: the next look needs the timer.
					rx.deep.Store(false)
					look = min(2*look, rxLookMax)
					continue
				}
				// A waiter holds the link, and has for a whole look:
				// sleep until one leaves (rxDriver.deep).
				look = rxLeaseMin
				if st := rx.stats; st != nil {
					st.heldLooks.Add(1)
				}
				rx.deep.Store(true)
				if rx.own.kind() != rxLeaseWaiter {
					rx.deep.Store(false) // it left meanwhile, maybe without arming the timer
				}
				continue
			}
			// The last waiter left before the last look and none came
			// since: take the link.
			look = rxLeaseMin
			rx.deep.Store(false)
		} else if left := rx.leaseLeft(); left > 0 {
			// A poller drives the link: stay out of its way until its
			// lease lapses or it lets go.
			sleep(min(left, rxLeaseMin))
			continue
		}
		// Never block on the batch lock: a goroutine blocked there would be woken
		// by every Unlock of the caller driving the link.
		if !rx.own.tryLock(rxHolderLoop) {
			if busy++; busy < 16 {
				runtime.Gosched()
			} else {
				sleep(rxLeaseMin / 4)
			}
			continue
		}
		busy = 0
		rx.after.Store(afterNone)
		// Driving the link itself, this goroutine is not in quiet mode
		// (a waiter that left with others asleep kicked it out of it):
		// the next waiter must push its timer out, not stop it.
		rx.deep.Store(false)
		d.flushPending() // left by the last poller's or waiter's batch
		if rx.leaseLeft() > 0 {
			rx.own.unlock()
			continue
		}
		pkts := rx.freshPkts()
		st := rx.stats
		var t0, t1 time.Time
		if st != nil {
			t0 = time.Now()
		}
		n, err := d.link.Recv(pkts)
		rx.received(n, err)
		if st != nil {
			t1 = time.Now()
			if g := t1.Sub(t0).Nanoseconds(); g > st.maxWait.Load() {
				st.maxWait.Store(g)
			}
		}
		if err != nil {
			rx.own.unlock()
			if errors.Is(err, net.ErrClosed) || d.isClosed() {
				return
			}
			// A failing link is counted and retried with a growing
			// pause (1 ms .. 100 ms) so a persistent error neither
			// spins nor goes unseen; LastRecvError tells what it is.
			d.recvFailed(err)
			time.Sleep(backoff)
			backoff = min(2*backoff, 100*time.Millisecond)
			continue
		}
		backoff = time.Millisecond
		if n > 0 && st != nil {
			st.looped.Add(1)
		}
		d.inputBatch(&rx.p, pkts[:n])
		// Wake the completion waiters first and let one run here and
		// now: a goroutine readied by this one waits on this P, and when
		// the link's Recv blocks its thread in the kernel (udp sockets
		// outside the netpoller) it waits until sysmon retakes the P,
		// often 100+ µs. An application that answers a completion with
		// PostSend (a ping-pong, a window refill) also sends its
		// requests together with the ACKs this batch queued, in one
		// Link.Send.
		if d.wakePending() {
			runtime.Gosched()
		}
		d.flushPending()
		rx.own.unlock()
		if st != nil {
			if g := time.Since(t1).Nanoseconds(); g > st.maxBusy.Load() {
				st.maxBusy.Store(g)
				st.maxBusyN.Store(int64(n))
			}
		}
	}
}
