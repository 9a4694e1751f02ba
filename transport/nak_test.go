package transport

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
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

// wirePkt is a summary of one packet a device handed to its link.
type wirePkt struct {
	op      bth.Opcode
	psn     bth.PSN
	ackReq  bool
	syn     aeth.Syndrome
	msn     uint32
	hasAETH bool
	dropped bool
}

func (w wirePkt) isNAK() bool { return w.hasAETH && w.op == bth.RCAck && w.syn.Type() == aeth.TypeNAK }

// psnLink records every packet sent through it and drops those for which
// drop returns true (drop sees the parsed packet and may keep state; it is
// called under the link's mutex).
type psnLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	mu       sync.Mutex
	drop     func(p *packet.Packet) bool
	// hold keeps a copy of the packets it picks, sent by release.
	hold func(p *packet.Packet) bool
	held []udp.Packet
	log  []wirePkt
}

// release sends the held packets, in the order they were held.
func (l *psnLink) release() error {
	l.mu.Lock()
	h := l.held
	l.held = nil
	l.mu.Unlock()
	if len(h) == 0 {
		return nil
	}
	return l.Link.Send(h)
}

func (l *psnLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := make([]udp.Packet, 0, len(pkts))
	var p packet.Packet
	for _, up := range pkts {
		if err := p.Parse(up.Buf); err != nil {
			panic(fmt.Sprintf("transport sent an unparsable packet: %v", err))
		}
		w := wirePkt{op: p.BTH.Opcode(), psn: p.BTH.PSN(), ackReq: p.BTH.AckReq()}
		if p.AETH != nil {
			w.hasAETH, w.syn, w.msn = true, p.AETH.Syndrome(), p.AETH.MSN()
		}
		if l.drop != nil && l.drop(&p) {
			w.dropped = true
		} else if l.hold != nil && l.hold(&p) {
			c := up
			c.Buf = append([]byte(nil), up.Buf...)
			l.held = append(l.held, c)
		} else {
			keep = append(keep, up)
		}
		l.log = append(l.log, w)
	}
	if len(keep) == 0 {
		return nil
	}
	return l.Link.Send(keep)
}

func (l *psnLink) sent() []wirePkt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wirePkt(nil), l.log...)
}

// linkPair connects a and b over a fault-free MemNetwork through psnLinks
// (a's requests start at psnA, b's at psnB).
func linkPair(t *testing.T, o pairOpts, psnA, psnB uint32) (a, b *side, la, lb *psnLink) {
	t.Helper()
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
	la, lb = &psnLink{Wrap: udp.Wrap{Link: ra}}, &psnLink{Wrap: udp.Wrap{Link: rb}}
	a, b = sideOn(t, la, &o), sideOn(t, lb, &o)
	connect(t, a, b, addrB, psnA, psnB, &o)
	connect(t, b, a, addrA, psnB, psnA, &o)
	return a, b, la, lb
}

// buildAck returns an ACKNOWLEDGE packet for qpn with syndrome syn.
func buildAck(t *testing.T, qpn uint32, psn bth.PSN, syn aeth.Syndrome, msn uint32) []byte {
	t.Helper()
	var f packet.Fields
	f.BTH.Opcode = bth.RCAck
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qpn
	f.BTH.PSN = psn
	f.AETH.Syndrome = syn
	f.AETH.MSN = msn
	buf := make([]byte, 64)
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestPSNSeqNAKGoBackN drops one request packet (the second of a 4-packet
// WRITE, PSNs across the 24-bit wrap). The responder must send exactly one
// PSN sequence error NAK for the gap (naming the missing PSN) and drop the
// rest of the flight silently; the requester must go back to the NAK'd PSN
// and resend from there, in order, once.
func TestPSNSeqNAKGoBackN(t *testing.T) {
	const first = bth.PSN(0xfffffd)
	dropped := false
	a, b, la, lb := linkPair(t, pairOpts{mtu: MTU256, clock: manual(), retry: 3}, uint32(first), 0x40)
	la.drop = func(p *packet.Packet) bool {
		if !dropped && p.BTH.PSN() == first.Add(1) {
			dropped = true
			return true
		}
		return false
	}
	// WR 1: 4 packets (PSNs first..first+3); WRs 2-4: one packet each.
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

	// Requester: the original flight of 7 PSNs (one dropped), then the
	// go-back-N from first+1 to first+6, each once, in order.
	var psns []bth.PSN
	for _, w := range la.sent() {
		psns = append(psns, w.psn)
	}
	want := []bth.PSN{}
	for i := range 7 {
		want = append(want, first.Add(i))
	}
	for i := 1; i < 7; i++ {
		want = append(want, first.Add(i))
	}
	if fmt.Sprint(psns) != fmt.Sprint(want) {
		t.Fatalf("requester sent PSNs\n%v\nwant\n%v", psns, want)
	}
	sent := la.sent()
	if op := sent[7].op; op != bth.RCWriteMiddle {
		t.Fatalf("first retransmitted packet %v, want the WRITE's middle packet", op)
	}

	// Responder: exactly one NAK, PSN sequence error, for the missing PSN.
	var naks []wirePkt
	for _, w := range lb.sent() {
		if w.isNAK() {
			naks = append(naks, w)
		}
	}
	if len(naks) != 1 || naks[0].syn != aeth.NAK(aeth.NAKPSNSeqError) || naks[0].psn != first.Add(1) || naks[0].msn != 0 {
		t.Fatalf("responder NAKs %+v, want one PSN sequence error NAK for %v with MSN 0", naks, first.Add(1))
	}
	cb, ca := b.dev.Counters(), a.dev.Counters()
	// first+2 caused the NAK; first+3..first+6 were dropped silently.
	if cb.OutOfSeqRequest != 1 || cb.DuplicateRequest != 0 {
		t.Fatalf("responder out_of_seq_request %d duplicate_request %d, want 1 and 0", cb.OutOfSeqRequest, cb.DuplicateRequest)
	}
	if ca.RcvdSeqErr != 1 || ca.CompleterRetryErr != 1 || ca.RetransmittedPkts != 6 || ca.LocalAckTimeout != 0 {
		t.Fatalf("requester rcvd_seq_err %d completer_retry_err %d retransmitted_pkts %d local_ack_timeout_err %d, want 1 1 6 0",
			ca.RcvdSeqErr, ca.CompleterRetryErr, ca.RetransmittedPkts, ca.LocalAckTimeout)
	}
	if a.qp.State() != QPSRTS || b.qp.State() != QPSRTS {
		t.Fatalf("states %v %v", a.qp.State(), b.qp.State())
	}
}

// TestResponderSeqNAKOncePerGap feeds a responder requests by hand: a gap
// produces one NAK, later out-of-sequence packets none, the missing packet
// closes the gap, and a new gap produces a new NAK.
func TestResponderSeqNAKOncePerGap(t *testing.T) {
	a, b, _, lb := linkPair(t, pairOpts{clock: manual()}, 0x100, 0x200)
	_, dmr := b.buffer(t, 4096, memreg.AccessRemoteWrite)
	send := func(psn bth.PSN) {
		t.Helper()
		var f packet.Fields
		f.BTH.Opcode = bth.RCWriteOnly
		f.BTH.PKey = bth.DefaultPKey
		f.BTH.DestQP = b.qp.QPN()
		f.BTH.PSN = psn
		f.BTH.AckReq = true
		f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = dmr.IOVA(), dmr.RKey(), 8
		f.Payload = []byte("12345678")
		buf := make([]byte, 128)
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.dev.HandlePacket(buf[:n], addrA); err != nil {
			t.Fatal(err)
		}
	}
	_ = a
	base := bth.PSN(0x100)
	type resp struct {
		syn aeth.Syndrome
		psn bth.PSN
		msn uint32
	}
	responses := func() []resp {
		var out []resp
		for _, w := range lb.sent() {
			out = append(out, resp{w.syn, w.psn, w.msn})
		}
		return out
	}
	ack, nak := aeth.ACK(aeth.NoCreditLimit), aeth.NAK(aeth.NAKPSNSeqError)
	steps := []struct {
		psn  bth.PSN
		want []resp // responses this step adds
		oos  uint64 // out_of_seq_request after the step
	}{
		{base, []resp{{ack, base, 1}}, 0},
		{base.Add(2), []resp{{nak, base.Add(1), 1}}, 1}, // gap: one NAK for the expected PSN
		{base.Add(3), nil, 1},                           // silent
		{base.Add(5), nil, 1},                           // silent
		{base.Add(2), nil, 1},                           // still ahead of the gap: silent
		{base.Add(1), []resp{{ack, base.Add(1), 2}}, 1}, // gap closed
		{base.Add(3), []resp{{nak, base.Add(2), 2}}, 2}, // a new gap: a new NAK
		{base.Add(4), nil, 2},
		{base.Add(2), []resp{{ack, base.Add(2), 3}}, 2},
		{base, []resp{{ack, base.Add(2), 3}}, 2}, // duplicate: re-ACK of the last PSN
	}
	var want []resp
	for i, s := range steps {
		send(s.psn)
		want = append(want, s.want...)
		if got := responses(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("step %d (psn %v): responder sent\n%+v\nwant\n%+v", i, s.psn, got, want)
		}
		if c := b.dev.Counters(); c.OutOfSeqRequest != s.oos {
			t.Fatalf("step %d: out_of_seq_request %d, want %d", i, c.OutOfSeqRequest, s.oos)
		}
	}
	if c := b.dev.Counters(); c.DuplicateRequest != 1 {
		t.Fatalf("duplicate_request %d, want 1", c.DuplicateRequest)
	}
	if b.qp.State() != QPSRTS {
		t.Fatal(b.qp.State())
	}
}

// silentRequester returns a requester whose packets are recorded and
// dropped (nothing answers), with timers on a ManualClock; the caller
// injects responses with HandlePacket.
func silentRequester(t *testing.T) (a *side, la *psnLink, first bth.PSN, dmr *memreg.MR, smr *memreg.MR) {
	t.Helper()
	return silentRequesterWith(t, pairOpts{})
}

// silentRequesterWith is silentRequester with o's other options (its
// clock and retry count are set).
func silentRequesterWith(t *testing.T, o pairOpts) (a *side, la *psnLink, first bth.PSN, dmr *memreg.MR, smr *memreg.MR) {
	t.Helper()
	o.clock, o.retry = manual(), 3
	a, b, la, _ := linkPair(t, o, 0xfffffe, 0x10)
	la.drop = func(*packet.Packet) bool { return true }
	_, smr = a.buffer(t, 4096, 0)
	_, dmr = b.buffer(t, 4096, memreg.AccessRemoteWrite)
	return a, la, 0xfffffe, dmr, smr
}

// TestPSNSeqNAKInjected: a PSN sequence error NAK acknowledges everything
// before its PSN and restarts transmission at that PSN; a second NAK from
// the same (old) flight does not start a second go-back-N.
func TestPSNSeqNAKInjected(t *testing.T) {
	a, la, first, dmr, smr := silentRequester(t)
	for i := range 5 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(la.sent()); n != 5 {
		t.Fatalf("%d packets sent, want 5", n)
	}
	nak := buildAck(t, a.qp.QPN(), first.Add(2), aeth.NAK(aeth.NAKPSNSeqError), 2)
	if err := a.dev.HandlePacket(nak, addrB); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 2, time.Second)
	if wcs[0].WRID != 0 || wcs[1].WRID != 1 || wcs[0].Status != WCSuccess || wcs[1].Status != WCSuccess {
		t.Fatalf("completions %+v", wcs)
	}
	noWC(t, a.scq)
	psnsAfter := func(k int) []bth.PSN {
		var out []bth.PSN
		for _, w := range la.sent()[k:] {
			out = append(out, w.psn)
		}
		return out
	}
	if got, want := psnsAfter(5), []bth.PSN{first.Add(2), first.Add(3), first.Add(4)}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("retransmitted %v, want %v", got, want)
	}
	// The same NAK again (another packet of the old flight): counted, but no
	// second retransmission.
	if err := a.dev.HandlePacket(nak, addrB); err != nil {
		t.Fatal(err)
	}
	if n := len(la.sent()); n != 8 {
		t.Fatalf("%d packets after a repeated NAK, want 8", n)
	}
	c := a.dev.Counters()
	if c.RcvdSeqErr != 2 || c.CompleterRetryErr != 1 || c.RetransmittedPkts != 3 {
		t.Fatalf("rcvd_seq_err %d completer_retry_err %d retransmitted_pkts %d, want 2 1 3", c.RcvdSeqErr, c.CompleterRetryErr, c.RetransmittedPkts)
	}
	// The ACK of the retransmission completes the rest.
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(4), aeth.ACK(aeth.NoCreditLimit), 5), addrB); err != nil {
		t.Fatal(err)
	}
	wcs = waitWC(t, a.scq, 3, time.Second)
	for i, wc := range wcs {
		if wc.WRID != uint64(2+i) || wc.Status != WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	if a.qp.State() != QPSRTS {
		t.Fatal(a.qp.State())
	}
}

// TestNAKCodesCompleter injects each NAK code for the second of three
// outstanding WRs: the first completes successfully (the NAK acknowledges
// it), the second with the code's status, the third is flushed, the QP goes
// to ERR and nothing is retransmitted. A reserved NAK code (5..31) is a
// remote operation error, as rxe's check_ack has it for an unexpected NAK
// (it was a bad response error).
func TestNAKCodesCompleter(t *testing.T) {
	cases := []struct {
		code aeth.NAKCode
		want WCStatus
		str  string
	}{
		{aeth.NAKInvalidRequest, WCRemInvReqErr, "remote invalid request error"},
		{aeth.NAKRemoteAccessError, WCRemAccessErr, "remote access error"},
		{aeth.NAKRemoteOperationalError, WCRemOpErr, "remote operation error"},
		{aeth.NAKInvalidRDRequest, WCRemInvRDReqErr, "remote invalid RD request"},
		{5, WCRemOpErr, "remote operation error"}, // reserved codes
		{17, WCRemOpErr, "remote operation error"},
		{31, WCRemOpErr, "remote operation error"},
	}
	for _, c := range cases {
		for _, op := range []WROpcode{WRSend, WRWrite, WRRead} {
			for _, sr := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%v/sr=%v", c.code, op, sr), func(t *testing.T) {
					a, la, first, dmr, smr := silentRequesterWith(t, pairOpts{sr: sr})
					for i := range 3 {
						wr := SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 64*i, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
						if i == 1 {
							wr.Opcode = op
						}
						if err := a.qp.PostSend(wr); err != nil {
							t.Fatal(err)
						}
					}
					if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(1), aeth.NAK(c.code), 1), addrB); err != nil {
						t.Fatal(err)
					}
					wcs := waitWC(t, a.scq, 3, time.Second)
					wantOp := map[WROpcode]WCOpcode{WRSend: WCSend, WRWrite: WCRDMAWrite, WRRead: WCRDMARead}[op]
					if wcs[0].WRID != 0 || wcs[0].Status != WCSuccess {
						t.Errorf("first %+v", wcs[0])
					}
					if wcs[1].WRID != 1 || wcs[1].Status != c.want || wcs[1].Status.String() != c.str || wcs[1].Opcode != wantOp {
						t.Errorf("NAK'd WR: %+v (%v), want %v %v", wcs[1], wcs[1].Status, c.want, wantOp)
					}
					if wcs[2].WRID != 2 || wcs[2].Status != WCWRFlushErr {
						t.Errorf("third %+v, want flush", wcs[2])
					}
					if st := a.qp.State(); st != QPSErr {
						t.Errorf("state %v, want ERR", st)
					}
					if n := len(la.sent()); n != 3 {
						t.Errorf("%d packets sent, want 3 (no retransmission after a fatal NAK)", n)
					}
					if cnt := a.dev.Counters(); cnt.CompleterRetryErr != 0 || cnt.RcvdSeqErr != 0 {
						t.Errorf("completer_retry_err %d rcvd_seq_err %d", cnt.CompleterRetryErr, cnt.RcvdSeqErr)
					}
					noWC(t, a.scq)
				})
			}
		}
	}
}

// TestRemoteOperationalError: the responder cannot place a SEND (its
// receive WQE's region was deregistered after PostRecv): it NAKs with
// REMOTE_OPERATIONAL_ERROR and completes the receive WQE with a local
// protection error; the requester completes the SEND with "remote
// operation error"; both QPs end in ERR with everything else flushed.
func TestRemoteOperationalError(t *testing.T) {
	a, b, _, lb := linkPair(t, pairOpts{clock: manual()}, 0x500, 0x600)
	_, gone := b.buffer(t, 256, 0)
	_, ok := b.buffer(t, 256, 0)
	if err := b.qp.PostRecv(RecvWR{WRID: 10, SGEs: sge(gone, 0, 256)}, RecvWR{WRID: 11, SGEs: sge(ok, 0, 256)}); err != nil {
		t.Fatal(err)
	}
	if err := gone.Deregister(); err != nil {
		t.Fatal(err)
	}
	src, smr := a.buffer(t, 64, 0)
	fill(src, 5)
	if err := a.qp.PostSend(
		SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 64)},
		SendWR{WRID: 2, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 64)},
	); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 2, 5*time.Second)
	if wcs[0].WRID != 1 || wcs[0].Status != WCRemOpErr || wcs[0].Status.String() != "remote operation error" || wcs[0].Opcode != WCSend {
		t.Fatalf("requester: %+v (%v), want remote operation error", wcs[0], wcs[0].Status)
	}
	if wcs[1].WRID != 2 || wcs[1].Status != WCWRFlushErr {
		t.Fatalf("requester second: %+v, want flush", wcs[1])
	}
	if a.qp.State() != QPSErr {
		t.Fatalf("requester state %v", a.qp.State())
	}
	rwc := waitWC(t, b.rcq, 2, 5*time.Second)
	if rwc[0].WRID != 10 || rwc[0].Status != WCLocProtErr {
		t.Fatalf("responder: %+v (%v), want local protection error", rwc[0], rwc[0].Status)
	}
	if rwc[1].WRID != 11 || rwc[1].Status != WCWRFlushErr {
		t.Fatalf("responder second: %+v, want flush", rwc[1])
	}
	if b.qp.State() != QPSErr {
		t.Fatalf("responder state %v", b.qp.State())
	}
	var naks []wirePkt
	for _, w := range lb.sent() {
		if w.isNAK() {
			naks = append(naks, w)
		}
	}
	if len(naks) != 1 || naks[0].syn != aeth.NAK(aeth.NAKRemoteOperationalError) || naks[0].psn != 0x500 {
		t.Fatalf("responder NAKs %+v, want one REMOTE_OPERATIONAL_ERROR for 0x500", naks)
	}
	noWC(t, a.scq)
	noWC(t, b.rcq)
}

// TestSQEState: an RC QP never enters SQE (a send error takes it to ERR),
// and SQE cannot be requested with Modify from any state: verbs only lets
// the QP itself enter SQE, which for RC does not happen. The SQE -> RTS
// transition (present in the table for UD/UC-style recovery) is therefore
// unreachable for these QPs.
func TestSQEState(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{clock: manual()})
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	s := newSide(t, n, netip.MustParseAddr("192.0.2.9"), &o)
	try := func(qp *QP, from QPState) {
		t.Helper()
		before, _ := qp.Query()
		err := qp.Modify(&QPAttr{State: QPSSQE}, AttrState)
		if !errors.Is(err, ErrInvalidState) || !contains(err.Error(), from.String()+" -> SQE") {
			t.Fatalf("%v -> SQE: %v", from, err)
		}
		if after, _ := qp.Query(); after != before {
			t.Fatalf("%v -> SQE changed the QP: %+v -> %+v", from, before, after)
		}
	}
	try(s.qp, QPSReset)
	if err := s.qp.Modify(&QPAttr{State: QPSInit, Port: 1}, AttrState|AttrPort|AttrPKeyIndex|AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	try(s.qp, QPSInit)
	try(a.qp, QPSRTS)
	if err := a.qp.Modify(&QPAttr{State: QPSSQD}, AttrState); err != nil {
		t.Fatal(err)
	}
	try(a.qp, QPSSQD)
	if err := a.qp.Modify(&QPAttr{State: QPSRTS}, AttrState); err != nil {
		t.Fatal(err)
	}
	// A send error (wrong rkey) takes the RC QP to ERR, not SQE.
	_, smr := a.buffer(t, 8, 0)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: 0x1000, RKey: 0xdead00}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCRemAccessErr {
		t.Fatalf("%+v", wc)
	}
	if st := a.qp.State(); st != QPSErr {
		t.Fatalf("after a send error: %v, want ERR", st)
	}
	try(a.qp, QPSErr)
	// ERR -> RTS stays illegal (only RESET leaves ERR).
	if err := a.qp.Modify(&QPAttr{State: QPSRTS}, AttrState); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("ERR -> RTS: %v", err)
	}
}

// TestNAKOutsideWindowIgnored: a fatal NAK naming a PSN that was already
// acknowledged (stale) or never sent (bogus) changes nothing.
func TestNAKOutsideWindowIgnored(t *testing.T) {
	a, la, first, dmr, smr := silentRequester(t)
	for i := range 3 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first, aeth.ACK(aeth.NoCreditLimit), 1), addrB); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, time.Second)[0]; wc.WRID != 0 || wc.Status != WCSuccess {
		t.Fatalf("%+v", wc)
	}
	for _, psn := range []bth.PSN{first, first.Add(-1), first.Add(3), first.Add(100)} {
		for _, code := range []aeth.NAKCode{aeth.NAKInvalidRequest, aeth.NAKRemoteAccessError, aeth.NAKRemoteOperationalError, aeth.NAKPSNSeqError} {
			if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), psn, aeth.NAK(code), 1), addrB); err != nil {
				t.Fatal(err)
			}
		}
	}
	noWC(t, a.scq)
	if st := a.qp.State(); st != QPSRTS {
		t.Fatalf("state %v after stale/bogus NAKs", st)
	}
	if n := len(la.sent()); n != 3 {
		t.Fatalf("%d packets sent, want 3 (no retransmission)", n)
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(2), aeth.ACK(aeth.NoCreditLimit), 3), addrB); err != nil {
		t.Fatal(err)
	}
	if wcs := waitWC(t, a.scq, 2, time.Second); wcs[0].WRID != 1 || wcs[1].WRID != 2 || wcs[1].Status != WCSuccess {
		t.Fatalf("%+v", wcs)
	}
}

// TestFatalNAKDuringGoBackN: a remote access NAK for a retransmitted packet
// ends the go-back-N: that WR fails, the rest flush.
func TestFatalNAKDuringGoBackN(t *testing.T) {
	a, la, first, dmr, smr := silentRequester(t)
	for i := range 4 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(1), aeth.NAK(aeth.NAKPSNSeqError), 1), addrB); err != nil {
		t.Fatal(err)
	}
	if n := len(la.sent()); n != 7 {
		t.Fatalf("%d packets, want 4 + 3 retransmitted", n)
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(2), aeth.NAK(aeth.NAKRemoteAccessError), 2), addrB); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 4, time.Second)
	want := []WCStatus{WCSuccess, WCSuccess, WCRemAccessErr, WCWRFlushErr}
	for i, wc := range wcs {
		if wc.WRID != uint64(i) || wc.Status != want[i] {
			t.Fatalf("completion %d: %+v (%v), want %v", i, wc, wc.Status, want[i])
		}
	}
	if st := a.qp.State(); st != QPSErr {
		t.Fatal(st)
	}
}

// TestRemoteOperationalErrorMidMessage: the third SGE of a receive WQE is
// gone; the first two packets of a 3-packet SEND are placed, the third
// fails: REMOTE_OPERATIONAL_ERROR NAK for the third PSN, the requester's
// SEND fails with "remote operation error" (its first packets count as
// acknowledged, nothing is retransmitted).
func TestRemoteOperationalErrorMidMessage(t *testing.T) {
	a, b, la, lb := linkPair(t, pairOpts{mtu: MTU256, clock: manual()}, 0x900, 0xa00)
	var rsges []memreg.SGE
	var rviews [][]byte
	var mrs []*memreg.MR
	for range 3 {
		buf, mr := b.buffer(t, 256, 0)
		rsges = append(rsges, sge(mr, 0, 256)...)
		rviews = append(rviews, buf)
		mrs = append(mrs, mr)
	}
	if err := b.qp.PostRecv(RecvWR{WRID: 5, SGEs: rsges}); err != nil {
		t.Fatal(err)
	}
	if err := mrs[2].Deregister(); err != nil {
		t.Fatal(err)
	}
	src, smr := a.buffer(t, 700, 0)
	fill(src, 9)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 700)}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCRemOpErr {
		t.Fatalf("requester %+v (%v)", wc, wc.Status)
	}
	if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.WRID != 5 || wc.Status != WCLocProtErr {
		t.Fatalf("responder %+v (%v)", wc, wc.Status)
	}
	if !bytes.Equal(concat(rviews[:2]), src[:512]) {
		t.Fatal("the first two packets were not placed")
	}
	var naks []wirePkt
	for _, w := range lb.sent() {
		if w.isNAK() {
			naks = append(naks, w)
		}
	}
	if len(naks) != 1 || naks[0].syn != aeth.NAK(aeth.NAKRemoteOperationalError) || naks[0].psn != 0x902 {
		t.Fatalf("NAKs %+v", naks)
	}
	if n := len(la.sent()); n != 3 {
		t.Fatalf("requester sent %d packets, want 3", n)
	}
	if a.qp.State() != QPSErr || b.qp.State() != QPSErr {
		t.Fatalf("states %v %v", a.qp.State(), b.qp.State())
	}
}

// TestNAKBeyondUnansweredRead: responses come in order, so a PSN sequence
// NAK (or an ACK) beyond a READ whose response never arrived means that
// response was lost: the requester goes back to the READ (rxe:
// COMPST_ERROR_RETRY), completes nothing out of order, and the READ's
// response then completes everything.
func TestNAKBeyondUnansweredRead(t *testing.T) {
	for _, syn := range []aeth.Syndrome{aeth.NAK(aeth.NAKPSNSeqError), aeth.ACK(aeth.NoCreditLimit)} {
		t.Run(syn.String(), func(t *testing.T) {
			a, la, first, dmr, smr := silentRequester(t)
			if err := a.qp.PostSend(
				SendWR{WRID: 0, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
				SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 64, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
				SendWR{WRID: 2, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 64, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
			); err != nil {
				t.Fatal(err)
			}
			psn := first.Add(2)
			if syn.Type() == aeth.TypeACK {
				psn = first.Add(1)
			}
			if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), psn, syn, 2), addrB); err != nil {
				t.Fatal(err)
			}
			noWC(t, a.scq)
			want := []bth.PSN{first, first.Add(1), first.Add(2), first, first.Add(1), first.Add(2)}
			var got []bth.PSN
			for _, w := range la.sent() {
				got = append(got, w.psn)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("sent %v, want %v (go back to the READ)", got, want)
			}
			if c := a.dev.Counters(); c.CompleterRetryErr != 1 {
				t.Fatalf("completer_retry_err %d", c.CompleterRetryErr)
			}
			var f packet.Fields
			f.BTH.Opcode = bth.RCReadResponseOnly
			f.BTH.PKey = bth.DefaultPKey
			f.BTH.DestQP = a.qp.QPN()
			f.BTH.PSN = first
			f.AETH.MSN = 1
			f.Payload = []byte("abcdefgh")
			buf := make([]byte, 128)
			n, err := packet.Build(buf, &f)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.dev.HandlePacket(buf[:n], addrB); err != nil {
				t.Fatal(err)
			}
			if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first.Add(2), aeth.ACK(aeth.NoCreditLimit), 3), addrB); err != nil {
				t.Fatal(err)
			}
			wcs := waitWC(t, a.scq, 3, time.Second)
			for i, wc := range wcs {
				if wc.WRID != uint64(i) || wc.Status != WCSuccess {
					t.Fatalf("completion %d: %+v", i, wc)
				}
			}
		})
	}
}

// TestReservedAETHTypeDropped: an ACK whose AETH syndrome has the reserved
// type (binary 10) acknowledges nothing and fails nothing: it is dropped
// and counted as malformed (it was dropped without a count), and the
// outstanding WR completes normally once a real ACK comes.
func TestReservedAETHTypeDropped(t *testing.T) {
	a, _, first, dmr, smr := silentRequester(t)
	if err := a.qp.PostSend(SendWR{WRID: 7, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	before := a.dev.Counters().MalformedPkts
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first, aeth.Syndrome(2<<5), 1), addrB); err != nil {
		t.Fatal(err)
	}
	noWC(t, a.scq)
	if got := a.dev.Counters().MalformedPkts - before; got != 1 {
		t.Errorf("malformed_pkts +%d, want +1", got)
	}
	if st := a.qp.State(); st != QPSRTS {
		t.Errorf("state %v, want RTS", st)
	}
	if err := a.dev.HandlePacket(buildAck(t, a.qp.QPN(), first, aeth.ACK(0), 1), addrB); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 1, time.Second)
	if wcs[0].WRID != 7 || wcs[0].Status != WCSuccess {
		t.Errorf("after the real ACK: %+v", wcs[0])
	}
}
