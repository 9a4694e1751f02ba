package transport

import (
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
)

// respEnv is a responder (b) fed crafted requests from a's address.
type respEnv struct {
	t    *testing.T
	a, b *side
	lb   *psnLink
	psn  bth.PSN
	buf  []byte
	mr   *memreg.MR // remote write/read/atomic target, 4096 bytes
	rbuf []byte
	rmr  *memreg.MR // receive buffer, 4096 bytes
}

func newRespEnv(t *testing.T, access memreg.Access) *respEnv {
	o := pairOpts{clock: manual(), mtu: MTU1024, minRNR: 5}
	if access != 0 {
		o.access = access
	}
	a, b, _, lb := linkPair(t, o, 0x300, 0x1000)
	e := &respEnv{t: t, a: a, b: b, lb: lb, psn: 0x300}
	e.buf, e.mr = b.buffer(t, 4096, memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
	e.rbuf, e.rmr = b.buffer(t, 4096, 0)
	return e
}

// feed sends f (BTH.PSN filled from pos, the offset from the first PSN).
func (e *respEnv) feed(f packet.Fields, pos int) {
	e.t.Helper()
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = e.b.qp.QPN()
	f.BTH.PSN = e.psn.Add(pos)
	buf := make([]byte, 8192)
	n, err := packet.Build(buf, &f)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.b.dev.HandlePacket(buf[:n], addrA); err != nil {
		e.t.Fatal(err)
	}
}

func reqOnly(op bth.Opcode, payload []byte) packet.Fields {
	var f packet.Fields
	f.BTH.Opcode = op
	f.BTH.AckReq = true
	f.Payload = payload
	return f
}

// TestResponderErrorResponses feeds one bad (or borderline) request to a
// fresh responder and checks what it answers: opcode, syndrome (NAK code or
// RNR), the PSN, its state afterwards and the receive completion.
func TestResponderErrorResponses(t *testing.T) {
	type want struct {
		op     bth.Opcode
		syn    aeth.Syndrome
		state  QPState
		recvSt *WCStatus // status of the posted receive WQE's completion, if any
	}
	ack := aeth.ACK(aeth.NoCreditLimit)
	flush, locProt, locLen, remInv := WCWRFlushErr, WCLocProtErr, WCLocLenErr, WCRemInvReqErr
	cases := []struct {
		name   string
		access memreg.Access // QP access flags (0: all remote rights)
		recv   int           // receive WQE length (0: none posted, -1: deregistered region)
		send   func(e *respEnv)
		want   want
	}{
		{"write bad rkey", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCWriteOnly, make([]byte, 8))
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey()^0x100, 8
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKRemoteAccessError), QPSErr, nil}},
		{"write out of bounds", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCWriteOnly, make([]byte, 8))
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA()+4092, e.mr.RKey(), 8
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKRemoteAccessError), QPSErr, nil}},
		{"write zero length, rkey 0 (C9-88)", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCWriteOnly, nil)
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = 0, 0, 0
			e.feed(f, 0)
		}, want{bth.RCAck, ack, QPSRTS, nil}},
		{"read zero length, rkey 0 (C9-88)", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCReadRequest, nil)
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = 0, 0, 0
			e.feed(f, 0)
		}, want{bth.RCReadResponseOnly, ack, QPSRTS, nil}},
		{"write payload shorter than RETH length", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCWriteOnly, make([]byte, 8))
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 16
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, nil}},
		{"write without remote write right on the QP", memreg.AccessRemoteRead, 0, func(e *respEnv) {
			f := reqOnly(bth.RCWriteOnly, make([]byte, 8))
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 8
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, nil}},
		{"read without remote read right on the QP", memreg.AccessRemoteWrite, 0, func(e *respEnv) {
			f := reqOnly(bth.RCReadRequest, nil)
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 8
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, nil}},
		{"read longer than 2^31", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCReadRequest, nil)
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 1<<31+1
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, nil}},
		{"atomic without remote atomic right on the QP", memreg.AccessRemoteWrite, 0, func(e *respEnv) {
			f := reqOnly(bth.RCFetchAdd, nil)
			f.AtomicETH.VA, f.AtomicETH.RKey, f.AtomicETH.SwapAdd = e.mr.IOVA(), e.mr.RKey(), 1
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, nil}},
		{"misaligned atomic", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCFetchAdd, nil)
			f.AtomicETH.VA, f.AtomicETH.RKey, f.AtomicETH.SwapAdd = e.mr.IOVA()+4, e.mr.RKey(), 1
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, nil}},
		{"atomic bad rkey", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCCompareSwap, nil)
			f.AtomicETH.VA, f.AtomicETH.RKey = e.mr.IOVA(), e.mr.RKey()^0x100
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKRemoteAccessError), QPSErr, nil}},
		{"send middle without first", 0, 4096, func(e *respEnv) {
			f := reqOnly(bth.RCSendMiddle, make([]byte, 1024))
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, &flush}},
		{"send first then write only", 0, 4096, func(e *respEnv) {
			f := reqOnly(bth.RCSendFirst, make([]byte, 1024))
			f.BTH.AckReq = false
			e.feed(f, 0)
			g := reqOnly(bth.RCWriteOnly, make([]byte, 8))
			g.RETH.VA, g.RETH.RKey, g.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 8
			e.feed(g, 1)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, &remInv}},
		{"send first shorter than the MTU", 0, 4096, func(e *respEnv) {
			e.feed(reqOnly(bth.RCSendFirst, make([]byte, 1000)), 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, &remInv}},
		{"send last without payload", 0, 4096, func(e *respEnv) {
			f := reqOnly(bth.RCSendFirst, make([]byte, 1024))
			f.BTH.AckReq = false
			e.feed(f, 0)
			e.feed(reqOnly(bth.RCSendLast, nil), 1)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, &remInv}},
		{"write last without payload", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCWriteFirst, make([]byte, 1024))
			f.BTH.AckReq = false
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 1024
			e.feed(f, 0)
			e.feed(reqOnly(bth.RCWriteLast, nil), 1)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, nil}},
		{"send only longer than the MTU", 0, 4096, func(e *respEnv) {
			e.feed(reqOnly(bth.RCSendOnly, make([]byte, 1028)), 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, &remInv}},
		{"send longer than the receive WQE", 0, 100, func(e *respEnv) {
			e.feed(reqOnly(bth.RCSendOnly, make([]byte, 101)), 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, &locLen}},
		{"send into a deregistered region", 0, -1, func(e *respEnv) {
			e.feed(reqOnly(bth.RCSendOnly, make([]byte, 64)), 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKRemoteOperationalError), QPSErr, &locProt}},
		{"send with no receive WQE: RNR", 0, 0, func(e *respEnv) {
			e.feed(reqOnly(bth.RCSendOnly, make([]byte, 64)), 0)
		}, want{bth.RCAck, aeth.RNRNAK(5), QPSRTS, nil}},
		{"write with immediate, no receive WQE: RNR", 0, 0, func(e *respEnv) {
			f := reqOnly(bth.RCWriteOnlyImm, make([]byte, 8))
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 8
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.RNRNAK(5), QPSRTS, nil}},
		{"send with invalidate of an unknown rkey", 0, 4096, func(e *respEnv) {
			f := reqOnly(bth.RCSendOnlyInv, make([]byte, 8))
			f.IETHRKey = 0x123456
			e.feed(f, 0)
		}, want{bth.RCAck, aeth.NAK(aeth.NAKInvalidRequest), QPSErr, &remInv}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newRespEnv(t, c.access)
			switch {
			case c.recv > 0:
				if err := e.b.qp.PostRecv(RecvWR{WRID: 42, SGEs: sge(e.rmr, 0, c.recv)}); err != nil {
					t.Fatal(err)
				}
			case c.recv < 0:
				_, mr := e.b.buffer(t, 4096, 0)
				if err := e.b.qp.PostRecv(RecvWR{WRID: 42, SGEs: sge(mr, 0, 4096)}); err != nil {
					t.Fatal(err)
				}
				if err := mr.Deregister(); err != nil {
					t.Fatal(err)
				}
			}
			c.send(e)
			sent := e.lb.sent()
			if len(sent) != 1 {
				t.Fatalf("responder sent %d packets %+v, want 1", len(sent), sent)
			}
			r := sent[0]
			lastPSN := e.psn
			if strings.HasSuffix(c.name, "then write only") || strings.HasSuffix(c.name, "without payload") {
				lastPSN = e.psn.Add(1)
			}
			if r.op != c.want.op || r.syn != c.want.syn || r.psn != lastPSN {
				t.Fatalf("response %v %v psn %v, want %v %v psn %v", r.op, r.syn, r.psn, c.want.op, c.want.syn, lastPSN)
			}
			if st := e.b.qp.State(); st != c.want.state {
				t.Fatalf("responder state %v, want %v", st, c.want.state)
			}
			if c.want.recvSt != nil {
				wc := waitWC(t, e.b.rcq, 1, time.Second)[0]
				if wc.WRID != 42 || wc.Status != *c.want.recvSt {
					t.Fatalf("receive completion %+v (%v), want %v", wc, wc.Status, *c.want.recvSt)
				}
			}
			noWC(t, e.b.rcq)
		})
	}
}

// TestResponderNoRdAtomicResources: a QP whose responder keeps no
// READ/atomic resources (max_dest_rd_atomic 0, set with Modify) answers a
// READ or an atomic with NAK invalid request and goes to ERR, as rxe does
// (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ); it used to execute them as if it
// had one resource. A WRITE is still executed.
func TestResponderNoRdAtomicResources(t *testing.T) {
	cases := []struct {
		name string
		op   bth.Opcode
		want aeth.Syndrome
	}{
		{"read", bth.RCReadRequest, aeth.NAK(aeth.NAKInvalidRequest)},
		{"fetch-add", bth.RCFetchAdd, aeth.NAK(aeth.NAKInvalidRequest)},
		{"compare-swap", bth.RCCompareSwap, aeth.NAK(aeth.NAKInvalidRequest)},
		{"write", bth.RCWriteOnly, aeth.ACK(aeth.NoCreditLimit)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newScriptLink(addrB, addrA)
			o := pairOpts{clock: manual()}
			o.defaults()
			s := sideOn(t, l, &o)
			if err := s.qp.Init(o.access); err != nil {
				t.Fatal(err)
			}
			a := QPAttr{State: QPSRTR, AV: AddressVector{Addr: addrA}, PathMTU: MTU1024, DestQPN: peerQPN, RQPSN: 0x100, MaxDestRdAtomic: 0}
			if err := s.qp.Modify(&a, AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer); err != nil {
				t.Fatal(err)
			}
			buf, mr := s.buffer(t, 64, memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
			buf[0] = 1
			f := reqOnly(c.op, nil)
			switch c.op {
			case bth.RCReadRequest:
				f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = mr.IOVA(), mr.RKey(), 8
			case bth.RCWriteOnly:
				f.Payload = []byte{9, 9, 9, 9, 9, 9, 9, 9}
				f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = mr.IOVA()+8, mr.RKey(), 8
			default:
				f.AtomicETH.VA, f.AtomicETH.RKey, f.AtomicETH.Compare, f.AtomicETH.SwapAdd = mr.IOVA(), mr.RKey(), 1, 5
			}
			if err := s.dev.HandlePacket(build(t, s.qp, 0x100, f), addrA); err != nil {
				t.Fatal(err)
			}
			sent := l.sentPackets(t)
			if len(sent) != 1 {
				t.Fatalf("responder sent %d packets, want 1", len(sent))
			}
			if p := &sent[0]; p.BTH.Opcode() != bth.RCAck || p.BTH.PSN() != 0x100 || p.AETH.Syndrome() != c.want {
				t.Fatalf("responder sent %v psn %v, want an ACKNOWLEDGE %v for psn 0x100", p.BTH.Opcode(), p.BTH.PSN(), c.want)
			}
			wantState := QPSErr
			if c.op == bth.RCWriteOnly {
				wantState = QPSRTR
			}
			if st := s.qp.State(); st != wantState {
				t.Fatalf("state %v, want %v", st, wantState)
			}
			if buf[0] != 1 {
				t.Fatalf("the atomic changed memory: %v", buf[:8])
			}
		})
	}
}
