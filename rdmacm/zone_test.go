package rdmacm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestDialLinkLocalZone: a link-local server address given with its zone
// (fe80::2%eth0, as a user names it) connects: the peer's MADs arrive
// without a zone and must still match the connection; the SIDR
// resolution likewise.
func TestDialLinkLocalZone(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	llA, llB := netip.MustParseAddr("fe80::c0:1"), netip.MustParseAddr("fe80::c0:2")
	da, db := newDev(t, n, llA, nil), newDev(t, n, llB, nil)
	l, err := Listen(db, 7174, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		c   *Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctxT(t, 5*time.Second))
		acc <- res{c, err}
	}()
	c, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(llB.WithZone("eth0"), 7174), &fast)
	if err != nil {
		t.Fatalf("Dial with a zone: %v", err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	if c.RemoteAddr() != netip.AddrPortFrom(llB, 7174) || c.QP().State() != transport.QPSRTS {
		t.Errorf("client: peer %v, QP %v", c.RemoteAddr(), c.QP().State())
	}
	if r.c.RemoteAddr().Addr() != llA || r.c.QP().State() != transport.QPSRTS {
		t.Errorf("server: peer %v, QP %v", r.c.RemoteAddr(), r.c.QP().State())
	}
	c.Close()
	r.c.Close()

	pd, _ := db.AllocPD()
	cq, _ := db.CreateCQ(4)
	qp, _ := db.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	if err := qp.ReadyUD(UDPQKey, 0); err != nil {
		t.Fatal(err)
	}
	ul, err := ListenUD(db, 7175, qp, UDPQKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	p, err := ResolveUD(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(llB.WithZone("eth0"), 7175), &UDOptions{ResponseTimeout: 20 * time.Millisecond})
	if err != nil || p.Addr != llB || p.QPN != qp.QPN() {
		t.Errorf("ResolveUD with a zone: %+v %v", p, err)
	}
}
