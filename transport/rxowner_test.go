package transport

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
)

// TestRxOwnerTransitions: the receive driver's owner state, one
// transition at a time — the lease (none, poll until a deadline, waiter,
// left) and the holder of the batch lock — as rxpoll.go drives it.
func TestRxOwnerTransitions(t *testing.T) {
	type step struct {
		op string // what is done (see do below)
		// After it: the lease's kind, a poll lease's deadline, and what
		// the op reported (lapsed, reclaimed, locked; "" when nothing).
		kind  rxLeaseKind
		until int64
		ret   string
	}
	const now, later = 1000, 5000
	tests := []struct {
		name  string
		steps []step
	}{
		{"a waiter takes the link and hands it back at once (others sleep)", []step{
			{"hold", rxLeaseWaiter, 0, ""},
			{"release", rxLeaseNone, 0, ""},
		}},
		{"a waiter leaves, the receive goroutine's look takes the link back", []step{
			{"hold", rxLeaseWaiter, 0, ""},
			{"leave", rxLeaseLeft, 0, ""},
			{"reclaim", rxLeaseNone, 0, "true"},
			{"reclaim", rxLeaseNone, 0, "false"}, // nothing left to take
		}},
		{"a waiter back before the look keeps the link", []step{
			{"hold", rxLeaseWaiter, 0, ""},
			{"leave", rxLeaseLeft, 0, ""},
			{"hold", rxLeaseWaiter, 0, ""},
			{"reclaim", rxLeaseWaiter, 0, "false"},
		}},
		{"a poller takes a free link: the receive goroutine must be woken", []step{
			{"poll now", rxLeasePoll, now + 10, "lapsed"},
			{"poll now", rxLeasePoll, now + 10, "standing"},   // renewed before its deadline
			{"poll later", rxLeasePoll, later + 10, "lapsed"}, // renewed after it
		}},
		{"a poller replaces a waiter's lease without a wake", []step{
			{"hold", rxLeaseWaiter, 0, ""},
			{"poll now", rxLeasePoll, now + 10, "standing"},
			{"leave", rxLeaseLeft, 0, ""},
			{"poll now", rxLeasePoll, now + 10, "standing"},
		}},
		{"the receive goroutine's reclaim leaves a poll lease alone", []step{
			{"poll now", rxLeasePoll, now + 10, "lapsed"},
			{"reclaim", rxLeasePoll, now + 10, "false"},
			{"release", rxLeaseNone, 0, ""},
		}},
		{"one holder of the batch lock at a time", []step{
			{"lock loop", rxLeaseNone, 0, "receive goroutine"},
			{"lock waiter", rxLeaseNone, 0, "receive goroutine"}, // refused: still the loop's
			{"unlock", rxLeaseNone, 0, "none"},
			{"lock waiter", rxLeaseNone, 0, "waiter"},
			{"lock poller", rxLeaseNone, 0, "waiter"},
			{"unlock", rxLeaseNone, 0, "none"},
			{"lock poller", rxLeaseNone, 0, "poller"},
			{"unlock", rxLeaseNone, 0, "none"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o rxOwner
			if k, u := o.state(); k != rxLeaseNone || u != 0 || o.heldBy() != rxHolderNone {
				t.Fatalf("zero owner: lease %v until %d, holder %v", k, u, o.heldBy())
			}
			for i, s := range tt.steps {
				ret := ""
				switch s.op {
				case "hold":
					o.hold()
				case "leave":
					o.leave()
				case "release":
					o.release()
				case "reclaim":
					ret = fmt.Sprint(o.reclaim())
				case "poll now", "poll later":
					at := int64(now)
					if s.op == "poll later" {
						at = later
					}
					ret = "standing"
					if o.pollUntil(at, at+10) {
						ret = "lapsed"
					}
				case "lock loop", "lock waiter", "lock poller":
					h := map[string]rxHolder{"lock loop": rxHolderLoop, "lock waiter": rxHolderWaiter, "lock poller": rxHolderPoller}[s.op]
					o.tryLock(h)
					ret = o.heldBy().String()
				case "unlock":
					o.unlock()
					ret = o.heldBy().String()
				default:
					t.Fatalf("unknown op %q", s.op)
				}
				k, u := o.state()
				if k != s.kind || (k == rxLeasePoll && u != s.until) || ret != s.ret {
					t.Fatalf("step %d %q: lease %v until %d, reported %q; want %v until %d, %q", i, s.op, k, u, ret, s.kind, s.until, s.ret)
				}
				if w := k == rxLeaseWaiter || k == rxLeaseLeft; o.waiters() != w {
					t.Fatalf("step %d %q: waiters() = %v with lease %v", i, s.op, o.waiters(), k)
				}
				if o.pollStands() != (k == rxLeasePoll) {
					t.Fatalf("step %d %q: pollStands() = %v with lease %v", i, s.op, o.pollStands(), k)
				}
			}
		})
	}
}

// TestRxLeasePacking: a poll lease's deadline survives the packing with
// its kind for the whole range of the lease clock (nanoseconds since the
// device started, well past a century), and the kinds do not bleed into
// each other.
func TestRxLeasePacking(t *testing.T) {
	for _, k := range []rxLeaseKind{rxLeaseNone, rxLeasePoll, rxLeaseWaiter, rxLeaseLeft} {
		for _, until := range []int64{0, 1, 200_000, 1 << 40, leaseUntilMask} {
			gk, gu := unpackLease(packLease(k, until))
			if gk != k || gu != until {
				t.Errorf("pack(%v, %d) unpacks to (%v, %d)", k, until, gk, gu)
			}
		}
	}
}

// stubPollLink is a udp.PollLink that counts WakeRecv calls and
// receives nothing.
type stubPollLink struct {
	udp.Link
	wakes int
}

func (l *stubPollLink) TryRecv([]udp.Packet) (int, error) { return 0, nil }
func (l *stubPollLink) WakeRecv()                         { l.wakes++ }
func (l *stubPollLink) BusyPoll() time.Duration           { return time.Second } // a 2-s lease: no lapse between calls

// TestRxDriverLease: the receive driver's reading of its owner state —
// leaseLeft, what the receive goroutine waits for (nothing while none,
// the rest of a poll lease, one look while waiters have the link) — and
// renew, a poller's lease: it wakes the link's Recv when it takes a free
// or lapsed lease, not when it renews a standing one, and reads the clock
// only every renewEvery calls while its lease stands.
func TestRxDriverLease(t *testing.T) {
	pl := &stubPollLink{}
	rx := &rxDriver{pl: pl, wl: pl, spin: pl.BusyPoll(), base: time.Now()}
	if l := rx.leaseLeft(); l != 0 {
		t.Fatalf("leaseLeft with no lease = %v", l)
	}
	rx.own.hold()
	if l := rx.leaseLeft(); l != rxLeaseMin {
		t.Fatalf("leaseLeft while a waiter holds the link = %v, want %v", l, rxLeaseMin)
	}
	rx.own.leave()
	if l := rx.leaseLeft(); l != rxLeaseMin {
		t.Fatalf("leaseLeft after the waiter left = %v, want %v", l, rxLeaseMin)
	}
	rx.own.release()
	rx.renew(pl)
	if pl.wakes != 1 {
		t.Fatalf("a poller taking a free link woke Recv %d times, want 1", pl.wakes)
	}
	if l := rx.leaseLeft(); l <= 0 || l > 2*rx.spin {
		t.Fatalf("leaseLeft of a fresh poll lease = %v, want (0, %v]", l, 2*rx.spin)
	}
	for range 3 * renewEvery {
		rx.renew(pl)
	}
	if pl.wakes != 1 {
		t.Fatalf("renewing a standing lease woke Recv: %d wakes", pl.wakes)
	}
	// Lapsed: the deadline lies behind the clock.
	rx.own.pollUntil(rx.now(), rx.now()-1)
	if l := rx.leaseLeft(); l > 0 {
		t.Fatalf("leaseLeft of a lapsed lease = %v", l)
	}
	rx.renewSkip.Store(0) // the next renew reads the clock
	rx.renew(pl)
	if pl.wakes != 2 {
		t.Fatalf("taking a lapsed lease woke Recv %d times in all, want 2", pl.wakes)
	}
	if k, _ := rx.own.state(); k != rxLeasePoll {
		t.Fatalf("lease after renew: %v", k)
	}
}
