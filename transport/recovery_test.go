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
// window of window PSNs and max_rd_atomic rd.
func windowRequester(t *testing.T, window int, rd uint8) (a *side, la *psnLink, clk *ManualClock, first bth.PSN, dmr, smr *memreg.MR) {
	t.Helper()
	clk = manual()
	o := pairOpts{clock: clk, retry: 7, window: window, maxRd: rd, timeout: 10}
	o.defaults()
	n := udp.NewMemNetwork(udp.Faults{})
	ra, _ := n.Link(addrA)
	rb, _ := n.Link(addrB)
	la = &psnLink{Link: ra, drop: func(*packet.Packet) bool { return true }}
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
	for i := range 3 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 64)}); err != nil {
			t.Fatal(err)
		}
	}
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
