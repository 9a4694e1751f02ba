package rdmacm

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestPassiveAnswersFirstMessage: a server whose connections share one
// receive CQ (as an SRQ server's must) answers a client's first message
// on the QP it came on, whether or not the RTU has arrived: the passive
// QP is in RTS before its REP leaves, as Linux's rdma_accept leaves it.
// Before, it stayed in RTR until the RTU and the answer failed with
// ErrInvalidState (api24: 575 of 1030 connections of an RPC server). The
// RTUs are dropped here, so every first message arrives before one.
func TestPassiveAnswersFirstMessage(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	dropRTU := func(l udp.Link) udp.Link {
		return &filterLink{Wrap: udp.Wrap{Link: l}, drop: func(p *packet.Packet) bool {
			return p.BTH.DestQP() == 1 && len(p.Payload) == 256 && cm.MAD(p.Payload).AttributeID() == cm.AttrRTU
		}}
	}
	da, db := newDev(t, n, addrA, dropRTU), newDev(t, n, addrB, nil)
	pd, err := db.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := db.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Deregister()
	var mu sync.Mutex
	qps := map[uint32]*transport.QP{}
	o := fast
	o.PD, o.RecvCQ = pd, rcq
	o.Prepare = func(qp *transport.QP) error {
		mu.Lock()
		qps[qp.QPN()] = qp
		mu.Unlock()
		return qp.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{mr.SGE(0, 64)}})
	}
	l, err := Listen(db, 7500, &ListenOptions{Options: o})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acceptAll(t, l)
	for i := range 5 {
		c, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7500), &fast)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.QP().PostSend(transport.SendWR{Opcode: transport.WRSend}); err != nil {
			t.Fatal(err)
		}
		var wc [1]transport.WC
		if _, err := rcq.Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Status != transport.WCSuccess {
			t.Fatalf("round %d: first message: %+v %v", i, wc[0], err)
		}
		mu.Lock()
		qp := qps[wc[0].QPN]
		mu.Unlock()
		if err := qp.PostSend(transport.SendWR{Opcode: transport.WRSend}); err != nil {
			t.Fatalf("round %d: answer to the first message: %v (QP %v)", i, err, qp.State())
		}
		c.Close()
	}
}
