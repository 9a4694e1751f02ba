package transport

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

func psnsOf(ws []wirePkt) []bth.PSN {
	out := make([]bth.PSN, len(ws))
	for i, w := range ws {
		out[i] = w.psn
	}
	return out
}

func psnRange(first bth.PSN, from, to int) []bth.PSN {
	var out []bth.PSN
	for i := from; i < to; i++ {
		out = append(out, first.Add(i))
	}
	return out
}

// windowRequester is a silent requester (see silentRequester) with a
// window of window PSNs for every packet (MaxUnackedSmallPSNs off) and
// max_rd_atomic rd.
func windowRequester(t *testing.T, window int, rd uint8) (a *side, la *psnLink, clk *ManualClock, first bth.PSN, dmr, smr *memreg.MR) {
	t.Helper()
	return windowRequesterOpts(t, pairOpts{window: window, small: -1, maxRd: rd})
}

// windowRequesterOpts is windowRequester with o's window, small window,
// max_rd_atomic and SQ depth.
func windowRequesterOpts(t *testing.T, o pairOpts) (a *side, la *psnLink, clk *ManualClock, first bth.PSN, dmr, smr *memreg.MR) {
	t.Helper()
	clk = manual()
	o.clock, o.retry, o.timeout = clk, 7, 10
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	ra, _ := n.Link(addrA)
	rb, _ := n.Link(addrB)
	la = &psnLink{Wrap: udp.Wrap{Link: ra}, drop: func(*packet.Packet) bool { return true }}
	a, b := sideOn(t, la, &o), sideOn(t, rb, &o)
	first = 0xfffffc
	connect(t, a, b, addrB, uint32(first), 0x10, &o)
	connect(t, b, a, addrA, 0x10, uint32(first), &o)
	_, smr = a.buffer(t, 4096, 0)
	_, dmr = b.buffer(t, 4096, memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
	return a, la, clk, first, dmr, smr
}

// TestGoBackNRespectsWindow: after a PSN sequence NAK the retransmission
// and the new packets together stay within MaxUnackedPSNs of the NAK'd PSN.
func TestGoBackNRespectsWindow(t *testing.T) {
	a, la, _, first, dmr, smr := windowRequester(t, 4, 16)
	for i := range 10 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 32), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := psnsOf(la.sent()), psnRange(first, 0, 4); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("first flight %v, want %v", got, want)
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(2), aeth.NAK(aeth.NAKPSNSeqError), 2), addrB); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, 2, time.Second)
	want := append(psnRange(first, 0, 4), psnRange(first, 2, 6)...)
	if got := psnsOf(la.sent()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the NAK %v, want %v", got, want)
	}
	if c := a.dev.Counters(); c.RetransmittedPkts != 2 {
		t.Fatalf("retransmitted_pkts %d, want 2", c.RetransmittedPkts)
	}
}

// TestTimeoutRetryRespectsMaxRdAtomic: with max_rd_atomic 2 only two READs
// are outstanding, also when a local ACK timeout resends them; a READ
// response frees a slot for the next READ.
func TestTimeoutRetryRespectsMaxRdAtomic(t *testing.T) {
	a, la, clk, first, dmr, smr := windowRequester(t, 128, 2)
	for i := range 4 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, 8*i, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := psnsOf(la.sent()), psnRange(first, 0, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("first flight %v, want %v (two READs)", got, want)
	}
	readResp := func(psn bth.PSN, msn uint32) {
		t.Helper()
		var f packet.Fields
		f.BTH.Opcode = bth.RCReadResponseOnly
		f.BTH.PKey = bth.DefaultPKey
		f.BTH.DestQP = a.qp.QPN()
		f.BTH.PSN = psn
		f.AETH.Syndrome = aeth.ACK(aeth.NoCreditLimit)
		f.AETH.MSN = msn
		f.Payload = []byte{1, 2, 3, 4, 5, 6, 7, 8}
		buf := make([]byte, 128)
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.dev.HandlePacket(buf[:n], addrB); err != nil {
			t.Fatal(err)
		}
	}
	readResp(first, 1)
	if wc := waitWC(t, a.scq, 1, time.Second)[0]; wc.WRID != 0 || wc.Status != WCSuccess || wc.ByteLen != 8 {
		t.Fatalf("%+v", wc)
	}
	if got, want := psnsOf(la.sent()), psnRange(first, 0, 3); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after one response %v, want %v", got, want)
	}
	clk.Advance(AckTimeout(10))
	want := append(psnRange(first, 0, 3), psnRange(first, 1, 3)...)
	if got := psnsOf(la.sent()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after a timeout %v, want %v (READs 1 and 2 again, not READ 3)", got, want)
	}
	readResp(first.Add(1), 2)
	readResp(first.Add(2), 3)
	waitWC(t, a.scq, 2, time.Second)
	want = append(want, first.Add(3))
	if got := psnsOf(la.sent()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after two more responses %v, want %v", got, want)
	}
	if c := a.dev.Counters(); c.LocalAckTimeout != 1 || c.CompleterRetryErr != 1 {
		t.Fatalf("local_ack_timeout_err %d completer_retry_err %d", c.LocalAckTimeout, c.CompleterRetryErr)
	}
}

// TestRNRThenSeqNAK: SENDs to a responder with no receive WQE. The first
// gets an RNR NAK, the second a PSN sequence error NAK (it is ahead of the
// RNR'd PSN), the third nothing. The requester waits out the RNR timer
// (no immediate go-back-N for the sequence NAK) and then resends the three
// once; with receive WQEs posted meanwhile everything completes. (The RNR
// NAK rewound the requester to 0x50, so the sequence NAK for 0x50 is
// outside the outstanding PSNs when it arrives: ignored, and not counted
// in rcvd_seq_err.)
func TestRNRThenSeqNAK(t *testing.T) {
	clk := manual()
	a, b, la, lb := linkPair(t, pairOpts{clock: clk, minRNR: 6, rnrRetry: 3, retry: 3, timeout: 20}, 0x50, 0x60)
	src, smr := a.buffer(t, 64, 0)
	fill(src, 3)
	// B takes no packet until all three are sent: otherwise the RNR NAK
	// for the first can reach A before the third SEND leaves, and A then
	// holds it back for the RNR timer (1 run in 12 under -race).
	b.qp.mu.Lock()
	for i := range 3 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 64)}); err != nil {
			b.qp.mu.Unlock()
			t.Fatal(err)
		}
	}
	b.qp.mu.Unlock()
	defer func() {
		if t.Failed() {
			t.Logf("A %+v\nB %+v\nresp %+v\nreq %+v\n%s", a.dev.Counters(), b.dev.Counters(), lb.sent(), la.sent(), a.qp.debugState())
		}
	}()
	eventually(t, "RNR and sequence NAKs", func() bool {
		c := a.dev.Counters()
		return c.RcvdRNRErr == 1 && c.RcvdPkts == 2
	})
	resp := lb.sent()
	if len(resp) != 2 || resp[0].syn != aeth.RNRNAK(6) || resp[0].psn != 0x50 || resp[1].syn != aeth.NAK(aeth.NAKPSNSeqError) || resp[1].psn != 0x50 {
		t.Fatalf("responder sent %+v, want RNR NAK then PSN sequence NAK, both for 0x50", resp)
	}
	if c := b.dev.Counters(); c.SendRNRErr != 1 || c.OutOfSeqRequest != 1 {
		t.Fatalf("responder send_rnr_err %d out_of_seq_request %d", c.SendRNRErr, c.OutOfSeqRequest)
	}
	if n := len(la.sent()); n != 3 {
		t.Fatalf("requester sent %d packets before the RNR timer, want 3", n)
	}
	_, rmr := b.buffer(t, 64*3, 0)
	for i := range 3 {
		if err := b.qp.PostRecv(RecvWR{WRID: uint64(10 + i), SGEs: sge(rmr, 64*i, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(aeth.RNRTimeout(6))
	wcs := waitWC(t, a.scq, 3, 5*time.Second)
	for i, wc := range wcs {
		if wc.WRID != uint64(i) || wc.Status != WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	waitWC(t, b.rcq, 3, 5*time.Second)
	if got, want := psnsOf(la.sent()), []bth.PSN{0x50, 0x51, 0x52, 0x50, 0x51, 0x52}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("requester sent %v, want %v", got, want)
	}
	if c := a.dev.Counters(); c.CompleterRetryErr != 0 || c.RetransmittedPkts != 3 {
		t.Fatalf("completer_retry_err %d retransmitted_pkts %d, want 0 and 3", c.CompleterRetryErr, c.RetransmittedPkts)
	}
}

// TestReuseAfterReset: QPs that went to ERR are reset, reconnected with new
// PSNs and carry every operation again; nothing of the old connection
// (completions, saved READ/atomic results, PSNs, timers) leaks into the new.
func TestReuseAfterReset(t *testing.T) {
	clk := manual()
	o := pairOpts{clock: clk, mtu: MTU256, retry: 2, timeout: 10}
	a, b, la, _ := linkPair(t, o, 0x10, 0x20)
	o.defaults()
	src, smr := a.buffer(t, 1000, 0)
	dst, dmr := b.buffer(t, 1000, memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
	rbuf, rmr := b.buffer(t, 1000, 0)
	fill(src, 1)
	// Old connection: a READ and a fetch-add complete (their results are
	// saved at b), then a bad rkey takes both QPs to ERR.
	if err := b.qp.PostRecv(RecvWR{WRID: 100, SGEs: sge(rmr, 0, 1000)}); err != nil {
		t.Fatal(err)
	}
	nativePut(dst[8:], 5)
	if err := a.qp.PostSend(
		SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, 0, 600), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		SendWR{WRID: 2, Opcode: WRFetchAdd, Flags: SendSignaled, SGEs: sge(smr, 800, 8), RemoteAddr: dmr.IOVA() + 8, RKey: dmr.RKey(), CompareAdd: 1},
		SendWR{WRID: 3, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: 0x777700},
		SendWR{WRID: 4, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 8)},
	); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 4, 5*time.Second)
	if wcs[0].Status != WCSuccess || wcs[1].Status != WCSuccess || wcs[2].Status != WCRemAccessErr || wcs[3].Status != WCWRFlushErr {
		t.Fatalf("old connection %+v", wcs)
	}
	eventually(t, "responder ERR", func() bool { return b.qp.State() == QPSErr })
	if wc := waitWC(t, b.rcq, 1, time.Second)[0]; wc.WRID != 100 || wc.Status != WCWRFlushErr {
		t.Fatalf("old receive %+v", wc)
	}
	oldSent := len(la.sent())
	for _, s := range []*side{a, b} {
		if err := s.qp.Modify(&QPAttr{State: QPSReset}, AttrState); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Hour) // any timer of the old connection fires now
	if n := len(la.sent()); n != oldSent {
		t.Fatalf("a QP in RESET sent %d packets", n-oldSent)
	}
	noWC(t, a.scq)
	noWC(t, b.rcq)
	// New connection; the new PSNs overlap the old ones so that stale
	// saved READ/atomic results would be found if they survived.
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	fill(src, 2)
	nativePut(dst[8:], 40)
	if err := b.qp.PostRecv(RecvWR{WRID: 200, SGEs: sge(rmr, 0, 1000)}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(
		SendWR{WRID: 11, Opcode: WRFetchAdd, Flags: SendSignaled, SGEs: sge(smr, 800, 8), RemoteAddr: dmr.IOVA() + 8, RKey: dmr.RKey(), CompareAdd: 2},
		SendWR{WRID: 12, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 700)},
		SendWR{WRID: 13, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 600), RemoteAddr: dmr.IOVA() + 100, RKey: dmr.RKey()},
		SendWR{WRID: 14, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, 900, 100), RemoteAddr: dmr.IOVA() + 100, RKey: dmr.RKey()},
	); err != nil {
		t.Fatal(err)
	}
	wcs = waitWC(t, a.scq, 4, 5*time.Second)
	for i, wc := range wcs {
		if wc.WRID != uint64(11+i) || wc.Status != WCSuccess {
			t.Fatalf("new connection completion %d: %+v", i, wc)
		}
	}
	if got := nativeGet(src[800:]); got != 40 {
		t.Fatalf("fetch-add returned %d, want 40 (a stale saved result?)", got)
	}
	if got := nativeGet(dst[8:]); got != 42 {
		t.Fatalf("fetch-add target %d, want 42", got)
	}
	if wc := waitWC(t, b.rcq, 1, time.Second)[0]; wc.WRID != 200 || wc.Status != WCSuccess || wc.ByteLen != 700 {
		t.Fatalf("new receive %+v", wc)
	}
	if string(rbuf[:700]) != string(src[:700]) || string(dst[100:700]) != string(src[:600]) || string(src[900:1000]) != string(dst[100:200]) {
		t.Fatal("data differs on the new connection")
	}
	noWC(t, a.scq)
	noWC(t, b.rcq)
}

// TestSmallWindowCutOnLoss: a go-back-N rewind (a sequence NAK, or a
// local ACK timeout) cuts the small-packet window to MaxUnackedPSNs, and
// acknowledged PSNs grow it back by a quarter of their number, up to
// MaxUnackedSmallPSNs.
func TestSmallWindowCutOnLoss(t *testing.T) {
	a, la, clk, first, dmr, smr := windowRequesterOpts(t, pairOpts{sqDepth: 4096, maxRd: 16})
	for i := range 3000 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	sentTo := func() int { // one past the highest PSN sent, from first
		ps := psnsOf(la.sent())
		return int(ps[len(ps)-1].Diff(first)) + 1
	}
	check := func(what string, want int) {
		t.Helper()
		if got := sentTo(); got != want {
			t.Fatalf("%s: sent up to first+%d, want first+%d", what, got, want)
		}
	}
	ack := func(psn int, syn aeth.Syndrome) {
		t.Helper()
		if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(psn), syn, uint32(psn+1)), addrB); err != nil {
			t.Fatal(err)
		}
	}
	check("first flight", 512)
	// PSN 10 lost: the NAK acknowledges 0-9 and rewinds to 10; the
	// window is 128 from there.
	ack(10, aeth.NAK(aeth.NAKPSNSeqError))
	n := len(la.sent())
	if got := psnsOf(la.sent()[512:]); fmt.Sprint(got) != fmt.Sprint(psnRange(first, 10, 138)) {
		t.Fatalf("resent %v, want PSNs 10-137", got)
	}
	// 128 PSNs acknowledged: the window grows by 32, to 160 from 138.
	ack(137, aeth.ACK(aeth.NoCreditLimit))
	if got := len(la.sent()) - n; got != 160 {
		t.Fatalf("after 128 acknowledged: %d more packets, want 160 (window 160)", got)
	}
	// Every 160 acknowledged adds 40 until the window is 512 again.
	at, win := 137, 160
	for win < 512 {
		at += win
		ack(at, aeth.ACK(aeth.NoCreditLimit))
		win = min(512, win+win/4)
	}
	check("grown back", at+1+512)
	// A local ACK timeout cuts it again.
	n = len(la.sent())
	clk.Advance(AckTimeout(10))
	if got := len(la.sent()) - n; got != 128 {
		t.Fatalf("after a timeout: %d packets resent, want 128", got)
	}
}

// TestRequesterWindowAtLeastOne: requester.progress asks window only
// while PSNs are outstanding — nothing outstanding fits any window — which
// is right only if every window is at least 1: checked for the smallest
// configurations (one PSN, the small window as large or -1, selective
// repeat with one packet in flight), a small window cut by a rewind, and
// every opcode, length and packet index. And on the wire: with a window
// of one PSN the second SEND waits for the first one's ACK.
func TestRequesterWindowAtLeastOne(t *testing.T) {
	ops := []WROpcode{WRSend, WRSendImm, WRSendInv, WRWrite, WRWriteImm, WRRead, WRCompareSwap, WRFetchAdd}
	for _, o := range []pairOpts{
		{window: 1, small: -1},
		{window: 1, small: 1},
		{window: 1, small: -1, sr: true, srCfg: SRConfig{MaxInflight: 1}},
		{},
	} {
		a, _, _, _, _, _ := windowRequesterOpts(t, o)
		qp := a.qp
		qp.mu.Lock()
		for _, cut := range []bool{false, true} {
			if cut {
				qp.req.smallWin = int32(qp.dev.cfg.MaxUnackedPSNs)
			}
			for _, op := range ops {
				for _, n := range []uint32{0, 8, 128, 129, 1024, 5000} {
					w := &sendWQE{length: n}
					w.wr.Opcode = op
					for k := range npkts(n, qp.mtu) {
						if got := qp.req.window(w, k); got < 1 {
							t.Errorf("window %d small %d sr %v cut %v: window(%v, %d bytes, packet %d) = %d, want >= 1",
								o.window, o.small, o.sr, cut, op, n, k, got)
						}
					}
				}
			}
		}
		qp.req.smallWin = 0
		qp.mu.Unlock()
	}

	a, la, _, first, _, smr := windowRequester(t, 1, 16)
	for i := range 2 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRSend, SGEs: sge(smr, 0, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := psnsOf(la.sent()), psnRange(first, 0, 1); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("window 1: sent %v before an ACK, want %v", got, want)
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first, aeth.ACK(aeth.NoCreditLimit), 1), addrB); err != nil {
		t.Fatal(err)
	}
	if got, want := psnsOf(la.sent()), psnRange(first, 0, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("window 1: sent %v after the first ACK, want %v", got, want)
	}
}
