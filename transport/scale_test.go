package transport

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// deadQPs creates n RC QPs on one device under a ManualClock, connected
// towards an address nobody listens on: every request they send is lost,
// so every WR ends in local ACK timeouts. It returns the device, the QPs,
// their shared CQ and a registered buffer.
func deadQPs(t *testing.T, n int, retry func(i int) Retry) (*Device, *ManualClock, []*QP, *CQ, *memreg.MR) {
	t.Helper()
	clk := NewManualClock(tqEpoch)
	net := memnet.NewMemNetwork(memnet.Faults{})
	l, err := net.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := NewDevice(l, DeviceConfig{Clock: clk, MaxQP: n + 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, _ := dev.AllocPD()
	cq, err := dev.CreateCQ(2*n + 16)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	qps := make([]*QP, n)
	for i := range qps {
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		r := retry(i)
		if err := qp.Connect(ConnParams{Peer: addrB, DestQPN: 0x100 + uint32(i), PathMTU: MTU1024, Retry: &r}); err != nil {
			t.Fatal(err)
		}
		qps[i] = qp
	}
	return dev, clk, qps, cq, mr
}

// TestTimersManyQPs: 10,000 RC QPs (2,000 under -race) on one device,
// each with one WRITE into the void, mixed ACK timeouts (4 ms .. 268 ms),
// retry_cnt 0..2 and three posting times. Under a ManualClock advanced in
// uneven steps, every QP's WR fails with WCRetryExcErr exactly when its
// last timeout expires — never in an earlier Advance, always in the one
// that reaches it — every timeout is counted once, and the device holds
// one clock timer, not one per QP.
func TestTimersManyQPs(t *testing.T) {
	n := 10000
	if raceEnabled {
		n = 2000
	}
	rng := rand.New(rand.NewPCG(3, 4))
	timeouts := make([]uint8, n)
	retries := make([]uint8, n)
	for i := range timeouts {
		timeouts[i] = uint8(10 + rng.IntN(7))
		retries[i] = uint8(rng.IntN(3))
	}
	dev, clk, qps, cq, mr := deadQPs(t, n, func(i int) Retry {
		return Retry{Timeout: timeouts[i], RetryCnt: retries[i], RNRRetry: 7, MinRNRTimer: 12}
	})
	byQPN := make(map[uint32]int, n)
	due := make([]time.Time, n) // when the WR must fail
	timeoutsWant := 0
	post := func(i int) {
		if err := qps[i].PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled,
			SGEs: sge(mr, 0, 64), RemoteAddr: 0x1000, RKey: 0x1234}); err != nil {
			t.Fatal(err)
		}
		byQPN[qps[i].QPN()] = i
		// Sent at once, timed out retry_cnt+1 times, each a full timeout
		// after the resend the previous one triggered.
		due[i] = clk.Now().Add(time.Duration(int(retries[i])+1) * AckTimeout(timeouts[i]))
		timeoutsWant += int(retries[i]) + 1
	}
	done := make([]bool, n)
	wcs := make([]WC, 256)
	finished := 0
	// advance moves the clock by d and checks the completions it brought.
	advance := func(d time.Duration) {
		t.Helper()
		before := clk.Now()
		clk.Advance(d)
		now := clk.Now()
		for {
			m := cq.Poll(wcs)
			if m == 0 {
				break
			}
			for _, wc := range wcs[:m] {
				i, ok := byQPN[wc.QPN]
				if !ok || wc.WRID != uint64(i) || wc.Status != WCRetryExcErr {
					t.Fatalf("completion %+v", wc)
				}
				if done[i] {
					t.Fatalf("qp %d completed twice", i)
				}
				done[i] = true
				finished++
				if due[i].After(now) || !due[i].After(before) {
					t.Fatalf("qp %d (timeout %d, retry %d) failed in the Advance (%v, %v], its last timeout is at %v",
						i, timeouts[i], retries[i], before.Sub(tqEpoch), now.Sub(tqEpoch), due[i].Sub(tqEpoch))
				}
			}
		}
		for i := range due {
			if !done[i] && !due[i].IsZero() && !due[i].After(now) {
				t.Fatalf("qp %d due at %v has not failed at %v", i, due[i].Sub(tqEpoch), now.Sub(tqEpoch))
			}
		}
	}
	// Three posting times: a third now, a third 1.5 ms later, a third 40 ms later.
	for i := 0; i < n; i += 3 {
		post(i)
	}
	advance(1500 * time.Microsecond)
	for i := 1; i < n; i += 3 {
		post(i)
	}
	advance(38500 * time.Microsecond)
	for i := 2; i < n; i += 3 {
		post(i)
	}
	if got := clk.Pending(); got != 1 {
		t.Fatalf("%d clock timers pending with %d QPs waiting, want 1", got, n)
	}
	steps := []time.Duration{time.Millisecond, 3 * time.Millisecond, 7*time.Millisecond + 777*time.Microsecond, 20 * time.Millisecond}
	for k := 0; finished < n; k++ {
		if k > 10000 {
			t.Fatalf("%d of %d WRs finished", finished, n)
		}
		advance(steps[k%len(steps)])
	}
	c := dev.Counters()
	if c.LocalAckTimeout != uint64(timeoutsWant) || c.RetryExceededErr != uint64(n) {
		t.Fatalf("local_ack_timeout %d (want %d), retry_exceeded %d (want %d)", c.LocalAckTimeout, timeoutsWant, c.RetryExceededErr, n)
	}
	if p := dev.tq.pending(); p != 0 {
		t.Fatalf("%d timers still queued", p)
	}
}

// TestTimersCancelled: Destroy, a move to ERR (Modify) and a move to RESET
// cancel a QP's timers, and Close cancels every one: no timeout is counted
// for those QPs and the device's queue is empty.
func TestTimersCancelled(t *testing.T) {
	const n = 400
	dev, clk, qps, cq, mr := deadQPs(t, n, func(int) Retry {
		return Retry{Timeout: 12, RetryCnt: 0, RNRRetry: 7, MinRNRTimer: 12}
	})
	for i, qp := range qps {
		if err := qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled,
			SGEs: sge(mr, 0, 64), RemoteAddr: 0x1000, RKey: 0x1234}); err != nil {
			t.Fatal(err)
		}
	}
	if p := dev.tq.pending(); p != n {
		t.Fatalf("%d timers queued, want %d", p, n)
	}
	live := 0
	for i, qp := range qps {
		var err error
		switch i % 4 {
		case 0:
			err = qp.Destroy()
		case 1:
			err = qp.Modify(&QPAttr{State: QPSErr}, AttrState)
		case 2:
			err = qp.Modify(&QPAttr{State: QPSReset}, AttrState)
		default:
			live++
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if p := dev.tq.pending(); p != live {
		t.Fatalf("%d timers queued after destroy/ERR/RESET, want %d", p, live)
	}
	// Half the flushed WRs completed (Destroy and ERR flush; RESET drops).
	clk.Advance(time.Duration(float64(AckTimeout(12)) * 0.99))
	if c := dev.Counters(); c.LocalAckTimeout != 0 {
		t.Fatalf("%d timeouts before the deadline", c.LocalAckTimeout)
	}
	clk.Advance(AckTimeout(12))
	if c := dev.Counters(); c.LocalAckTimeout != uint64(live) {
		t.Fatalf("%d timeouts, want %d (the live QPs)", c.LocalAckTimeout, live)
	}
	wcs := make([]WC, 2*n)
	if got, want := cq.Poll(wcs), n/2+live; got != want {
		t.Fatalf("%d completions, want %d", got, want)
	}
	// Close with timers pending: they are cancelled.
	for i, qp := range qps {
		if i%4 == 2 {
			if err := qp.Connect(ConnParams{Peer: addrB, DestQPN: 0x200 + uint32(i), PathMTU: MTU1024, Retry: &Retry{Timeout: 12, RNRRetry: 7}}); err != nil {
				t.Fatal(err)
			}
			if err := qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, SGEs: sge(mr, 0, 64), RemoteAddr: 0x1000, RKey: 0x1234}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if p := dev.tq.pending(); p != n/4 {
		t.Fatalf("%d timers queued, want %d", p, n/4)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if p, c := dev.tq.pending(), clk.Pending(); p != 0 || c != 0 {
		t.Fatalf("after Close: %d timers queued, %d clock timers", p, c)
	}
	clk.Advance(time.Hour)
	if c := dev.Counters(); c.LocalAckTimeout != uint64(live) {
		t.Fatalf("%d timeouts after Close, want %d", c.LocalAckTimeout, live)
	}
}

// qpDropLink is a Link that loses the packets drop picks on Send (while
// drop is set; under mu).
type qpDropLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	mu       sync.Mutex
	drop     func(buf []byte) bool
	kept     []udp.Packet
}

func (l *qpDropLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drop == nil {
		return l.Link.Send(pkts)
	}
	l.kept = l.kept[:0]
	for _, p := range pkts {
		if !l.drop(p.Buf) {
			l.kept = append(l.kept, p)
		}
	}
	if len(l.kept) == 0 {
		return nil
	}
	return l.Link.Send(l.kept)
}

func (l *qpDropLink) setDrop(f func([]byte) bool) {
	l.mu.Lock()
	l.drop = f
	l.mu.Unlock()
}

// bthDestQP is the destination QPN of a packet (BTH bytes 5..7).
func bthDestQP(b []byte) uint32 {
	if len(b) < 12 {
		return 0
	}
	return uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
}

// TestIsolation: one QP of many is stalled — its peer has no receive WRs
// (RNR NAKs, a 491 ms back-off each) or every packet it sends is lost —
// and the others complete all their work while the ManualClock stands
// still, so nothing of theirs waited for the stalled QP's back-off or
// timeout. Then the stall is lifted and the clock advanced past one
// back-off/timeout: the stalled QP completes too, with exactly the RNR
// NAKs or timeouts it alone caused counted.
func TestIsolation(t *testing.T) {
	const n, m = 200, 8 // QP pairs, SENDs per QP
	for _, mode := range []string{"rnr", "loss"} {
		t.Run(mode, func(t *testing.T) {
			clk := NewManualClock(tqEpoch)
			net := memnet.NewMemNetwork(memnet.Faults{})
			ml, err := net.Link(addrA)
			if err != nil {
				t.Fatal(err)
			}
			la := &qpDropLink{Wrap: udp.Wrap{Link: ml}}
			lb, err := net.Link(addrB)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DeviceConfig{Clock: clk, MaxQP: n + 16}
			da, err := NewDevice(la, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer da.Close()
			db, err := NewDevice(lb, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			pa, _ := da.AllocPD()
			pb, _ := db.AllocPD()
			scq, _ := da.CreateCQ(n*m + 16)
			acq, _ := da.CreateCQ(16)
			rcq, _ := db.CreateCQ(n*m + 16)
			bcq, _ := db.CreateCQ(16)
			smr, err := pa.RegisterMR(make([]byte, 4096), memreg.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			rmr, err := pb.RegisterMR(make([]byte, 4096), memreg.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			// RNR timer code 31: 491.52 ms; ACK timeout 17: 537 ms.
			retry := Retry{Timeout: 17, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 31}
			qa, qb := make([]*QP, n), make([]*QP, n)
			for i := range n {
				if qa[i], err = da.CreateQP(pa, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: acq, MaxSendWR: m, MaxRecvWR: 1}); err != nil {
					t.Fatal(err)
				}
				if qb[i], err = db.CreateQP(pb, QPInitAttr{Type: QPTypeRC, SendCQ: bcq, RecvCQ: rcq, MaxSendWR: 1, MaxRecvWR: m}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n {
				if err := qa[i].Connect(ConnParams{Peer: addrB, DestQPN: qb[i].QPN(), PathMTU: MTU1024, Retry: &retry}); err != nil {
					t.Fatal(err)
				}
				if err := qb[i].Connect(ConnParams{Peer: addrA, DestQPN: qa[i].QPN(), PathMTU: MTU1024, Retry: &retry}); err != nil {
					t.Fatal(err)
				}
			}
			const stalled = n / 2
			recv := func(i int) {
				for range m {
					if err := qb[i].PostRecv(RecvWR{WRID: uint64(i), SGEs: sge(rmr, 0, 4096)}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for i := range n {
				if i != stalled || mode != "rnr" {
					recv(i)
				}
			}
			if mode == "loss" {
				dst := qb[stalled].QPN()
				la.setDrop(func(b []byte) bool { return bthDestQP(b) == dst })
			}
			// Every QP sends m 2 KiB SENDs (two packets each).
			for k := range m {
				for i := range n {
					if err := qa[i].PostSend(SendWR{WRID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 2048)}); err != nil {
						t.Fatalf("qp %d send %d: %v", i, k, err)
					}
				}
			}
			// The others finish without the clock moving.
			want := (n - 1) * m
			for _, wc := range waitWC(t, scq, want, 60*time.Second) {
				if wc.Status != WCSuccess || wc.WRID == stalled {
					t.Fatalf("completion %+v (qp %d is stalled)", wc, stalled)
				}
			}
			if !clk.Now().Equal(tqEpoch) {
				t.Fatal("the clock moved")
			}
			for _, wc := range waitWC(t, rcq, want, 60*time.Second) {
				if wc.Status != WCSuccess || wc.WRID == stalled || wc.ByteLen != 2048 {
					t.Fatalf("receive completion %+v", wc)
				}
			}
			if k := scq.Poll(make([]WC, 4)); k != 0 {
				t.Fatalf("%d completions of the stalled QP", k)
			}
			ca := da.Counters()
			switch mode {
			case "rnr":
				if ca.RcvdRNRErr == 0 {
					t.Fatal("no RNR NAK received: the stalled QP did not stall")
				}
				recv(stalled)
				clk.Advance(aeth.RNRTimeout(31))
			case "loss":
				if ca.LocalAckTimeout != 0 {
					t.Fatalf("%d ACK timeouts before the clock moved", ca.LocalAckTimeout)
				}
				la.setDrop(nil)
				clk.Advance(AckTimeout(17))
			}
			for _, wc := range waitWC(t, scq, m, 60*time.Second) {
				if wc.Status != WCSuccess || wc.WRID != stalled {
					t.Fatalf("completion %+v, want the stalled qp %d's", wc, stalled)
				}
			}
			ca = da.Counters()
			switch mode {
			case "rnr":
				// One RNR NAK: the back-off ran once, then everything went.
				if ca.RcvdRNRErr != 1 || ca.LocalAckTimeout != 0 {
					t.Fatalf("rnr_nak %d (want 1), local_ack_timeout %d (want 0)", ca.RcvdRNRErr, ca.LocalAckTimeout)
				}
			case "loss":
				if ca.LocalAckTimeout != 1 || ca.RcvdRNRErr != 0 {
					t.Fatalf("local_ack_timeout %d (want 1), rnr_nak %d (want 0)", ca.LocalAckTimeout, ca.RcvdRNRErr)
				}
			}
		})
	}
}

// gateLink holds Recv until open is closed, and records the destination
// QPNs of the packets of every Send call.
type gateLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	open     chan struct{}
	mu       sync.Mutex
	sends    [][]uint32
}

func (l *gateLink) Recv(pkts []udp.Packet) (int, error) {
	<-l.open
	return l.Link.Recv(pkts)
}

// TryRecv finds nothing until open is closed (the poll path keeps the gate
// as Recv does).
func (l *gateLink) TryRecv(pkts []udp.Packet) (int, error) {
	select {
	case <-l.open:
		return l.Wrap.TryRecv(pkts)
	default:
		return 0, nil
	}
}

func (l *gateLink) Send(pkts []udp.Packet) error {
	qpns := make([]uint32, len(pkts))
	for i, p := range pkts {
		qpns[i] = bthDestQP(p.Buf)
	}
	l.mu.Lock()
	l.sends = append(l.sends, qpns)
	l.mu.Unlock()
	return l.Link.Send(pkts)
}

// TestResponsesCoalesced: one received batch holding a WRITE for each of
// 32 QPs makes the responder send the 32 ACKs in one Link.Send, not one
// per QP.
func TestResponsesCoalesced(t *testing.T) {
	const n = 32
	net := memnet.NewMemNetwork(memnet.Faults{})
	la, err := net.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	ml, err := net.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	if ml.BatchSize() < n {
		t.Fatalf("the in-memory link receives %d packets per call, the test needs %d", ml.BatchSize(), n)
	}
	lb := &gateLink{Wrap: udp.Wrap{Link: ml}, open: make(chan struct{})}
	da, err := NewDevice(la, DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := NewDevice(lb, DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pa, _ := da.AllocPD()
	pb, _ := db.AllocPD()
	acq, _ := da.CreateCQ(4 * n)
	bcq, _ := db.CreateCQ(4)
	smr, _ := pa.RegisterMR(make([]byte, 64), memreg.AccessLocalWrite)
	dmr, _ := pb.RegisterMR(make([]byte, 64), memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	qa := make([]*QP, n)
	for i := range qa {
		if qa[i], err = da.CreateQP(pa, QPInitAttr{Type: QPTypeRC, SendCQ: acq, RecvCQ: acq, MaxSendWR: 1, MaxRecvWR: 1}); err != nil {
			t.Fatal(err)
		}
		qb, err := db.CreateQP(pb, QPInitAttr{Type: QPTypeRC, SendCQ: bcq, RecvCQ: bcq, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := qa[i].Connect(ConnParams{Peer: addrB, DestQPN: qb.QPN()}); err != nil {
			t.Fatal(err)
		}
		if err := qb.Connect(ConnParams{Peer: addrA, DestQPN: qa[i].QPN(), Access: memreg.AccessRemoteWrite}); err != nil {
			t.Fatal(err)
		}
	}
	for _, qp := range qa {
		if err := qp.PostSend(SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	// The WRITEs wait in B's receive queue; B takes them in one Recv.
	close(lb.open)
	waitWC(t, acq, n, 30*time.Second)
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if len(lb.sends) != 1 || len(lb.sends[0]) != n {
		t.Fatalf("B sent its ACKs in %d Link.Send calls (%v), want 1 of %d", len(lb.sends), lb.sends, n)
	}
	seen := map[uint32]bool{}
	for _, q := range lb.sends[0] {
		seen[q] = true
	}
	if len(seen) != n {
		t.Fatalf("the ACKs went to %d QPs, want %d", len(seen), n)
	}
}
