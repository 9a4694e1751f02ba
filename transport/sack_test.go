package transport

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// lossRates collects the MiB/s of each loss-matrix case run in this
// process, by name and mode, for the side-by-side report.
var lossRates = struct {
	sync.Mutex
	m map[string]float64
}{m: map[string]float64{}}

func lossRate(t testing.TB, c lossCase, sr bool, mibs float64) {
	mode := "gbn"
	if sr {
		mode = "sr"
	}
	lossRates.Lock()
	lossRates.m[mode+"/"+c.name] = mibs
	lossRates.Unlock()
}

// TestLossMatrixSR is TestLossMatrix with selective repeat on both QPs:
// the same cases and seeds, every byte and completion checked, the
// atomics exactly once, no deadlock (the time bound).
func TestLossMatrixSR(t *testing.T) {
	total := lossBytes()
	for i, c := range lossCases {
		t.Run(c.name, func(t *testing.T) {
			c.f.Seed = int64(1000 + i)
			runLossCaseMode(t, c, true, total, 60*time.Second, 14)
		})
	}
}

// TestLossMatrixSRSmallWindow runs loss cases with a responder window
// (16) far smaller than what the requester puts in flight (128): most of
// a flight after a loss lands beyond the window and is dropped
// (sr_out_of_window), and the selective NAKs those drops no longer draw
// one by one (TestSRNoReflection) must not stall the recovery — every
// byte and completion checked, no retry exhausted, in the time bound.
func TestLossMatrixSRSmallWindow(t *testing.T) {
	total := max(lossBytes()/4, 8<<20) // 8 MiB: enough packets for the loss checks
	for i, c := range lossCases {
		if c.f.Loss == 0 || c.f.Loss > 0.05 {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			c.f.Seed = int64(5000 + i)
			runLossCaseSR(t, c, true, SRConfig{Window: 16, MaxInflight: 128}, total, 60*time.Second, 14)
		})
	}
}

// TestSRCompare is the side-by-side benchmark: every loss-matrix case run
// with go-back-N and then with selective repeat, with the same seed, each
// byte-checked, and a table of MiB/s and the ratios to the clean case.
// It runs only with ROCEV2_SR_COMPARE=1 (ROCEV2_LOSS_MIB sets the size,
// default 64 MiB per case); with ROCEV2_SR_GOALS=1 it also checks the
// goals (selective repeat at >= 0.9 of clean at 0.1 % loss, >= 0.8 at
// 1 %, >= 0.5 at 5 %), which need an unloaded machine.
func TestSRCompare(t *testing.T) {
	if os.Getenv("ROCEV2_SR_COMPARE") == "" {
		t.Skip("ROCEV2_SR_COMPARE=1 runs the go-back-N / selective repeat comparison")
	}
	total := int64(64 << 20)
	if s := os.Getenv("ROCEV2_LOSS_MIB"); s != "" {
		total = lossBytes()
	}
	for i, c := range lossCases {
		c.f.Seed = int64(3000 + i)
		for _, sr := range []bool{false, true} {
			name := "gbn/" + c.name
			if sr {
				name = "sr/" + c.name
			}
			t.Run(name, func(t *testing.T) {
				runLossCaseMode(t, c, sr, total, 10*time.Minute, 14)
			})
		}
	}
	lossRates.Lock()
	defer lossRates.Unlock()
	m := lossRates.m
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-16s %10s %10s %8s %8s %8s\n", "case", "GBN MiB/s", "SR MiB/s", "GBN/cl", "SR/cl", "SR/GBN")
	gc, sc := m["gbn/clean"], m["sr/clean"]
	for _, c := range lossCases {
		g, s := m["gbn/"+c.name], m["sr/"+c.name]
		fmt.Fprintf(&b, "%-16s %10.0f %10.0f %8.2f %8.2f %8.2f\n", c.name, g, s, g/gc, s/sc, s/g)
	}
	t.Log(b.String())
	if os.Getenv("ROCEV2_SR_GOALS") != "" {
		for _, g := range []struct {
			name string
			min  float64
		}{{"loss0.1%", 0.9}, {"loss1%", 0.8}, {"loss5%", 0.5}} {
			if r := m["sr/"+g.name] / sc; r < g.min {
				t.Errorf("selective repeat at %s: %.2f of clean, goal %.2f", g.name, r, g.min)
			}
		}
	}
}

// TestSRResendsOnlyHole is TestPSNSeqNAKGoBackN with selective repeat: one
// request packet of a 4-packet WRITE is dropped once; the responder holds
// the rest and names the hole in a selective NAK, the requester resends
// that one packet only, and every WR completes once, in order.
func TestSRResendsOnlyHole(t *testing.T) {
	const first = bth.PSN(0xfffffd)
	dropped := false
	a, b, la, lb := linkPair(t, pairOpts{mtu: MTU256, clock: manual(), retry: 3, sr: true}, uint32(first), 0x40)
	la.drop = func(p *packet.Packet) bool {
		if !dropped && p.BTH.PSN() == first.Add(1) {
			dropped = true
			return true
		}
		return false
	}
	var sacks [][]byte
	lb.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() == bth.RCAck && len(p.Payload) > 0 {
			sacks = append(sacks, append([]byte(nil), p.Payload...))
		}
		return false
	}
	src, smr := a.buffer(t, 4*256+3*100, 0)
	fill(src, 11)
	dst, dmr := b.buffer(t, len(src), memreg.AccessRemoteWrite)
	wrs := []SendWR{{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 4*256), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}}
	for i := range 3 {
		off := 4*256 + i*100
		wrs = append(wrs, SendWR{WRID: uint64(2 + i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, off, 100), RemoteAddr: dmr.IOVA() + uint64(off), RKey: dmr.RKey()})
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 4, 5*time.Second)
	for i, wc := range wcs {
		if wc.WRID != uint64(i+1) || wc.Status != WCSuccess || wc.Opcode != WCRDMAWrite {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	noWC(t, a.scq)
	var psns []bth.PSN
	for _, w := range la.sent() {
		psns = append(psns, w.psn)
	}
	want := []bth.PSN{}
	for i := range 7 {
		want = append(want, first.Add(i))
	}
	want = append(want, first.Add(1)) // the hole, once
	if fmt.Sprint(psns) != fmt.Sprint(want) {
		t.Fatalf("requester sent PSNs\n%v\nwant\n%v", psns, want)
	}
	if len(sacks) == 0 {
		t.Fatal("the responder sent no selective NAK")
	}
	// The first selective NAK names first+1 missing and first+2 held.
	var naks []wirePkt
	for _, w := range lb.sent() {
		if w.isNAK() {
			naks = append(naks, w)
		}
	}
	if len(naks) == 0 || naks[0].psn != first.Add(1) || naks[0].syn != aeth.NAK(aeth.NAKPSNSeqError) {
		t.Fatalf("selective NAKs %+v, want the first for %v", naks, first.Add(1))
	}
	if sk := aeth.SACK(sacks[0]); !aeth.IsSACK(sacks[0]) || !sk.Has(0) || sk.Has(5) {
		t.Fatalf("first SACK block % x: want bit 0 (PSN first+2) set", sacks[0])
	}
	ca, cb := a.dev.Counters(), b.dev.Counters()
	if ca.RetransmittedPkts != 1 || ca.LocalAckTimeout != 0 || ca.SRSACKRcvd == 0 || cb.SRHeld != 5 {
		t.Fatalf("requester retransmitted_pkts %d local_ack_timeout_err %d sr_sack_rcvd %d; responder sr_held %d; want 1 0 >0 5",
			ca.RetransmittedPkts, ca.LocalAckTimeout, ca.SRSACKRcvd, cb.SRHeld)
	}
	if a.qp.State() != QPSRTS || b.qp.State() != QPSRTS {
		t.Fatalf("states %v %v", a.qp.State(), b.qp.State())
	}
}

// TestSRReadHole drops one response packet of a 4-packet READ: the
// requester places the others as they come and asks again for the
// missing 256 bytes only (a READ request at the hole's PSN for one MTU),
// which the responder answers from its saved resources.
func TestSRReadHole(t *testing.T) {
	const first = bth.PSN(0x10)
	dropped := false
	a, b, la, lb := linkPair(t, pairOpts{mtu: MTU256, clock: manual(), retry: 3, sr: true}, uint32(first), 0x40)
	lb.drop = func(p *packet.Packet) bool {
		if !dropped && p.BTH.Opcode() == bth.RCReadResponseMiddle && p.BTH.PSN() == first.Add(1) {
			dropped = true
			return true
		}
		return false
	}
	type rd struct {
		psn bth.PSN
		n   uint32
	}
	var reads []rd
	la.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() == bth.RCReadRequest {
			reads = append(reads, rd{p.BTH.PSN(), p.RETH.DMALength()})
		}
		return false
	}
	src, smr := b.buffer(t, 4*256, memreg.AccessRemoteRead)
	fill(src, 12)
	dst, dmr := a.buffer(t, len(src), 0)
	if err := a.qp.PostSend(SendWR{WRID: 7, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, len(dst)), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 1, 5*time.Second)
	if wcs[0].WRID != 7 || wcs[0].Status != WCSuccess || wcs[0].ByteLen != 1024 {
		t.Fatalf("completion %+v", wcs[0])
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	noWC(t, a.scq)
	if fmt.Sprint(reads) != fmt.Sprint([]rd{{first, 1024}, {first.Add(1), 256}}) {
		t.Fatalf("READ requests %v, want the READ and one for the hole (psn %v, 256 bytes)", reads, first.Add(1))
	}
	if ca := a.dev.Counters(); ca.LocalAckTimeout != 0 || ca.RetransmittedPkts != 1 {
		t.Fatalf("local_ack_timeout_err %d retransmitted_pkts %d, want 0 and 1", ca.LocalAckTimeout, ca.RetransmittedPkts)
	}
}

// TestSRLongReadHoles: a READ longer than the requester's ring (3000
// responses at MTU 256; the ring is 1024 PSNs) with one response lost
// inside the ring and one beyond it. The responses that arrive beyond the
// ring are kept (srState.far), so each hole costs one 256-byte READ and
// nothing else is asked for again: before, every later response asked
// again for all of them, and the READ went over the wire hundreds of times.
func TestSRLongReadHoles(t *testing.T) {
	const first = bth.PSN(0x10)
	t.Run("2 holes", func(t *testing.T) { srLongReadHoles(t, first, 3000, []int{5, 1500}, 0) })
	// More holes past the ring than the 8 runs of far responses the
	// requester first kept: every response after the ninth was taken for
	// lost again (a 16 MiB READ at 0.1 % loss cost 1.6x its packets).
	var many []int
	for k := 1500; k <= 7000; k += 500 {
		many = append(many, k)
	}
	t.Run("12 holes past the ring", func(t *testing.T) { srLongReadHoles(t, first, 8000, many, 0) })
	// The requester's receiver not scheduled while the responder sends
	// (a loaded machine): the responses wait for it, none is lost.
	t.Run("12 holes, requester stalled", func(t *testing.T) { srLongReadHoles(t, first, 8000, many, 50*time.Millisecond) })
}

// srLongReadHoles reads n responses at MTU 256, losing the first response
// at each offset in holes. stall holds the requester's QP for that long
// once the first response was sent.
func srLongReadHoles(t *testing.T, first bth.PSN, n int, holes []int, stall time.Duration) {
	lose := map[bth.PSN]bool{}
	for _, k := range holes {
		lose[first.Add(k)] = true
	}
	a, b, la, lb := linkPair(t, pairOpts{mtu: MTU256, clock: manual(), retry: 3, sr: true}, uint32(first), 0x40)
	// The responder sends the n responses as fast as it makes them. The
	// requester's MemLink queues 4096 packets (a NIC ring) and drops what
	// comes on top (DropOther) while the requester's receiver is behind,
	// as on a loaded machine: losses the test does not plan. The
	// requester recovers them, rightly, with more READ requests than the
	// test expects (a lost run), or, for a lost tail, only at a timeout,
	// which the manual clock never fires (waitWC times out). So the link
	// is lossless, as PFC makes RoCE's: every 256 responses, the
	// responder waits until the requester's queue is empty.
	drained := drainedFn(la)
	responses := 0
	lb.drop = func(p *packet.Packet) bool {
		if p.Info.Kind != bth.KindReadResponse {
			return false
		}
		if responses == 0 && stall > 0 {
			go func() {
				a.qp.mu.Lock()
				time.Sleep(stall)
				a.qp.mu.Unlock()
			}()
		}
		if responses%256 == 0 {
			drained()
		}
		responses++
		if lose[p.BTH.PSN()] {
			delete(lose, p.BTH.PSN())
			return true
		}
		return false
	}
	type rd struct {
		psn bth.PSN
		n   uint32
	}
	var reads []rd
	la.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() == bth.RCReadRequest {
			reads = append(reads, rd{p.BTH.PSN(), p.RETH.DMALength()})
		}
		return false
	}
	src, smr := b.buffer(t, n*256, memreg.AccessRemoteRead)
	fill(src, 13)
	dst, dmr := a.buffer(t, len(src), 0)
	if err := a.qp.PostSend(SendWR{WRID: 9, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, len(dst)), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 1, 10*time.Second)
	if wcs[0].WRID != 9 || wcs[0].Status != WCSuccess || wcs[0].ByteLen != uint32(n)*256 {
		t.Fatalf("completion %+v", wcs[0])
	}
	if d := la.Link.Stats().DropOther; d != 0 {
		t.Fatalf("the requester's link dropped %d packets (queue full)", d)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	want := []rd{{first, uint32(n) * 256}}
	for _, k := range holes {
		want = append(want, rd{first.Add(k), 256})
	}
	if fmt.Sprint(reads) != fmt.Sprint(want) {
		if len(reads) > 8 {
			reads = reads[:8]
		}
		t.Fatalf("READ requests %v, want %v", reads, want)
	}
	if responses != n+len(holes) {
		t.Fatalf("%d READ responses sent, want %d", responses, n+len(holes))
	}
	if ca := a.dev.Counters(); ca.LocalAckTimeout != 0 || ca.RetransmittedPkts != uint64(len(holes)) {
		t.Fatalf("local_ack_timeout_err %d retransmitted_pkts %d, want 0 and %d", ca.LocalAckTimeout, ca.RetransmittedPkts, len(holes))
	}
}

// drainedFn returns a function that waits (at most 5 s) until l's
// receive queue is empty: a sender that calls it now and then cannot
// overflow the queue (memnet drops what does not fit).
func drainedFn(l *psnLink) func() {
	rx := l.Link.(udp.BacklogLink)
	return func() {
		for end := time.Now().Add(5 * time.Second); rx.RecvBacklog() && time.Now().Before(end); {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// TestSRLongReadRunAndTailLost: what a receive queue overflow does to the
// READ of TestSRLongReadHoles: besides its 12 holes, a run of 421
// responses in the middle and the last 400 are lost. The requester asks
// for each lost response once (the run in one READ request; the tail,
// which nothing after it reveals, after one timeout: a probe for its first
// PSN, then the rest in one READ request) and completes.
func TestSRLongReadRunAndTailLost(t *testing.T) {
	const first = bth.PSN(0x10)
	const n = 8000
	holes := map[int]bool{}
	for k := 1500; k <= 7000; k += 500 {
		holes[k] = true
	}
	lost := func(k int) bool { return holes[k] || (k >= 4103 && k < 4524) || k >= 7600 }
	nlost := 0
	for k := range n {
		if lost(k) {
			nlost++
		}
	}
	clk := manual()
	a, b, la, lb := linkPair(t, pairOpts{mtu: MTU256, clock: clk, retry: 3, sr: true}, uint32(first), 0x40)
	drained := drainedFn(la)
	seen := map[bth.PSN]bool{}
	responses := 0
	lb.drop = func(p *packet.Packet) bool {
		if p.Info.Kind != bth.KindReadResponse {
			return false
		}
		if responses%256 == 0 {
			drained()
		}
		responses++
		q := p.BTH.PSN()
		if seen[q] {
			return false
		}
		seen[q] = true
		return lost(int(q.Diff(first)))
	}
	var reads []string
	la.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() == bth.RCReadRequest {
			reads = append(reads, fmt.Sprintf("%d+%d", p.BTH.PSN().Diff(first), p.RETH.DMALength()/256))
		}
		return false
	}
	src, smr := b.buffer(t, n*256, memreg.AccessRemoteRead)
	fill(src, 13)
	dst, dmr := a.buffer(t, len(src), 0)
	if err := a.qp.PostSend(SendWR{WRID: 9, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, len(dst)), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	// Time moves only while the responder is quiet (no response for
	// 5 ms of wall clock) and the requester has read every response:
	// the tail's loss shows only at a timeout.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		last := -1
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			lb.mu.Lock()
			r := responses
			lb.mu.Unlock()
			if r == last && !la.Link.(udp.BacklogLink).RecvBacklog() {
				clk.Advance(time.Millisecond)
			}
			last = r
		}
	}()
	wcs := waitWC(t, a.scq, 1, 10*time.Second)
	if wcs[0].WRID != 9 || wcs[0].Status != WCSuccess || !bytes.Equal(src, dst) {
		t.Fatalf("completion %+v (or data differs)", wcs[0])
	}
	la.mu.Lock()
	got := fmt.Sprint(reads)
	la.mu.Unlock()
	lb.mu.Lock()
	r := responses
	lb.mu.Unlock()
	ca := a.dev.Counters()
	t.Logf("READ requests %s; %d responses for %d (%d lost); %d timeouts", got, r, n, nlost, ca.CompleterRetryErr)
	const want = "[0+8000 1500+1 2000+1 2500+1 3000+1 3500+1 4000+1 4103+421 5000+1 5500+1 6000+1 6500+1 7000+1 7600+1 7601+399]"
	if got != want || r != n+nlost || ca.CompleterRetryErr != 1 || ca.RetryExceededErr != 0 {
		t.Fatalf("READ requests %s, %d responses, %d timeouts; want %s, %d, 1", got, r, ca.CompleterRetryErr, want, n+nlost)
	}
}

// TestSROOOBufferBound: the responder holds at most Window packets (here
// 16), drops what lies beyond (sr_out_of_window), and holds them in pool
// buffers of udp.MaxPacketSize: SRMemoryWorstCase is the bound. Filling
// the hole drains them in order; the WRITE lands whole.
func TestSROOOBufferBound(t *testing.T) {
	const w = 16
	if got, want := SRMemoryWorstCase(SRConfig{Window: w}), w*udp.MaxPacketSize; got != want {
		t.Fatalf("SRMemoryWorstCase %d, want %d", got, want)
	}
	if got := SRMemoryWorstCase(SRConfig{}); got != 128*udp.MaxPacketSize {
		t.Fatalf("default worst case %d, want %d (128 packets)", got, 128*udp.MaxPacketSize)
	}
	sl := &sinkLink{addr: addrA, done: make(chan struct{})}
	dev, err := NewDevice(sl, DeviceConfig{Clock: manual(), SelectiveRepeat: SRConfig{Window: w}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	o := pairOpts{mtu: MTU256, sr: true}
	o.defaults()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	qp, _ := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	connect(t, &side{qp: qp}, &side{qp: &QP{qpn: 0x99}}, addrB, 100, 200, &o)
	const npk = 28 // FIRST, 26 MIDDLE, LAST
	mem := make([]byte, npk*256)
	mr, _ := pd.RegisterMRIOVA(mem, 0x1000, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	want := make([]byte, len(mem))
	fill(want, 3)
	pkt := func(k int) []byte {
		f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteMiddle, PKey: 0xffff, DestQP: qp.QPN(), PSN: bth.PSN(200).Add(k)},
			Payload: want[k*256 : (k+1)*256]}
		switch k {
		case 0:
			f.BTH.Opcode, f.RETH = bth.RCWriteFirst, packetRETH(0x1000, mr.RKey(), uint32(len(mem)))
		case npk - 1:
			f.BTH.Opcode, f.BTH.AckReq = bth.RCWriteLast, true
		}
		buf := make([]byte, udp.MaxPacketSize)
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	for k := 1; k < npk; k++ { // everything but the FIRST
		if err := dev.HandlePacket(pkt(k), addrB); err != nil {
			t.Fatal(err)
		}
	}
	qp.mu.Lock()
	held := qp.sr.held
	qp.mu.Unlock()
	c := dev.Counters()
	if held != w-1 || c.SRHeld != w-1 || c.SROutOfWindow != npk-w || c.SRSACKSent == 0 {
		t.Fatalf("held %d sr_held %d sr_out_of_window %d sr_sack_sent %d, want %d %d %d >0", held, c.SRHeld, c.SROutOfWindow, c.SRSACKSent, w-1, w-1, npk-w)
	}
	if err := dev.HandlePacket(pkt(0), addrB); err != nil { // the hole: drains 1..15
		t.Fatal(err)
	}
	qp.mu.Lock()
	held, psn := qp.sr.held, qp.resp.psn
	qp.mu.Unlock()
	if held != 0 || psn != bth.PSN(200).Add(w) {
		t.Fatalf("after the hole: held %d, expected PSN %v, want 0 and %v", held, psn, bth.PSN(200).Add(w))
	}
	for k := w; k < npk; k++ { // the requester resends what was dropped
		if err := dev.HandlePacket(pkt(k), addrB); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(mem, want) || qp.State() != QPSRTS {
		t.Fatalf("WRITE data differs or state %v", qp.State())
	}
}

// TestIdleSRQPMemory: an idle RC QP connected with selective repeat (its
// state allocated, nothing held) still costs at most 16 KiB of heap.
func TestIdleSRQPMemory(t *testing.T) {
	var cq *CQ
	o := pairOpts{sr: true}
	o.defaults()
	peer := &side{qp: &QP{qpn: 0x99}}
	per := idleQPHeap(t, func(dev *Device, pd *memreg.PD) (*QP, error) {
		if cq == nil {
			cq, _ = dev.CreateCQ(1024)
		}
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 128, MaxRecvWR: 128})
		if err != nil {
			return nil, err
		}
		connect(t, &side{qp: qp}, peer, addrB, 1, 2, &o)
		if !qp.SelectiveRepeat() {
			t.Fatal("selective repeat off")
		}
		return qp, nil
	})
	t.Logf("heap per idle QP with selective repeat: %d bytes", per)
	if per > 16<<10 {
		t.Errorf("an idle QP with selective repeat costs %d bytes of heap, want <= 16 KiB", per)
	}
}

// TestSRAttr: the attribute is an RC one, set at INIT -> RTR only.
func TestSRAttr(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	if a.qp.SelectiveRepeat() {
		t.Fatal("selective repeat on without being asked")
	}
	err := a.qp.Modify(&QPAttr{State: QPSRTS, SelectiveRepeat: true}, AttrState|AttrSelectiveRepeat)
	if err == nil || !strings.Contains(err.Error(), "selective_repeat") {
		t.Fatalf("RTS -> RTS with selective_repeat: %v", err)
	}
	if _, err := NewDevice(&sinkLink{addr: addrA, done: make(chan struct{})}, DeviceConfig{SelectiveRepeat: SRConfig{Window: 257}}); err == nil {
		t.Fatal("Window 257 accepted")
	}
}

// TestSRWithDCQCN: selective repeat under loss and ECN marking: the
// notification points send CNPs, the reaction points cut the rate and pace
// every request, resends included, and the transfer still checks out byte
// for byte.
func TestSRWithDCQCN(t *testing.T) {
	a, b, n := newPair(t, pairOpts{faults: memnet.Faults{Loss: 0.01, CEMark: 0.05, Seed: 77}, mtu: MTU4096, timeout: 14,
		retry: 7, rnrRetry: 7, sqDepth: 64, rqDepth: 64, sr: true})
	ab, ba := newDirection(t, a, b), newDirection(t, b, a)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- ab.run(ctx, 4<<20) }()
	go func() { errs <- ba.run(ctx, 4<<20) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("%v\nA %+v\nB %+v", err, a.dev.Counters(), b.dev.Counters())
		}
	}
	ca, cb := a.dev.Counters(), b.dev.Counters()
	nc := n.Counters()
	t.Logf("net %+v; CNPs sent %d handled %d; sr_recoveries %d", nc, ca.NPCNPSent+cb.NPCNPSent, ca.RPCNPHandled+cb.RPCNPHandled, ca.SRRecoveries+cb.SRRecoveries)
	if nc.CEMarked == 0 || ca.NPCNPSent+cb.NPCNPSent == 0 || ca.RPCNPHandled+cb.RPCNPHandled == 0 {
		t.Errorf("ECN marks %d, CNPs sent %d, handled %d: DCQCN did not act", nc.CEMarked, ca.NPCNPSent+cb.NPCNPSent, ca.RPCNPHandled+cb.RPCNPHandled)
	}
	if nc.Lost > 0 && ca.SRRecoveries+cb.SRRecoveries == 0 {
		t.Errorf("%d lost, no selective resend", nc.Lost)
	}
	if got := nativeGet(ab.ctr); got != ab.faddN {
		t.Errorf("fetch-add counter %d, want %d (exactly once)", got, ab.faddN)
	}
}

// TestSRNAKAtNextPSN: a selective NAK whose PSN is the requester's next
// PSN (the responder got everything sent) acknowledges every PSN before
// it: the WQEs complete instead of waiting for a timeout that could only
// draw the same answer.
func TestSRNAKAtNextPSN(t *testing.T) {
	sl := &sinkLink{addr: addrA, done: make(chan struct{})}
	dev, err := NewDevice(sl, DeviceConfig{Clock: manual()})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	o := pairOpts{mtu: MTU256, sr: true}
	o.defaults()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	qp, _ := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	connect(t, &side{qp: qp}, &side{qp: &QP{qpn: 0x99}}, addrB, 100, 200, &o)
	mem := make([]byte, 600)
	mr, _ := pd.RegisterMR(mem, memreg.AccessLocalWrite)
	if err := qp.PostSend(SendWR{WRID: 5, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(mr, 0, 600), RemoteAddr: 1, RKey: 2}); err != nil {
		t.Fatal(err)
	}
	var sk [aeth.SACKMaxSize]byte
	f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: qp.QPN(), PSN: 103},
		AETH: aeth.Fields{Syndrome: aeth.NAK(aeth.NAKPSNSeqError), MSN: 1}, Payload: sk[:aeth.EncodeSACK(sk[:], []uint32{0, 0, 0, 0})]}
	buf := make([]byte, 128)
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.HandlePacket(buf[:n], addrB); err != nil {
		t.Fatal(err)
	}
	var wc [2]WC
	if k := cq.Poll(wc[:]); k != 1 || wc[0].WRID != 5 || wc[0].Status != WCSuccess {
		t.Fatalf("completions %d %+v, want WR 5 done", k, wc[:k])
	}
}

// TestSRLostReadRequestProbe: the READ request itself is lost, so no
// response comes and the timer fires. Its resend asks for the whole READ
// (the responder runs it as the original and saves it for replays), not
// the probe's one packet; the READ completes with every byte.
func TestSRLostReadRequestProbe(t *testing.T) {
	const first = bth.PSN(0x20)
	clk := manual()
	dropped := false
	a, b, la, _ := linkPair(t, pairOpts{mtu: MTU256, clock: clk, retry: 3, sr: true}, uint32(first), 0x40)
	var mu sync.Mutex
	var reads []uint32
	la.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() != bth.RCReadRequest {
			return false
		}
		mu.Lock()
		reads = append(reads, p.RETH.DMALength())
		mu.Unlock()
		if !dropped {
			dropped = true
			return true
		}
		return false
	}
	src, smr := b.buffer(t, 4*256, memreg.AccessRemoteRead)
	fill(src, 13)
	dst, dmr := a.buffer(t, len(src), 0)
	if err := a.qp.PostSend(SendWR{WRID: 9, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, len(dst)), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	var wc [1]WC
	for i := 0; i < 200 && a.scq.Poll(wc[:]) == 0; i++ {
		clk.Advance(time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	if wc[0].WRID != 9 || wc[0].Status != WCSuccess {
		t.Fatalf("completion %+v (READ requests %v)", wc[0], reads)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reads) < 2 || reads[1] != 1024 {
		t.Fatalf("READ requests %v: the resend after the timeout must ask for the whole 1024 bytes", reads)
	}
}

// TestSRReadProbeNotTheStream: a timeout while a READ's responses are late
// (a busy responder, a process not scheduled) probes with one response;
// the READ's own stream arriving after the probe went out is not the
// probe's answer (that is a LAST where the stream has a MIDDLE). Taking it
// for one marked every response not yet received lost and asked for them
// all again.
func TestSRReadProbeNotTheStream(t *testing.T) {
	const first = bth.PSN(0x10)
	const n = 40
	clk := manual()
	a, b, la, lb := linkPair(t, pairOpts{mtu: MTU256, clock: clk, retry: 3, sr: true}, uint32(first), 0x40)
	lb.hold = func(p *packet.Packet) bool {
		return p.Info.Kind == bth.KindReadResponse && !p.BTH.PSN().Before(first.Add(10))
	}
	var mu sync.Mutex
	var reads []string
	la.drop = func(p *packet.Packet) bool {
		if p.BTH.Opcode() == bth.RCReadRequest {
			mu.Lock()
			reads = append(reads, fmt.Sprintf("%v/%d", p.BTH.PSN(), p.RETH.DMALength()))
			mu.Unlock()
		}
		return false
	}
	nreads := func() int { mu.Lock(); defer mu.Unlock(); return len(reads) }
	src, smr := b.buffer(t, n*256, memreg.AccessRemoteRead)
	fill(src, 14)
	dst, dmr := a.buffer(t, len(src), 0)
	if err := a.qp.PostSend(SendWR{WRID: 3, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, len(dst)), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	// The first 10 responses arrive; the other 30 wait in lb.
	for i := 0; ; i++ {
		if i == 2000 {
			t.Fatal("the first responses did not arrive")
		}
		a.qp.mu.Lock()
		c := a.qp.comp.psn
		a.qp.mu.Unlock()
		if c == first.Add(10) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; nreads() < 2; i++ {
		if i == 200 {
			t.Fatalf("no probe after the timeout: READ requests %v", reads)
		}
		clk.Advance(time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	// The stream, then the probe's answer, arrive.
	for i := 0; ; i++ {
		lb.mu.Lock()
		h := len(lb.held)
		lb.mu.Unlock()
		if h == n-10+1 {
			break
		}
		if i == 2000 {
			t.Fatalf("%d packets held, want the 30 responses and the probe's answer", h)
		}
		time.Sleep(time.Millisecond)
	}
	lb.mu.Lock()
	lb.hold = nil
	lb.mu.Unlock()
	if err := lb.release(); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 1, 5*time.Second)
	if wcs[0].WRID != 3 || wcs[0].Status != WCSuccess || !bytes.Equal(src, dst) {
		t.Fatalf("completion %+v, data equal %v", wcs[0], bytes.Equal(src, dst))
	}
	// A needless resend leaves as the batch that completed the READ ends.
	time.Sleep(20 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if want := []string{fmt.Sprintf("%v/%d", first, n*256), fmt.Sprintf("%v/256", first.Add(10))}; fmt.Sprint(reads) != fmt.Sprint(want) {
		t.Fatalf("READ requests %v, want %v (the READ and the probe)", reads, want)
	}
}

// TestSRHeldReadKeepsSlot: a resent part of a held READ longer than the
// window maps to the READ's own slot; it must not evict the READ (which
// would then never run), and the READ runs whole once the hole fills.
func TestSRHeldReadKeepsSlot(t *testing.T) {
	const w = 16
	sl := &sinkLink{addr: addrA, done: make(chan struct{})}
	dev, err := NewDevice(sl, DeviceConfig{Clock: manual(), SelectiveRepeat: SRConfig{Window: w}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	o := pairOpts{mtu: MTU256, sr: true}
	o.defaults()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	qp, _ := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	connect(t, &side{qp: qp}, &side{qp: &QP{qpn: 0x99}}, addrB, 100, 200, &o)
	mem := make([]byte, 40*256)
	mr, _ := pd.RegisterMRIOVA(mem, 0x1000, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
	send := func(f packet.Fields) {
		t.Helper()
		f.BTH.PKey, f.BTH.DestQP = 0xffff, qp.QPN()
		buf := make([]byte, udp.MaxPacketSize)
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.HandlePacket(buf[:n], addrB); err != nil {
			t.Fatal(err)
		}
	}
	send(packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest, PSN: 201}, RETH: packetRETH(0x1000, mr.RKey(), 40*256)})
	send(packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest, PSN: 201 + w}, RETH: packetRETH(0x1000+w*256, mr.RKey(), 256)})
	qp.mu.Lock()
	held, slotPSN := qp.sr.held, qp.sr.slots[201%w].psn
	qp.mu.Unlock()
	if held != 1 || slotPSN != 201 {
		t.Fatalf("held %d, slot holds PSN %v: the READ at 201 must stay held", held, slotPSN)
	}
	send(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly, PSN: 200}, RETH: packetRETH(0x1000, mr.RKey(), 4), Payload: []byte{1, 2, 3, 4}})
	qp.mu.Lock()
	psn := qp.resp.psn
	qp.mu.Unlock()
	if want := bth.PSN(201 + 40); psn != want || qp.State() != QPSRTS {
		t.Fatalf("expected PSN %v state %v, want %v RTS (the whole READ ran)", psn, qp.State(), want)
	}
}

// srDropLink drops the first WRITE MIDDLE packet after arm, without
// allocating (the test measures the transport's allocations).
type srDropLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	mu       sync.Mutex
	arm      bool
	keep     []udp.Packet
}

func (l *srDropLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keep = l.keep[:0]
	for _, p := range pkts {
		if l.arm && len(p.Buf) > 0 && bth.Opcode(p.Buf[0]) == bth.RCWriteMiddle {
			l.arm = false
			continue
		}
		l.keep = append(l.keep, p)
	}
	if len(l.keep) == 0 {
		return nil
	}
	return l.Link.Send(l.keep)
}

// TestSRAllocsPerMessage: selective repeat keeps the data path free of
// allocations with out-of-order packets: a WRITE of 4 packets whose second
// packet is dropped once per round (the responder holds the rest in pooled
// buffers and sends a selective NAK; the requester resends the hole).
func TestSRAllocsPerMessage(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	o := pairOpts{mtu: MTU1024, sr: true}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	ra, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := n.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	la := &srDropLink{Wrap: udp.Wrap{Link: ra}, keep: make([]udp.Packet, 0, 256)}
	a, r := sideOn(t, la, &o), sideOn(t, rb, &o)
	connect(t, a, r, addrB, 0x100, 0x200, &o)
	connect(t, r, a, addrA, 0x200, 0x100, &o)
	_, smr := a.buffer(t, 4096, 0)
	_, dmr := r.buffer(t, 4096, memreg.AccessRemoteWrite)
	wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: []memreg.SGE{{Addr: smr.IOVA(), Length: 4096, LKey: smr.LKey()}},
		RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	wc := make([]WC, 1)
	ctx := context.Background()
	one := func() {
		la.mu.Lock()
		la.arm = true
		la.mu.Unlock()
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if _, err := a.scq.Wait(ctx, wc); err != nil || wc[0].Status != WCSuccess {
			t.Fatal(err, wc[0])
		}
	}
	for i := 0; i < 50; i++ {
		one()
	}
	before := a.dev.Counters()
	allocs := testing.AllocsPerRun(200, one)
	after := a.dev.Counters()
	t.Logf("allocations per WRITE with one hole: %.2f; sr_recoveries %d local_ack_timeout_err %d", allocs,
		after.SRRecoveries-before.SRRecoveries, after.LocalAckTimeout-before.LocalAckTimeout)
	if after.SRRecoveries-before.SRRecoveries < 150 {
		t.Fatalf("sr_recoveries %d over 201 rounds: the holes were not resent selectively", after.SRRecoveries-before.SRRecoveries)
	}
	if allocs > 1 {
		t.Errorf("%.2f allocations per WRITE in steady state, want ~0", allocs)
	}
}

// TestSRFarRuns: far READ responses are kept as sorted, merged runs, at
// most srFarRuns of them, and move into the ring's bitmap as it reaches
// them.
func TestSRFarRuns(t *testing.T) {
	s := &srState{round: new([srRingBits]uint16), base: 0xfffff0} // the ring wraps the PSN space
	origin := s.base.Add(srRingBits)
	far := func(d int32) bth.PSN { return origin.Add(int(d)) }
	for _, d := range []int32{5, 6, 8, 4, 7, 20, 30, 19, 6} {
		s.setDone(far(d))
	}
	if got := fmt.Sprint(s.far[:len(s.far)]); got != fmt.Sprint([]srRun{{far(4), far(9)}, {far(19), far(21)}, {far(30), far(31)}}) {
		t.Fatalf("runs %v", got)
	}
	for d := int32(0); d < 40; d++ {
		want := d >= 4 && d < 9 || d == 19 || d == 20 || d == 30
		if s.isDone(far(d)) != want {
			t.Fatalf("isDone(far+%d) = %v", d, !want)
		}
	}
	if !s.anyDone(far(0), far(5)) || s.anyDone(far(9), far(19)) {
		t.Fatal("anyDone")
	}
	// Full: a response that needs one run more is dropped.
	for d := int32(100); d < 100+2*srFarRuns; d += 2 {
		s.setDone(far(d))
	}
	if len(s.far) != srFarRuns || s.isDone(far(100+2*(srFarRuns-3))) {
		t.Fatalf("%d runs: %v", len(s.far), s.far[:len(s.far)])
	}
	// The ring moves 20 on: [far+4, far+9) and far+19 are in its bitmap.
	s.base = s.base.Add(20)
	s.foldFar()
	if len(s.far) != srFarRuns-1 || s.far[0] != (srRun{far(20), far(21)}) {
		t.Fatalf("after the move: %v", s.far[:len(s.far)])
	}
	for d := int32(0); d < 40; d++ {
		want := d >= 4 && d < 9 || d == 19 || d == 20 || d == 30
		if s.isDone(far(d)) != want {
			t.Fatalf("after the move: isDone(far+%d) = %v", d, !want)
		}
	}
}

// TestSRSettledScans: the word-at-a-time scans of the requester's bitmaps
// agree with a PSN-at-a-time reference on random bitmaps, ring positions
// and bounds: never past end nor past the ring's end (a word's bits past
// the ring's end are PSNs at its start; a step over them overshot the
// ring, and a resend asked for PSNs past it, which have no pending bit).
func TestSRSettledScans(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 3000; iter++ {
		s := &srState{round: new([srRingBits]uint16), base: bth.PSN(rng.Uint32() & 0xffffff)}
		density := rng.IntN(4)
		for i := range s.done {
			for b := 0; b < 64; b++ {
				if rng.IntN(4) < density {
					s.done[i] |= 1 << b
				}
				if rng.IntN(8) == 0 {
					s.pend[i] |= 1 << b
				}
			}
		}
		q := s.base.Add(rng.IntN(srRingBits))
		end := q.Add(rng.IntN(2*srRingBits) + 1)
		lim := end
		if re := s.base.Add(srRingBits); re.Before(lim) {
			lim = re
		}
		settled := func(p bth.PSN) bool { return s.isDone(p) || s.isPend(p) }
		want := q
		for want.Before(lim) && settled(want) {
			want = want.Add(1)
		}
		if got := s.settledFrom(q, end); got != want {
			t.Fatalf("iter %d: settledFrom(%v, %v) base %v = %v, want %v", iter, q, end, s.base, got, want)
		}
		want = q
		for want.Before(lim) && !settled(want) {
			want = want.Add(1)
		}
		if got := s.unsettledFrom(q, end); got != want {
			t.Fatalf("iter %d: unsettledFrom(%v, %v) base %v = %v, want %v", iter, q, end, s.base, got, want)
		}
	}
}

// TestSRMaxHeldDevice: every QP holds at most Window out-of-order packets,
// but the device's QPs together hold at most SRConfig.MaxHeld: a peer that
// opened many QPs and sent each a window of tiny packets ahead of a gap
// made the device hold a pool buffer for each (1.2 GiB for 1000 QPs,
// hostile26). Beyond the budget a packet is dropped and counted
// (sr_hold_full); the holes filled, the held packets drain and the
// budget is whole again; the data the requester then resends lands.
func TestSRMaxHeldDevice(t *testing.T) {
	const w, budget = 16, 20
	sl := &sinkLink{addr: addrA, done: make(chan struct{})}
	dev, err := NewDevice(sl, DeviceConfig{Clock: manual(), SelectiveRepeat: SRConfig{Window: w, MaxHeld: budget}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	o := pairOpts{mtu: MTU256, sr: true}
	o.defaults()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	const npk = w // FIRST, MIDDLEs, LAST: all within the window
	type conn struct {
		qp   *QP
		mem  []byte
		want []byte
		pkt  func(k int) []byte
	}
	var conns []*conn
	for i := range 2 {
		qp, _ := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
		connect(t, &side{qp: qp}, &side{qp: &QP{qpn: 0x99 + uint32(i)}}, addrB, 100, 200, &o)
		c := &conn{qp: qp, mem: make([]byte, npk*256), want: make([]byte, npk*256)}
		fill(c.want, uint64(3+i))
		mr, _ := pd.RegisterMRIOVA(c.mem, 0x1000, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
		c.pkt = func(k int) []byte {
			f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteMiddle, PKey: 0xffff, DestQP: qp.QPN(), PSN: bth.PSN(200).Add(k)},
				Payload: c.want[k*256 : (k+1)*256]}
			switch k {
			case 0:
				f.BTH.Opcode, f.RETH = bth.RCWriteFirst, packetRETH(0x1000, mr.RKey(), uint32(len(c.mem)))
			case npk - 1:
				f.BTH.Opcode, f.BTH.AckReq = bth.RCWriteLast, true
			}
			buf := make([]byte, udp.MaxPacketSize)
			n, err := packet.Build(buf, &f)
			if err != nil {
				t.Fatal(err)
			}
			return buf[:n]
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		for k := 1; k < npk; k++ { // everything but the FIRST
			if err := dev.HandlePacket(c.pkt(k), addrB); err != nil {
				t.Fatal(err)
			}
		}
	}
	held := func() (int, int) {
		n := [2]int{}
		for i, c := range conns {
			c.qp.mu.Lock()
			n[i] = c.qp.sr.held
			c.qp.mu.Unlock()
		}
		return n[0], n[1]
	}
	h0, h1 := held()
	ctr := dev.Counters()
	if h0+h1 != budget || h0 != npk-1 || ctr.SRHeld != budget || ctr.SRHoldFull != 2*(npk-1)-budget || dev.srHeld.Load() != budget {
		t.Fatalf("held %d+%d (device %d), sr_held %d, sr_hold_full %d; want %d+%d, %d, %d",
			h0, h1, dev.srHeld.Load(), ctr.SRHeld, ctr.SRHoldFull, npk-1, budget-(npk-1), budget, 2*(npk-1)-budget)
	}
	for _, c := range conns { // the holes: what was held drains
		if err := dev.HandlePacket(c.pkt(0), addrB); err != nil {
			t.Fatal(err)
		}
	}
	if h0, h1 := held(); h0+h1 != 0 || dev.srHeld.Load() != 0 {
		t.Fatalf("after the holes: held %d+%d, device count %d; want 0", h0, h1, dev.srHeld.Load())
	}
	for _, c := range conns { // the requester resends what was dropped
		c.qp.mu.Lock()
		next := int(c.qp.resp.psn.Diff(200))
		c.qp.mu.Unlock()
		for k := next; k < npk; k++ {
			if err := dev.HandlePacket(c.pkt(k), addrB); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(c.mem, c.want) || c.qp.State() != QPSRTS {
			t.Fatalf("QP %#x: WRITE data differs or state %v", c.qp.QPN(), c.qp.State())
		}
	}
}

// TestSRNoReflection: a selective repeat responder answers a state it has
// already told the requester about at most once, as go-back-N NAKs a gap
// once and then drops silently: a stream of requests it drops — beyond
// the window (sr_out_of_window), copies of a held packet, packets beyond
// the device's MaxHeld (sr_hold_full) — draws no selective NAK per
// packet (per received batch) any more, only when the responder's state
// (expected PSN, held set) changed since the last one. Each packet here
// is its own batch (HandlePacket); the responder's sent_pkts counts what
// it answers. Before, each of those packets drew one selective NAK: a
// peer, or anyone who can spoof one, got a packet back for each it sent.
func TestSRNoReflection(t *testing.T) {
	const w, n = 16, 100
	sl := &sinkLink{addr: addrA, done: make(chan struct{})}
	dev, err := NewDevice(sl, DeviceConfig{Clock: manual(), SelectiveRepeat: SRConfig{Window: w, MaxHeld: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	o := pairOpts{mtu: MTU256, sr: true}
	o.defaults()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	qp, _ := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	connect(t, &side{qp: qp}, &side{qp: &QP{qpn: 0x99}}, addrB, 100, 200, &o)
	mem := make([]byte, 64*256)
	mr, _ := pd.RegisterMRIOVA(mem, 0x1000, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	pay := make([]byte, 256)
	pkt := func(k int) []byte { // PSN 200+k of one long WRITE
		f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteMiddle, PKey: 0xffff, DestQP: qp.QPN(), PSN: bth.PSN(200).Add(k)}, Payload: pay}
		if k == 0 {
			f.BTH.Opcode, f.RETH = bth.RCWriteFirst, packetRETH(0x1000, mr.RKey(), uint32(len(mem)))
		}
		buf := make([]byte, udp.MaxPacketSize)
		nb, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:nb]
	}
	// step sends packet k count times, each its own batch, and returns how
	// many packets the responder sent meanwhile.
	step := func(k, count int) uint64 {
		t.Helper()
		before := dev.Counters().SentPkts
		for range count {
			if err := dev.HandlePacket(pkt(k), addrB); err != nil {
				t.Fatal(err)
			}
		}
		return dev.Counters().SentPkts - before
	}
	far := w + 5 // beyond the window from every expected PSN below
	steps := []struct {
		what  string
		k, n  int
		limit uint64 // most packets the responder may send
		least uint64 // fewest
	}{
		{"beyond the window, expected PSN 200", far, n, 1, 1},     // one selective NAK: the gap is news
		{"held: 202", 2, 1, 1, 1},                                 // news: a selective NAK
		{"the held 202 again", 2, n, 0, 0},                        // nothing new
		{"beyond the window again", far, n, 0, 0},                 // nothing new
		{"held: 203 (MaxHeld reached)", 3, 1, 1, 1},               // news
		{"204: beyond MaxHeld", 4, n, 0, 0},                       // sr_hold_full, nothing new
		{"200 executes: expected PSN 201", 0, 1, 1, 1},            // progress: a selective NAK for 201
		{"beyond the window, expected PSN 201", far, n, 0, 0},     // told already
		{"201: 201..203 execute, nothing held", 1, 1, 0, 0},       // no AckReq: silent
		{"beyond the window, expected PSN 204", far + 3, n, 1, 1}, // the new gap is news once
	}
	for i, s := range steps {
		got := step(s.k, s.n)
		if got < s.least || got > s.limit {
			t.Errorf("step %d (%s, %d packets): the responder sent %d packets, want %d..%d", i, s.what, s.n, got, s.least, s.limit)
		}
	}
	c := dev.Counters()
	if c.SROutOfWindow != 4*n || c.SRHoldFull != n || c.SRHeld != 2 || c.DuplicateRequest != n {
		t.Errorf("sr_out_of_window %d sr_hold_full %d sr_held %d duplicate_request %d, want %d %d 2 %d", c.SROutOfWindow, c.SRHoldFull, c.SRHeld, c.DuplicateRequest, 4*n, n, n)
	}
	if qp.State() != QPSRTS {
		t.Fatal(qp.State())
	}
}
