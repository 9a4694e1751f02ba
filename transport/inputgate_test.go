package transport

import (
	"net/netip"
	"testing"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// TestInputFastGate: inputLocked's one test of the usual packet (an RC
// packet for an RC QP in RTR..SQE, not destroyed, default partition key,
// the peer's address as stored) lets through only what inputChecks' checks
// one by one would: a packet that fails any one condition of it is
// dropped and counted, or handed to its handler, as before. Each case
// changes one thing about a packet (or the QP) that is taken otherwise.
func TestInputFastGate(t *testing.T) {
	_, b, _ := newPair(t, pairOpts{})
	qp := b.qp
	orig := qp.attr.State
	setState := func(st QPState) func(undo bool) {
		return func(undo bool) {
			if undo {
				qp.attr.State = orig
			} else {
				qp.attr.State = st
			}
		}
	}
	type delta struct{ rcvd, wrongState, wrongPeer, cnp, mismatch uint64 }
	build := func(op bth.Opcode, pkey uint16) []byte {
		buf := make([]byte, 64)
		f := packet.Fields{}
		f.BTH.Opcode, f.BTH.PKey, f.BTH.DestQP, f.BTH.PSN = op, pkey, qp.QPN(), 0x654321 // an ACK of no outstanding PSN: ignored
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	ack := build(bth.RCAck, bth.DefaultPKey)
	for _, tc := range []struct {
		name string
		pkt  []byte
		src  netip.Addr
		qp   func(undo bool) // changes the QP for the case (undo: back)
		want delta
	}{
		{"usual", ack, addrA, nil, delta{rcvd: 1}},
		{"foreign pkey", build(bth.RCAck, 0x1234), addrA, nil, delta{wrongPeer: 1}},
		{"other source", ack, netip.AddrFrom4([4]byte{192, 0, 2, 99}), nil, delta{wrongPeer: 1}},
		{"peer IPv4-mapped", ack, netip.AddrFrom16(addrA.As16()), nil, delta{rcvd: 1}},
		{"CNP", build(bth.CNP, bth.DefaultPKey), addrA, nil, delta{rcvd: 1, cnp: 1}},
		{"INIT", ack, addrA, setState(QPSInit), delta{wrongState: 1}},
		{"ERR", ack, addrA, setState(QPSErr), delta{wrongState: 1}},
		{"SQE", ack, addrA, setState(QPSSQE), delta{rcvd: 1}},
		{"destroyed", ack, addrA, func(undo bool) { qp.destroyed = !undo }, delta{wrongState: 1}},
		{"UD QP", ack, addrA, func(undo bool) {
			if undo {
				qp.transport, qp.init.Type = bth.TransportRC, QPTypeRC
			} else {
				qp.transport, qp.init.Type = bth.TransportUD, QPTypeUD
			}
		}, delta{rcvd: 1, mismatch: 1}},
	} {
		var p packet.Packet
		if p.Decode(tc.pkt) != packet.FaultNone {
			t.Fatalf("%s: packet rejected", tc.name)
		}
		before := b.dev.Counters()
		qp.mu.Lock()
		if tc.qp != nil {
			tc.qp(false)
		}
		qp.inputLocked(&p, &udp.Packet{Buf: tc.pkt, Addr: tc.src}, false)
		if tc.qp != nil {
			tc.qp(true)
		}
		qp.mu.Unlock()
		a := b.dev.Counters()
		got := delta{a.RcvdPkts - before.RcvdPkts, a.WrongState - before.WrongState, a.WrongPeer - before.WrongPeer,
			a.RPCNPHandled + a.RPCNPIgnored - before.RPCNPHandled - before.RPCNPIgnored, a.TransportMismatch - before.TransportMismatch}
		if got != tc.want {
			t.Errorf("%s: counted %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
