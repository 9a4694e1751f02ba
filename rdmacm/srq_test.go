package rdmacm

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestListenWithSRQ: a server's connections take their receives from one
// SRQ (Options.SRQ) and complete them on one CQ: three clients' SENDs
// land in the SRQ's buffers, each completion naming its connection's QP.
func TestListenWithSRQ(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	pd, err := db.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	srq, err := db.CreateSRQ(pd, transport.SRQAttr{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := db.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8*64)
	mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if err := srq.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{mr.SGE(uint64(i*64), 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	o := fast
	o.SRQ, o.RecvCQ = srq, rcq
	l, err := Listen(db, 4791, &ListenOptions{Options: o})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := acceptAll(t, l)
	qpns := map[uint32]bool{}
	for i := range 3 {
		c, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 4791), &fast)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s := <-acc
		defer s.Close()
		if s.PD() != pd {
			t.Fatal("the connection's QP is not in the SRQ's PD")
		}
		qpns[s.QP().QPN()] = true
		msg := []byte{'c', byte('0' + i)}
		smr, err := c.PD().RegisterMR(msg, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer smr.Deregister()
		if err := c.QP().PostSend(transport.SendWR{Opcode: transport.WRSend, SGEs: []memreg.SGE{smr.SGE(0, 2)}}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[uint32]bool{}
	for range 3 {
		var wc [1]transport.WC
		if _, err := rcq.Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Status != transport.WCSuccess {
			t.Fatalf("receive: %+v %v", wc[0], err)
		}
		if !qpns[wc[0].QPN] || wc[0].ByteLen != 2 {
			t.Errorf("completion %+v: not one of the connections' QPs, or not 2 bytes", wc[0])
		}
		got[wc[0].QPN] = true
	}
	if len(got) != 3 {
		t.Errorf("completions from %d QPs, want 3", len(got))
	}
	if srq.Len() != 5 {
		t.Errorf("SRQ holds %d WRs, want 5 (3 of 8 taken)", srq.Len())
	}
	// Refused: an SRQ with a QP of the caller's, or in another PD.
	bad := fast
	bad.SRQ = srq
	other, _ := db.AllocPD()
	bad.PD = other
	if _, err := Listen(db, 4792, &ListenOptions{Options: bad}); err == nil || !strings.Contains(err.Error(), "Options.SRQ") {
		t.Errorf("Listen with an SRQ of another PD: %v", err)
	}
}
