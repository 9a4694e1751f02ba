package transport

import "sync/atomic"

// rxOwner is who drives the device's link (rxpoll.go): the goroutine
// that receives and handles a batch (holder, its only lock), and the
// lease that keeps the receive goroutine away from the link while
// a busy-polling caller or a CQ waiter drives it. Every change of owner
// is one of its methods; the holder and the lease are single atomic
// words, so that a poller renews its lease and a waiter takes or leaves
// the link without a lock.
//
// The lease and the holder are apart on purpose: the lease says who may
// drive the link (a waiter holds it while it sleeps in the link's Recv
// and leaves it behind when it returns, so the next waiter takes the link
// again without waking the receive goroutine), the holder who is in the
// middle of a receive or batch right now.
type rxOwner struct {
	// holder is the rxHolder receiving and handling a batch, or
	// rxHolderNone: a lock that is only ever tried (tryLock), one word
	// where a sync.Mutex and a record of its holder were two, and an
	// unlock small enough to be inlined into Progress.
	holder atomic.Int32
	// lease is an rxLease packed into one word: the kind in the top two
	// bits, a poll lease's deadline (lease clock, rxDriver.now) below.
	lease atomic.Uint64
}

// rxHolder is who holds the batch lock (rxOwner.holder).
type rxHolder int32

const (
	rxHolderNone   rxHolder = iota // the batch lock is free
	rxHolderLoop                   // the receive goroutine (recvLoop, lookLeft)
	rxHolderPoller                 // a busy-polling caller (Device.Progress)
	rxHolderWaiter                 // a CQ waiter in a blocking Recv (Device.waitRecv)
)

func (h rxHolder) String() string {
	switch h {
	case rxHolderNone:
		return "none"
	case rxHolderLoop:
		return "receive goroutine"
	case rxHolderPoller:
		return "poller"
	case rxHolderWaiter:
		return "waiter"
	}
	return "holder?"
}

// rxLeaseKind is whom the link is leased to, away from the receive
// goroutine.
type rxLeaseKind uint8

const (
	// rxLeaseNone: the receive goroutine drives the link.
	rxLeaseNone rxLeaseKind = iota
	// rxLeasePoll: a busy-polling caller drives it until the lease's
	// deadline, which each poll pushes out (rxDriver.renew); the receive
	// goroutine takes the link back once the deadline has passed.
	rxLeasePoll
	// rxLeaseWaiter: a CQ waiter drives it from a blocking Recv
	// (Device.waitRecv), until it leaves.
	rxLeaseWaiter
	// rxLeaseLeft: the last waiter left; the link stays with waiters
	// until the receive goroutine's next look finds none came back
	// (recvLoop), so that a ping-pong's next waiter takes it without
	// waking the receive goroutine and neither reads the clock nor
	// touches a timer on its way in or out of Wait.
	rxLeaseLeft
)

func (k rxLeaseKind) String() string {
	switch k {
	case rxLeaseNone:
		return "none"
	case rxLeasePoll:
		return "poll"
	case rxLeaseWaiter:
		return "waiter"
	case rxLeaseLeft:
		return "left"
	}
	return "lease?"
}

const (
	leaseKindShift = 62
	leaseUntilMask = 1<<leaseKindShift - 1
)

func packLease(k rxLeaseKind, until int64) uint64 {
	return uint64(k)<<leaseKindShift | uint64(until)&leaseUntilMask
}

func unpackLease(w uint64) (rxLeaseKind, int64) {
	return rxLeaseKind(w >> leaseKindShift), int64(w & leaseUntilMask)
}

// tryLock takes the batch lock for h without blocking; it reports
// whether it did. Nobody blocks on it: a goroutine blocked there would be
// woken by every unlock of the one driving the link. Like a mutex's, the
// successful take happens after the unlock that freed it (sequentially
// consistent atomics), so the batch state it guards passes from holder
// to holder.
func (o *rxOwner) tryLock(h rxHolder) bool {
	return o.holder.CompareAndSwap(int32(rxHolderNone), int32(h))
}

// unlock releases the batch lock.
func (o *rxOwner) unlock() { o.holder.Store(int32(rxHolderNone)) }

// heldBy returns who holds the batch lock (rxHolderNone when free).
func (o *rxOwner) heldBy() rxHolder { return rxHolder(o.holder.Load()) }

// state returns the lease: its kind and, for rxLeasePoll, its deadline.
func (o *rxOwner) state() (rxLeaseKind, int64) { return unpackLease(o.lease.Load()) }

// kind returns the lease's kind.
func (o *rxOwner) kind() rxLeaseKind { k, _ := o.state(); return k }

// waiters reports whether waiters have the link (rxLeaseWaiter or
// rxLeaseLeft): the receive goroutine only looks now and then.
func (o *rxOwner) waiters() bool {
	k := o.kind()
	return k == rxLeaseWaiter || k == rxLeaseLeft
}

// hold gives the link to a waiter that drives it in a blocking Recv, or
// is about to (it claims the link from the receive goroutine first).
func (o *rxOwner) hold() { o.lease.Store(packLease(rxLeaseWaiter, 0)) }

// leave is a waiter's way out when nobody sleeps in Wait: the link stays
// with waiters until the receive goroutine's next look (rxLeaseLeft).
func (o *rxOwner) leave() { o.lease.Store(packLease(rxLeaseLeft, 0)) }

// release hands the link back to the receive goroutine at once (a waiter
// that leaves while others sleep, or that gives a claim back).
func (o *rxOwner) release() { o.lease.Store(packLease(rxLeaseNone, 0)) }

// reclaim is the receive goroutine's take-back of a link its waiters
// left: rxLeaseLeft becomes rxLeaseNone; false if a waiter holds the link
// again (or it was not left).
func (o *rxOwner) reclaim() bool {
	return o.lease.CompareAndSwap(packLease(rxLeaseLeft, 0), packLease(rxLeaseNone, 0))
}

// endPoll ends a poll lease at once (the receive goroutine may take the
// link) and reports whether there was one; any other lease stays.
func (o *rxOwner) endPoll() bool {
	for {
		w := o.lease.Load()
		if k, _ := unpackLease(w); k != rxLeasePoll {
			return false
		}
		if o.lease.CompareAndSwap(w, packLease(rxLeaseNone, 0)) {
			return true
		}
	}
}

// pollStands reports whether a poll lease is stored, lapsed or not (the
// caller renewing it reads the clock only now and then).
func (o *rxOwner) pollStands() bool { return o.kind() == rxLeasePoll }

// pollUntil takes or extends a poll lease until the deadline until (lease
// clock); it reports whether the lease it replaced had lapsed before now
// (none, or a poll lease past its deadline) — then the receive goroutine
// may be in a blocking Recv and must be woken to let go of the link. A
// waiter's lease is replaced too (a busy-polling caller drives the link
// from then on) without a wake: that waiter's Recv ends on its own.
func (o *rxOwner) pollUntil(now, until int64) (lapsed bool) {
	k, old := unpackLease(o.lease.Swap(packLease(rxLeasePoll, until)))
	switch k {
	case rxLeaseNone:
		return true
	case rxLeasePoll:
		return old < now
	}
	return false
}
