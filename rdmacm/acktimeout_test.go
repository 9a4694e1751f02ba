package rdmacm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestAcceptOwnACKTimeout: an Accept's QP takes the REQ's local ACK
// timeout (14 here) unless Options.OwnACKTimeout says its Retry.Timeout
// (20) wins, as rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT) on a passive
// rdma_cm ID does in Linux (rdma_init_qp_attr) — what ucmatose -a does on
// a server. Before, the server's own timeout was always replaced.
func TestAcceptOwnACKTimeout(t *testing.T) {
	for _, own := range []bool{false, true} {
		n := memnet.NewMemNetwork(memnet.Faults{})
		da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
		l, err := Listen(db, 7750, &ListenOptions{Options: fast})
		if err != nil {
			t.Fatal(err)
		}
		accepted := make(chan *Conn, 1)
		go func() {
			r, err := l.Next(ctxT(t, 10*time.Second))
			if err != nil {
				t.Error(err)
				accepted <- nil
				return
			}
			o := fast
			o.Retry = &transport.Retry{Timeout: 20, RetryCnt: 7, RNRRetry: 7}
			o.OwnACKTimeout = own
			c, err := r.Accept(ctxT(t, 10*time.Second), &o)
			if err != nil {
				t.Error(err)
			}
			accepted <- c
		}()
		od := fast
		od.Retry = &transport.Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 7}
		cc, err := Dial(ctxT(t, 10*time.Second), da, netip.AddrPortFrom(addrB, 7750), &od)
		if err != nil {
			t.Fatal(err)
		}
		srv := <-accepted
		if srv == nil {
			t.FailNow()
		}
		want := uint8(14)
		if own {
			want = 20
		}
		a, err := srv.QP().Query()
		if err != nil {
			t.Fatal(err)
		}
		if a.Timeout != want {
			t.Errorf("OwnACKTimeout %v: the server's QP has ACK timeout %d, want %d", own, a.Timeout, want)
		}
		cc.Close()
		srv.Close()
		l.Close()
	}
}

// TestRNRRetryCrossesOver: each side's Options.Retry.RNRRetry travels to
// the peer (in the REQ, in the REP) and sets the peer's QP, as in Linux's
// CM (cm_req_handler and cm_rep_handler take rnr_retry_count from the
// message): the Dial's QP retries RNR NAKs as often as the listener asked,
// not as its own Options say. The Options.Retry doc says so.
func TestRNRRetryCrossesOver(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	ol := fast
	ol.Retry = &transport.Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 2}
	l, err := Listen(db, 7751, &ListenOptions{Options: ol})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(ctxT(t, 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	od := fast
	od.Retry = &transport.Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 5}
	cc, err := Dial(ctxT(t, 10*time.Second), da, netip.AddrPortFrom(addrB, 7751), &od)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	srv := <-accepted
	if srv == nil {
		t.FailNow()
	}
	defer srv.Close()
	ca, err := cc.QP().Query()
	if err != nil {
		t.Fatal(err)
	}
	sa, err := srv.QP().Query()
	if err != nil {
		t.Fatal(err)
	}
	if ca.RNRRetry != 2 || sa.RNRRetry != 5 {
		t.Errorf("rnr_retry: dialer's QP %d (want the listener's 2), listener's QP %d (want the dialer's 5)", ca.RNRRetry, sa.RNRRetry)
	}
}
