package transport

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// TestSchedSlowPeerNoStarve: a peer that acknowledges slowly holds only
// its own QPs back, not the device's send scheduler (hostile report 25,
// item 1). 80 QPs keep two 1 KiB WRITEs each outstanding to a healthy
// peer, every request going through the scheduler; then the device also
// opens four QPs to a slow peer (a bare link that answers with ACKs of its
// own making) and posts 1,000 64-byte WRITEs on each, whose small-packet
// window (512 PSNs) alone is twice the device's inflight budget (256).
// Four, so that capping each QP's count at a quarter of the budget does
// not suffice by itself: their PSNs must stop counting once stale.
//
//   - trickle: the peer acknowledges one more PSN per QP every 40 ms,
//     within the 67 ms ACK timeout, so no retry is ever spent and the QPs
//     stay in RTS as long as the peer wants;
//   - silent: the peer never acknowledges, and the QPs' ACK timeout is
//     1 s, so no timer of theirs fires during the test (only the
//     scheduler's own look at the QPs holding its budget finds them).
//
// When every unacknowledged PSN counted against the budget, the healthy
// QPs were served one turn per forced turn (5 ms) and fell to a few
// percent of their rate. Now the slow QPs' PSNs stop counting once they
// have been unacknowledged for a quarter of their ACK timeout (at most
// 20 ms), no QP counts for more than a quarter of the budget, and the
// healthy QPs must keep at least a fifth of their rate (without the fix: 0.2 %); the slow QPs stay in
// RTS with no more WRITEs completed than the peer acknowledged, and the
// counters show what happened.
func TestSchedSlowPeerNoStarve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout uint8 // of the slow QPs
		trickle bool
	}{
		{"trickle", 14, true},
		{"silent", 18, false},
	} {
		t.Run(tc.name, func(t *testing.T) { testSchedSlowPeer(t, tc.timeout, tc.trickle) })
	}
}

func testSchedSlowPeer(t *testing.T, timeout uint8, trickle bool) {
	const n, nSlow, depth = 80, 4, 2
	phase := 400 * time.Millisecond
	if raceEnabled {
		phase = time.Second
	}
	r := newSchedRig(t, n, DeviceConfig{SchedQPs: 16}, 0, 14)
	for i := range n {
		for range depth {
			r.post(t, i)
		}
	}
	// measure returns the healthy QPs' WRITEs per second over a phase,
	// reposting every completed WRITE (also past the phase's end: each
	// QP keeps depth outstanding from one phase to the next).
	wcs := make([]WC, 256)
	measure := func() float64 {
		start := time.Now()
		got := 0
		for time.Since(start) < phase {
			k := r.cq.Poll(wcs)
			if k == 0 {
				time.Sleep(200 * time.Microsecond)
				continue
			}
			for _, wc := range wcs[:k] {
				if wc.Status != WCSuccess {
					t.Fatalf("WRITE on QP %d: %v", wc.WRID, wc.Status)
				}
				got++
				r.post(t, int(wc.WRID))
			}
		}
		return float64(got) / time.Since(start).Seconds()
	}
	measure() // warm-up
	base := measure()
	if !r.a.sched.started.Load() {
		t.Fatal("the scheduler never ran: the test shows nothing")
	}

	// The slow peer: a bare link on the same network.
	addrC := netip.MustParseAddr("192.0.2.3")
	lc, err := r.net.Link(addrC)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		lc.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() { // take what the device sends, answer nothing
		defer wg.Done()
		bufs := make([]udp.Packet, 16)
		for i := range bufs {
			bufs[i].Buf = make([]byte, udp.MaxPacketSize)
		}
		for {
			for i := range bufs {
				bufs[i].Buf = bufs[i].Buf[:cap(bufs[i].Buf)]
			}
			if _, err := lc.Recv(bufs); err != nil {
				return
			}
		}
	}()
	const sqpsn = 100
	pda := r.qa[0].PD()
	scq, err := r.a.CreateCQ(4096)
	if err != nil {
		t.Fatal(err)
	}
	src, err := pda.RegisterMR(make([]byte, 64), memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	slow := make([]*QP, nSlow)
	for k := range slow {
		qp, err := r.a.CreateQP(pda, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: scq, MaxSendWR: 1024, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		retry := Retry{Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}
		if err := qp.Connect(ConnParams{Peer: addrC, DestQPN: 0x100 + uint32(k), SQPSN: sqpsn, PathMTU: MTU1024, Retry: &retry}); err != nil {
			t.Fatal(err)
		}
		for i := range 1000 {
			if err := qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(src, 0, 64),
				RemoteAddr: 0x1000, RKey: 1}); err != nil {
				t.Fatal(err)
			}
		}
		slow[k] = qp
	}
	var acks sync.Mutex
	acked := 0 // PSNs each slow QP had acknowledged
	if trickle {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(40 * time.Millisecond)
			defer tick.Stop()
			buf := make([]byte, udp.MaxPacketSize)
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				acks.Lock()
				acked++
				psn := bth.PSN(sqpsn + acked - 1)
				acks.Unlock()
				for _, qp := range slow {
					var f packet.Fields
					f.BTH.Opcode = bth.RCAck
					f.BTH.DestQP = qp.QPN()
					f.BTH.PSN = psn
					f.BTH.PKey = bth.DefaultPKey
					f.AETH.Syndrome = 0x1f // ACK, no credit count
					k, err := packet.Build(buf, &f)
					if err != nil {
						panic(err)
					}
					if lc.Send([]udp.Packet{{Buf: buf[:k], Addr: addrA, SrcPort: 49152}}) != nil {
						return
					}
				}
			}
		}()
	}
	measure() // the slow QPs take the budget (and lose it)
	held := measure()
	// A loaded machine can starve a phase of its own (0.07-0.34 of the
	// base seen in 1 of 8 runs beside other tests, before and after the
	// stale rule of session 31); the starvation this test is about holds
	// in every phase (0.2 %), so two more phases may show the rate.
	for try := 0; held < base/5 && try < 2; try++ {
		t.Logf("healthy WRITEs/s %.0f of %.0f in a phase: measuring again", held, base)
		held = max(held, measure())
	}
	c := r.a.Counters()
	slowDone := scq.Poll(make([]WC, 4096))
	acks.Lock()
	a := acked
	acks.Unlock()
	t.Logf("healthy WRITEs/s: %.0f alone, %.0f beside %d slow QPs (%.2f); slow WRITEs completed %d (%d PSNs acknowledged per QP); sched_stale_qps %d, sched_forced_turns %d, sched_full_ns %d",
		base, held, nSlow, held/base, slowDone, a, c.SchedStaleQPs, c.SchedForcedTurns, c.SchedFullNs)
	for k, qp := range slow {
		if st := qp.State(); st != QPSRTS {
			t.Fatalf("slow QP %d in %v, want RTS (it is held, not failed): %v", k, st, qp.Err())
		}
	}
	if slowDone > nSlow*a {
		t.Fatalf("%d slow WRITEs completed, the peer acknowledged %d", slowDone, nSlow*a)
	}
	// Without the fix they fell to 0.2 % of it; a fifth leaves room for a
	// loaded machine's timing (0.64-1.65 measured on an idle one).
	if held < base/5 {
		t.Fatalf("the healthy QPs fell from %.0f to %.0f WRITEs/s beside %d slow QPs: the slow ones starve them", base, held, nSlow)
	}
	if c.SchedStaleQPs == 0 {
		t.Fatalf("sched_stale_qps 0: the slow QPs' PSNs were never found stale")
	}
}
