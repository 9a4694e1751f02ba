package transport

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// A QP whose peer dies under a WRITE reports it: Failed closes and Err
// is the retry-exceeded WCError.
func TestFailedOnRetryExceeded(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{timeout: 8, retry: 2}) // ~1 ms ACK timeout
	buf, mr := a.buffer(t, 64, 0)
	_, dst := b.buffer(t, 64, memreg.AccessRemoteWrite)
	select {
	case <-a.qp.Failed():
		t.Fatal("Failed closed before anything failed")
	default:
	}
	b.dev.Close()
	if err := a.qp.PostSend(SendWR{WRID: 7, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(mr, 0, len(buf)),
		RemoteAddr: dst.IOVA(), RKey: dst.RKey()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.qp.Failed():
	case <-time.After(5 * time.Second):
		t.Fatal("Failed not closed 5 s after the peer died")
	}
	var we *WCError
	if err := a.qp.Err(); !errors.As(err, &we) || we.Status != WCRetryExcErr || we.WRID != 7 {
		t.Fatalf("Err = %v, want retry exceeded for wr_id 7", err)
	}
}

// Probe on a live idle peer: the peer's ACK moves Activity, the QP stays
// in RTS and no completion appears; on a dead peer the QP fails with a
// WCError for ProbeWRID and still no completion appears.
func TestProbe(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{timeout: 8, retry: 2})
	before := a.qp.Activity()
	if err := a.qp.Probe(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.qp.Activity() == before {
		if time.Now().After(deadline) {
			t.Fatal("no ACK for the probe")
		}
		time.Sleep(time.Millisecond)
	}
	// The probe leaves the queue once acknowledged.
	for {
		a.qp.mu.Lock()
		n := a.qp.probes
		a.qp.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("probe still outstanding after its ACK")
		}
		time.Sleep(time.Millisecond)
	}
	if st := a.qp.State(); st != QPSRTS {
		t.Fatalf("state %v after a probe, want RTS", st)
	}
	noWC(t, a.scq)
	noWC(t, b.rcq)
	if c := a.dev.Counters().KeepAliveProbes; c != 1 {
		t.Fatalf("keep_alive_probes = %d, want 1", c)
	}

	b.dev.Close()
	if err := a.qp.Probe(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.qp.Failed():
	case <-time.After(5 * time.Second):
		t.Fatal("a probe to a dead peer did not fail the QP")
	}
	var we *WCError
	if err := a.qp.Err(); !errors.As(err, &we) || we.Status != WCRetryExcErr || we.WRID != ProbeWRID {
		t.Fatalf("Err = %v, want retry exceeded of the probe", err)
	}
	noWC(t, a.scq)
	if err := a.qp.Probe(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("Probe in ERR: %v, want ErrInvalidState", err)
	}
}

// A probe does not take a slot of max_send_wr.
func TestProbeOutsideMaxSendWR(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{sqDepth: 2})
	b.dev.Close() // nothing is ever acknowledged
	buf, mr := a.buffer(t, 8, 0)
	if err := a.qp.Probe(); err != nil {
		t.Fatal(err)
	}
	wr := SendWR{Opcode: WRWrite, SGEs: sge(mr, 0, len(buf)), RemoteAddr: 0x1000, RKey: 1}
	if err := a.qp.PostSend(wr, wr); err != nil {
		t.Fatalf("two WRs beside a probe in a queue of 2: %v", err)
	}
	if err := a.qp.PostSend(wr); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third WR: %v, want ErrQueueFull", err)
	}
}

// PostSendContext waits for room instead of failing, and gives up with
// ctx's error (and ErrQueueFull) naming the first WR not posted.
func TestPostSendContext(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{sqDepth: 4})
	const n = 64
	buf, mr := a.buffer(t, n*16, 0)
	_, dst := b.buffer(t, n*16, memreg.AccessRemoteWrite)
	wrs := make([]SendWR, n)
	for i := range wrs {
		wrs[i] = SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(mr, i*16, 16),
			RemoteAddr: dst.IOVA() + uint64(i*16), RKey: dst.RKey()}
	}
	fill(buf, 3)
	if err := a.qp.PostSend(wrs...); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("PostSend of %d WRs on a queue of 4: %v, want ErrQueueFull", n, err)
	}
	got := waitWC(t, a.scq, 4, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.qp.PostSendContext(ctx, wrs[4:]...); err != nil {
		t.Fatal(err)
	}
	got = append(got, waitWC(t, a.scq, n-4, 5*time.Second)...)
	for i, wc := range got {
		if wc.Status != WCSuccess || wc.WRID != uint64(i) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}

	// A dead peer: the queue never drains, ctx ends the wait.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	a3, b3, _ := newPair(t, pairOpts{sqDepth: 2, timeout: 20})
	b3.dev.Close()
	_, mr3 := a3.buffer(t, 16, 0)
	w3 := SendWR{Opcode: WRWrite, SGEs: sge(mr3, 0, 16), RemoteAddr: 1, RKey: 1}
	err := a3.qp.PostSendContext(ctx2, w3, w3, w3, w3)
	var we *WRError
	if !errors.As(err, &we) || we.Index != 2 || !errors.Is(err, ErrQueueFull) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PostSendContext on a stuck queue: %v, want a WRError at index 2 matching ErrQueueFull and DeadlineExceeded", err)
	}
}

// WaitSendRoom returns at once with room, and an error once the device
// is closed.
func TestWaitSendRoom(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{sqDepth: 1, timeout: 20})
	ctx := context.Background()
	if err := a.qp.WaitSendRoom(ctx); err != nil {
		t.Fatal(err)
	}
	b.dev.Close()
	_, mr := a.buffer(t, 16, 0)
	if err := a.qp.PostSend(SendWR{Opcode: WRWrite, SGEs: sge(mr, 0, 16), RemoteAddr: 1, RKey: 1}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.qp.WaitSendRoom(ctx) }()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("WaitSendRoom returned %v with a full queue", err)
	default:
	}
	a.dev.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitSendRoom after Device.Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitSendRoom still waiting after Device.Close")
	}
}

// DestroyCause: waiters on the CQ and callers of the QP see the cause.
func TestDestroyCause(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	cause := errors.New("owner closed")
	done := make(chan error, 1)
	go func() {
		var wc [1]WC
		_, err := a.rcq.Wait(context.Background(), wc[:])
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := a.qp.DestroyCause(cause); err != nil {
		t.Fatal(err)
	}
	if err := a.rcq.DestroyCause(cause); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, cause) || !errors.Is(err, ErrDestroyed) {
			t.Fatalf("CQ waiter: %v, want the cause and ErrDestroyed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CQ waiter not woken")
	}
	if err := a.qp.PostRecv(RecvWR{}); !errors.Is(err, cause) || !errors.Is(err, ErrDestroyed) {
		t.Fatalf("PostRecv on the destroyed QP: %v", err)
	}
	select {
	case <-a.qp.Failed():
	default:
		t.Fatal("Failed not closed by Destroy")
	}
	if err := a.qp.Err(); !errors.Is(err, cause) {
		t.Fatalf("Err = %v, want the cause", err)
	}
}

// A local ACK timer that fires late because this process was not
// scheduled must not spend a retry. Deterministic, on a ManualClock: the
// responder's ACKs are dropped while the test holds the requester's QP
// lock; the ACK timer (timeout 8, ~1 ms) comes due in another goroutine
// and waits for the lock; the clock moves 10 timeouts on meanwhile (the
// process was "not scheduled"), then the lock is released and the ACKs
// pass again. With retry_cnt 0, counting that expiry as a retry would
// fail the WRITE (retry exceeded); it resends instead, counted in
// ack_timeout_late, and the resend's ACK completes it.
func TestLateTimerSpendsNoRetry(t *testing.T) {
	clk := manual()
	clk.lateTimers = true
	a, b, _, lb := linkPair(t, pairOpts{clock: clk, timeout: 8, retry: 0}, 0, 0)
	to := a.qp.timeout
	var dropAcks atomic.Bool
	var dropped atomic.Int32
	lb.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() == bth.RCAck && dropAcks.Load() {
			dropped.Add(1)
			return true
		}
		return false
	}
	buf, mr := a.buffer(t, 64, 0)
	_, dst := b.buffer(t, 64, memreg.AccessRemoteWrite)
	const rounds = 5
	for i := 0; i < rounds; i++ {
		dropAcks.Store(true)
		d0 := dropped.Load()
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(mr, 0, len(buf)),
			RemoteAddr: dst.IOVA(), RKey: dst.RKey()}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the responder's ACK (dropped)", func() bool { return dropped.Load() > d0 })
		a.qp.mu.Lock()
		f0, _ := a.dev.tq.stats()
		fired := make(chan struct{})
		go func() {
			clk.Advance(to) // the ACK timer comes due and waits for the QP lock
			close(fired)
		}()
		eventually(t, "the ACK timer's expiry", func() bool { f, _ := a.dev.tq.stats(); return f > f0 })
		clk.Advance(10 * to) // "not scheduled" for 10 timeouts
		dropAcks.Store(false)
		a.qp.mu.Unlock()
		<-fired
		wc := waitWC(t, a.scq, 1, 5*time.Second)
		c := a.dev.Counters()
		if wc[0].Status != WCSuccess {
			t.Fatalf("round %d: %v after a late expiry (ack_timeout_late %d, local_ack_timeout %d)", i, wc[0].Err(),
				c.AckTimeoutLate, c.LocalAckTimeout)
		}
		if c.AckTimeoutLate != uint64(i+1) || c.LocalAckTimeout != 0 {
			t.Fatalf("round %d: ack_timeout_late %d, local_ack_timeout_err %d; want %d and 0", i, c.AckTimeoutLate, c.LocalAckTimeout, i+1)
		}
	}
	// The same expiry on time spends the retry: with retry_cnt 0 the
	// WRITE fails, counted in local_ack_timeout_err (the test would pass
	// for nothing if every expiry were taken for late).
	dropAcks.Store(true)
	if err := a.qp.PostSend(SendWR{WRID: rounds, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(mr, 0, len(buf)),
		RemoteAddr: dst.IOVA(), RKey: dst.RKey()}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(to)
	wc := waitWC(t, a.scq, 1, 5*time.Second)
	if c := a.dev.Counters(); wc[0].Status != WCRetryExcErr || c.LocalAckTimeout != 1 || c.AckTimeoutLate != rounds {
		t.Fatalf("an on-time expiry with retry_cnt 0: %v, counters late %d / on time %d; want retry exceeded, %d / 1",
			wc[0].Status, c.AckTimeoutLate, c.LocalAckTimeout, rounds)
	}
}

// backlogWrap is a link whose RecvBacklog the test sets.
type backlogWrap struct {
	udp.Wrap
	backlog atomic.Bool
}

func (l *backlogWrap) RecvBacklog() bool { return l.backlog.Load() }

// An ACK timer that expires on time while datagrams wait unread in the
// link (udp.BacklogLink: the receive goroutine was not scheduled to read
// them, and the ACK may be among them) spends no retry either; without a
// backlog the same expiry does. Deterministic: ManualClock, the
// responder's ACKs dropped, retry_cnt 0.
func TestBacklogExpirySpendsNoRetry(t *testing.T) {
	clk := manual()
	clk.lateTimers = true
	o := pairOpts{clock: clk, timeout: 8, retry: 0}
	o.defaults()
	ra, rb := memLinks(t, memnet.Faults{})
	la := &backlogWrap{Wrap: udp.Wrap{Link: ra}}
	lb := &psnLink{Wrap: udp.Wrap{Link: rb}}
	a, b := sideOn(t, la, &o), sideOn(t, lb, &o)
	connect(t, a, b, addrB, 0, 0, &o)
	connect(t, b, a, addrA, 0, 0, &o)
	if a.dev.backlog != udp.BacklogLink(la) {
		t.Fatalf("the device did not find the link's RecvBacklog")
	}
	var dropAcks atomic.Bool
	var dropped atomic.Int32
	lb.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() == bth.RCAck && dropAcks.Load() {
			dropped.Add(1)
			return true
		}
		return false
	}
	buf, mr := a.buffer(t, 64, 0)
	_, dst := b.buffer(t, 64, memreg.AccessRemoteWrite)
	to := a.qp.timeout
	post := func(id uint64) {
		t.Helper()
		d0 := dropped.Load()
		dropAcks.Store(true)
		if err := a.qp.PostSend(SendWR{WRID: id, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(mr, 0, len(buf)),
			RemoteAddr: dst.IOVA(), RKey: dst.RKey()}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the responder's ACK (dropped)", func() bool { return dropped.Load() > d0 })
	}
	post(1)
	la.backlog.Store(true)
	clk.Advance(to) // on time, with a backlog: resend without spending the retry
	la.backlog.Store(false)
	c := a.dev.Counters()
	if c.AckTimeoutLate != 1 || c.LocalAckTimeout != 0 {
		t.Fatalf("an expiry with a backlog: ack_timeout_late %d, local_ack_timeout_err %d; want 1 and 0", c.AckTimeoutLate, c.LocalAckTimeout)
	}
	clk.Advance(to) // on time, no backlog: retry_cnt 0 is exhausted
	wc := waitWC(t, a.scq, 1, 5*time.Second)
	if c := a.dev.Counters(); wc[0].Status != WCRetryExcErr || c.LocalAckTimeout != 1 || c.AckTimeoutLate != 1 {
		t.Fatalf("an expiry without a backlog: %v, late %d / on time %d; want retry exceeded, 1 / 1", wc[0].Status, c.AckTimeoutLate, c.LocalAckTimeout)
	}
}

// othersBehind: a wall-clock device sees another device of the process
// that is behind on its input (datagrams unread, or stuck in a batch), and
// not a closed one or itself.
func TestOthersBehind(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	mk := func(a netip.Addr) (*Device, *backlogWrap) {
		r, err := n.Link(a)
		if err != nil {
			t.Fatal(err)
		}
		l := &backlogWrap{Wrap: udp.Wrap{Link: r}}
		d, err := NewDevice(l, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d, l
	}
	da, la := mk(addrA)
	db, lb := mk(addrB)
	// Only these two (a device another test left open must not count).
	procDevs.mu.Lock()
	saved := procDevs.list
	procDevs.list = []*Device{da, db}
	procDevs.mu.Unlock()
	t.Cleanup(func() {
		procDevs.mu.Lock()
		procDevs.list = slices.DeleteFunc(saved, func(d *Device) bool { return d == da || d == db })
		procDevs.mu.Unlock()
	})
	to := 10 * time.Millisecond
	if da.othersBehind(to) || db.othersBehind(to) {
		t.Fatal("behind with nothing waiting")
	}
	la.backlog.Store(true)
	if da.othersBehind(to) {
		t.Error("a device counts its own backlog as another's")
	}
	if !db.othersBehind(to) {
		t.Error("b does not see a's backlog")
	}
	la.backlog.Store(false)
	db.rxBusy.Store(busyMarkAgo(2 * to))
	if !da.othersBehind(to) {
		t.Error("a does not see b stuck in a batch for two timeouts")
	}
	db.rxBusy.Store(busyMarkAgo(to / 2))
	if da.othersBehind(to) {
		t.Error("a takes b half a timeout into a batch for behind")
	}
	db.rxBusy.Store(0)
	lb.backlog.Store(true)
	db.Close()
	if da.othersBehind(to) {
		t.Error("a closed device still counts")
	}
	// A ManualClock device is not in the process's list.
	r, err := memnet.NewMemNetwork(memnet.Faults{}).Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lm := &backlogWrap{Wrap: udp.Wrap{Link: r}}
	dm, err := NewDevice(lm, DeviceConfig{Clock: manual()})
	if err != nil {
		t.Fatal(err)
	}
	defer dm.Close()
	lm.backlog.Store(true)
	if da.othersBehind(to) {
		t.Error("a ManualClock device counts for the wall-clock ones")
	}
}

// Every waiter for send-queue room wakes when room comes back or the QP
// goes: none sleeps on a wake-up another one took (a queue of one WR, three
// waiters — two in WaitSendRoom, one in PostSendContext).
func TestRoomWaitersAllWoken(t *testing.T) {
	for _, tc := range []struct {
		name string
		free func(a, b *side, rbuf *memreg.MR) error // makes room, or ends the QP
		want error                                   // WaitSendRoom's result; nil: room
	}{
		{"ack", func(a, b *side, rbuf *memreg.MR) error { // the peer's receive ends the RNR retries
			return b.qp.PostRecv(RecvWR{WRID: 9, SGEs: sge(rbuf, 0, 16)})
		}, nil},
		{"error", func(a, b *side, _ *memreg.MR) error { return a.qp.Modify(&QPAttr{State: QPSErr}, AttrState) }, nil},
		{"destroy", func(a, b *side, _ *memreg.MR) error { return a.qp.Destroy() }, ErrDestroyed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, _ := newPair(t, pairOpts{sqDepth: 1, rnrRetry: 7, minRNR: 1})
			_, mr := a.buffer(t, 16, 0)
			_, rbuf := b.buffer(t, 16, 0)
			send := SendWR{WRID: 1, Opcode: WRSend, SGEs: sge(mr, 0, 16)}
			if err := a.qp.PostSend(send); err != nil { // no receive at b: RNR NAKs, retried for ever
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			type res struct {
				who string
				err error
			}
			done := make(chan res, 3)
			for i := range 2 {
				go func() { done <- res{fmt.Sprint("WaitSendRoom ", i), a.qp.WaitSendRoom(ctx)} }()
			}
			go func() {
				done <- res{"PostSendContext", a.qp.PostSendContext(ctx, SendWR{WRID: 2, Opcode: WRWrite, SGEs: sge(mr, 0, 0)})}
			}()
			time.Sleep(50 * time.Millisecond)
			select {
			case r := <-done:
				t.Fatalf("%s returned %v with the queue full", r.who, r.err)
			default:
			}
			if err := tc.free(a, b, rbuf); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				select {
				case r := <-done:
					switch {
					case r.who == "PostSendContext" && tc.want != nil:
						if !errors.Is(r.err, tc.want) {
							t.Errorf("%s: %v, want %v", r.who, r.err, tc.want)
						}
					case r.who == "PostSendContext":
						if r.err != nil {
							t.Errorf("%s: %v", r.who, r.err)
						}
					case tc.want == nil && r.err != nil, tc.want != nil && !errors.Is(r.err, tc.want):
						t.Errorf("%s: %v, want %v", r.who, r.err, tc.want)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a waiter still sleeps 5 s after room came back (or the QP went)")
				}
			}
		})
	}
}

// A destroyed object refuses what is asked of it with ErrDestroyed (ErrClosed
// once the device is closed), and a nil PD is named: none of these calls
// succeeds on a dead object or names another cause.
func TestDestroyedObjectsRefuse(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, mr := a.buffer(t, 16, 0)

	srq, err := a.dev.CreateSRQ(a.pd, SRQAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := srq.PostRecv(RecvWR{WRID: 1, SGEs: sge(mr, 0, 16)}); err != nil {
		t.Fatal(err)
	}
	if err := srq.Destroy(); err != nil {
		t.Fatal(err)
	}
	ch, err := a.dev.CreateCompChannel(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Destroy(); err != nil {
		t.Fatal(err)
	}
	_, nilPD := a.dev.CreateSRQ(nil, SRQAttr{MaxWR: 4})
	qp, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: a.scq, RecvCQ: a.rcq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	conn := ConnParams{Peer: netip.MustParseAddr("192.0.2.2"), DestQPN: b.qp.QPN()}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"SRQ.PostRecv after Destroy", srq.PostRecv(RecvWR{WRID: 2, SGEs: sge(mr, 0, 16)}), ErrDestroyed},
		{"SRQ.Modify after Destroy", srq.Modify(1), ErrDestroyed},
		{"SRQ.Destroy twice", srq.Destroy(), ErrDestroyed},
		{"CompChannel.Destroy twice", ch.Destroy(), ErrDestroyed},
		{"CreateSRQ(nil pd)", nilPD, ErrInvalidConfig},
		{"Connect after QP.Destroy", qp.Connect(conn), ErrDestroyed},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if n := srq.Len(); n != 0 {
		t.Errorf("SRQ.Len after Destroy = %d, want 0 (its WRs are dropped)", n)
	}
	qp2, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: a.scq, RecvCQ: a.rcq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	a.dev.Close()
	if err := qp2.Connect(conn); !errors.Is(err, ErrClosed) {
		t.Errorf("Connect after Device.Close: %v, want ErrClosed", err)
	}
}

// PostSendContext on a QP in ERR posts every WR, however many: each
// batch of max_send_wr is flushed before the next goes (it returned
// ErrQueueFull with its context still live).
func TestPostSendContextInErr(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{sqDepth: 2})
	_, mr := a.buffer(t, 64, 0)
	if err := a.qp.Modify(&QPAttr{State: QPSErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	wrs := make([]SendWR, 5)
	for i := range wrs {
		wrs[i] = SendWR{WRID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGEs: sge(mr, 0, 64)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.qp.PostSendContext(ctx, wrs...); err != nil {
		t.Fatalf("PostSendContext of 5 WRs in ERR, max_send_wr 2: %v", err)
	}
	for i, wc := range waitWC(t, a.scq, len(wrs), 5*time.Second) {
		if wc.WRID != uint64(i) || wc.Status != WCWRFlushErr {
			t.Fatalf("completion %d: %+v, want WR %d flushed", i, wc, i)
		}
	}
}
