package transport

import (
	"bytes"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
)

// TestSendDataMatchesBuild checks the request packets of SENDs and WRITEs,
// which requester.sendData writes field by field into the packet buffer:
// each must be exactly what packet.Build makes of its parsed fields
// (headers in wire order, pad count and zero pad, zero ICRC placeholder
// before the link fills it), with the opcode, immediate data or invalidated
// rkey, RETH, SE bit and payload of its work request, for every pad length
// and for first, middle and last packets.
func TestSendDataMatchesBuild(t *testing.T) {
	a, b, tap := tapPair(t, pairOpts{mtu: MTU256, sqDepth: 64, rqDepth: 64, cqDepth: 128}, false)
	src, smr := a.buffer(t, 4096, 0)
	fill(src, 11)
	_, dmr := b.buffer(t, 4096, memreg.AccessRemoteWrite)
	_, rmr := b.buffer(t, 4096, 0)
	for range 16 {
		if err := b.qp.PostRecv(RecvWR{SGEs: sge(rmr, 0, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	type msg struct {
		op    WROpcode
		n     int
		flags SendFlags
	}
	msgs := []msg{
		{WRWrite, 0, 0}, {WRWrite, 1, 0}, {WRWrite, 2, 0}, {WRWrite, 3, 0}, {WRWrite, 4, 0},
		{WRWriteImm, 5, 0}, {WRWriteImm, 0, 0}, {WRWrite, 513, 0}, {WRWriteImm, 300, 0},
		{WRSend, 3, SendSolicited}, {WRSend, 0, 0}, {WRSendImm, 600, SendSolicited}, {WRSendImm, 7, 0},
		{WRWrite, 6, SendSolicited}, {WRWriteImm, 9, SendSolicited}, {WRSend, 257, 0},
		{WRSendInv, 258, 0}, // last: the responder may refuse the rkey
	}
	var wrs []SendWR
	for i, m := range msgs {
		wrs = append(wrs, SendWR{WRID: uint64(i), Opcode: m.op, Flags: m.flags | SendSignaled,
			SGEs: sge(smr, i, m.n), RemoteAddr: dmr.IOVA() + uint64(i), RKey: dmr.RKey(),
			Imm: 0xa0b0c000 | uint32(i), InvRKey: 0x0d0e0f00 | uint32(i)})
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, len(msgs), 5*time.Second)
	var reqs [][]byte
	tap.mu.Lock()
	for _, p := range tap.pkts {
		if bth.Opcode(p[0]) != bth.RCAck {
			reqs = append(reqs, p)
		}
	}
	tap.mu.Unlock()
	i, k := 0, 0 // message, its packet
	psn := bth.PSN(0xfffffe)
	for _, raw := range reqs {
		if i == len(msgs) {
			t.Fatalf("more request packets than expected (%d messages)", len(msgs))
		}
		m := msgs[i]
		var p packet.Packet
		if err := p.Parse(raw); err != nil {
			t.Fatalf("message %d packet %d: %v", i, k, err)
		}
		f := p.Fields()
		want := make([]byte, len(raw))
		n, err := packet.Build(want, &f)
		if err != nil || n != len(raw) {
			t.Fatalf("message %d packet %d: Build of its fields: %d, %v (have %d bytes)", i, k, n, err, len(raw))
		}
		got := raw[:n-packet.ICRCSize]
		if !bytes.Equal(got, want[:n-packet.ICRCSize]) {
			t.Fatalf("message %d (%v, %d bytes) packet %d:\n got % x\nwant % x", i, m.op, m.n, k, got, want[:n-packet.ICRCSize])
		}
		if h := p.BTH; h.PKey() != bth.DefaultPKey || h.DestQP() != b.qp.QPN() || h.PSN() != psn ||
			h.MigReq() || h.TVer() != 0 || h.FECN() || h.BECN() {
			t.Fatalf("message %d packet %d: BTH % x (want P_Key %#x, QP %#x, PSN %v)", i, k, []byte(h), bth.DefaultPKey, b.qp.QPN(), psn)
		}
		psn = psn.Add(1)
		npk := max(1, (m.n+255)/256)
		first, last := k == 0, k == npk-1
		if op := dataOpcode(m.op, first, last); p.BTH.Opcode() != op {
			t.Fatalf("message %d packet %d: opcode %v, want %v", i, k, p.BTH.Opcode(), op)
		}
		pl := min(256, m.n-256*k)
		if !bytes.Equal(p.Payload, src[i+256*k:i+256*k+pl]) {
			t.Fatalf("message %d packet %d: payload differs", i, k)
		}
		if se := last && m.flags&SendSolicited != 0 && m.op != WRWrite; p.BTH.SolicitedEvent() != se {
			t.Fatalf("message %d packet %d: SE %v, want %v", i, k, p.BTH.SolicitedEvent(), se)
		}
		if (m.op == WRWrite || m.op == WRWriteImm) && first {
			if p.RETH == nil || p.RETH.VA() != dmr.IOVA()+uint64(i) || p.RETH.RKey() != dmr.RKey() || p.RETH.DMALength() != uint32(m.n) {
				t.Fatalf("message %d: RETH %v", i, p.RETH)
			}
		}
		if last && (m.op == WRWriteImm || m.op == WRSendImm) && (p.ImmDt == nil || p.ImmDt.Imm() != 0xa0b0c000|uint32(i)) {
			t.Fatalf("message %d: ImmDt %v", i, p.ImmDt)
		}
		if last && m.op == WRSendInv && (p.IETH == nil || p.IETH.RKey() != 0x0d0e0f00|uint32(i)) {
			t.Fatalf("message %d: IETH %v", i, p.IETH)
		}
		if last && !p.BTH.AckReq() {
			t.Fatalf("message %d: last packet without AckReq", i)
		}
		if k++; last {
			i, k = i+1, 0
		}
	}
	if i != len(msgs) {
		t.Fatalf("%d of %d messages on the wire", i, len(msgs))
	}
}

// TestSendGatherFailureQueuesNothing: a WRITE whose local memory was
// deregistered after PostSend completes with a local protection error and
// sends nothing (its packet, queued before its payload is gathered, is
// taken out again: dropLast), while the WRITE queued right before it in
// the same slab leaves intact and completes.
func TestSendGatherFailureQueuesNothing(t *testing.T) {
	a, b, tap := tapPair(t, pairOpts{}, false)
	src, good := a.buffer(t, 64, 0)
	fill(src, 5)
	_, bad := a.buffer(t, 64, 0)
	dst, dmr := b.buffer(t, 128, memreg.AccessRemoteWrite)
	qp := a.qp
	qp.mu.Lock()
	qp.schedTurn, qp.schedLeft = true, 0 // hold the requester (a turn with its quantum spent)
	qp.mu.Unlock()
	if err := qp.PostSend(
		SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(good, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		SendWR{WRID: 2, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(bad, 0, 64), RemoteAddr: dmr.IOVA() + 64, RKey: dmr.RKey()},
	); err != nil {
		t.Fatal(err)
	}
	if err := bad.Deregister(); err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	qp.schedTurn = false
	qp.req.progress()
	nout := qp.nout
	qp.flushOut()
	qp.mu.Unlock()
	if nout != 1 {
		t.Fatalf("%d packets queued, want 1 (the first WRITE's)", nout)
	}
	wcs := waitWC(t, a.scq, 2, 5*time.Second)
	if wcs[0].WRID != 1 || wcs[0].Status != WCSuccess || wcs[1].WRID != 2 || wcs[1].Status != WCLocProtErr {
		t.Fatalf("completions %+v, want WR 1 success, WR 2 local protection error", wcs)
	}
	if !bytes.Equal(dst[:64], src) {
		t.Fatal("the first WRITE's payload differs")
	}
	var reqs int
	for _, p := range tap.sent() {
		if p.BTH.Opcode() != bth.RCAck {
			reqs++
		}
	}
	if reqs != 1 {
		t.Fatalf("%d request packets sent, want 1", reqs)
	}
}

// TestSendGatherFailureKeepsAckCoalescing: a positive ACK queued by the
// responder, then a request packet whose gather fails (taken out again:
// dropLast), then another positive ACK in the same batch. With the
// failed packet gone, the queue is what it was, and the second ACK
// replaces the first (sendAck's coalescing) as it did before outPkt
// (d84258b: nothing was queued until the gather had succeeded); dropLast
// had left ackSlot cleared, and two ACKs went out. The failed WRITE is not
// at the head of the send queue (a WRITE before it awaits its ACK), so
// the QP stays in RTS and its responder goes on acknowledging.
func TestSendGatherFailureKeepsAckCoalescing(t *testing.T) {
	a, _, tap := tapPair(t, pairOpts{clock: manual()}, true)
	_, good := a.buffer(t, 64, 0)
	_, bad := a.buffer(t, 64, 0)
	qp := a.qp
	if err := qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(good, 0, 64), RemoteAddr: 0x1000, RKey: 7}); err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	qp.schedTurn, qp.schedLeft = true, 0 // hold the requester (a turn with its quantum spent)
	qp.mu.Unlock()
	if err := qp.PostSend(SendWR{WRID: 2, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(bad, 0, 64), RemoteAddr: 0x1040, RKey: 7}); err != nil {
		t.Fatal(err)
	}
	if err := bad.Deregister(); err != nil {
		t.Fatal(err)
	}
	qp.mu.Lock()
	qp.schedTurn = false
	psn := qp.resp.psn
	qp.resp.sendAck(aeth.ACK(aeth.NoCreditLimit), psn)
	qp.req.progress() // WRITE 2: gather fails, its packet is taken out
	qp.resp.sendAck(aeth.ACK(aeth.NoCreditLimit), psn.Add(1))
	nout, st := qp.nout, qp.attr.State
	qp.flushOut()
	qp.mu.Unlock()
	if st != QPSRTS {
		t.Fatalf("state %v, want RTS (the failed WRITE is not at the head)", st)
	}
	if nout != 1 {
		t.Fatalf("%d packets queued, want 1 (the second ACK replacing the first)", nout)
	}
	pk := tap.sent()
	last := pk[len(pk)-1]
	if last.BTH.Opcode() != bth.RCAck || last.BTH.PSN() != psn.Add(1) {
		t.Fatalf("last packet %v PSN %v, want the ACK of %v", last.BTH.Opcode(), last.BTH.PSN(), psn.Add(1))
	}
	if len(pk) != 2 { // WRITE 1 and one ACK
		t.Fatalf("%d packets sent, want 2 (WRITE 1, one ACK)", len(pk))
	}
}
