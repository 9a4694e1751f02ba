package rdmacm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestDialREJReasons: what a Dial does with each kind of REJ of its REQ,
// as Linux's CM does (cm_rej_handler, cm_acquire_rejected_id): no resources,
// consumer reject, invalid MTU, ... end it at once — no retry, whatever the
// reason; the error is a *RejectError naming the reason, with the peer's
// private data (rdma_cm's RDMA_CM_EVENT_REJECTED with status = the reason;
// ECONNREFUSED from a synchronous rdma_connect). A REJ "timeout" of the REQ
// names no connection a requester has (Linux looks it up by the sender's
// ID and the CA GUID in its ARI among connections that know their peer),
// so it is dropped and the Dial's retries run on to ErrTimeout.
func TestDialREJReasons(t *testing.T) {
	clk := transport.NewManualClock(time.Unix(1_000_000, 0))
	out := make(chan sentMAD, 64)
	da := peerlessDev(t, clk, out)
	ma, err := managerFor(da)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{ResponseTimeout: 100 * time.Millisecond, MaxRetries: 3}
	dial := func() (*cm.REQFields, <-chan error) {
		done := make(chan error, 1)
		go func() {
			_, err := ma.Dial(context.Background(), netip.AddrPortFrom(addrB, 7720), &o)
			done <- err
		}()
		select {
		case s := <-out:
			ma.mu.Lock() // the REQ's timer is armed
			ma.mu.Unlock()
			return s.msg.(*cm.REQFields), done
		case <-time.After(10 * time.Second):
			t.Fatal("no REQ")
		}
		return nil, nil
	}
	wait := func(done <-chan error) error {
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Dial did not return")
		}
		return nil
	}
	for _, reason := range []cm.RejectReason{cm.RejNoResources, cm.RejConsumer, cm.RejInvalidMTU, cm.RejNoQP} {
		req, done := dial()
		before := StatsOf(da).Retransmits
		// As Linux's passive side rejects a REQ it has not answered
		// (cm_format_rej in REQ_RCVD: no local ID).
		rej := &cm.REJFields{RemoteCommID: req.LocalCommID, MessageRejected: cm.KindREQ, Reason: reason}
		copy(rej.PrivateData[:], "why not")
		injectFrom(t, ma, addrB, rej)
		err := wait(done)
		var re *RejectError
		if !errors.As(err, &re) || re.Reason != reason || !errors.Is(err, ErrRejected) ||
			!strings.Contains(err.Error(), reason.String()) || !bytes.HasPrefix(re.PrivateData, []byte("why not")) {
			t.Errorf("%v: Dial: %v (%#v), want a *RejectError naming it with the private data", reason, err, re)
		}
		clk.Advance(time.Duration(o.MaxRetries+1) * o.ResponseTimeout)
		if n, r := len(out), StatsOf(da).Retransmits-before; n != 0 || r != 0 {
			t.Errorf("%v: %d MADs and %d retransmissions after the REJ, want none", reason, n, r)
		}
	}

	// A REJ "timeout" of the REQ, as our listener's half-open bound sends
	// it (with its ID and its CA GUID in the ARI): dropped.
	req, done := dial()
	rej := &cm.REJFields{LocalCommID: 0x77, RemoteCommID: req.LocalCommID, MessageRejected: cm.KindREQ,
		Reason: cm.RejTimeout, RejectedInfoLength: 8}
	putGUID(rej.ARI[:], guidOf(addrB))
	injectFrom(t, ma, addrB, rej)
	reqs := 1
	for i := 0; i < 100 && len(done) == 0; i++ {
		clk.Advance(o.ResponseTimeout / 4)
		for len(out) > 0 {
			if _, ok := (<-out).msg.(*cm.REQFields); ok {
				reqs++
			}
		}
	}
	if err := wait(done); !errors.Is(err, ErrTimeout) || reqs != o.MaxRetries+1 {
		t.Errorf("after a REJ timeout: Dial %v with %d REQs, want ErrTimeout after %d", err, reqs, o.MaxRetries+1)
	}
	ma.mu.Lock()
	remembered := len(ma.gaveUp)
	ma.mu.Unlock()
	if s := StatsOf(da); s.SpoofDropped != 0 || s.RejRecv[cm.RejTimeout] != 1 || remembered != 0 {
		t.Errorf("the REJ timeout of our REQ counted as a spoof %d times, received %d, remembered as a requester's %d (want 0, 1, 0)",
			s.SpoofDropped, s.RejRecv[cm.RejTimeout], remembered)
	}
}

// TestRequesterGaveUpREJ: a Linux requester that gives up before the REP
// (rdma_destroy_id in REQ_SENT: cm_destroy_id sends REJ timeout with its
// CA GUID in the ARI) says "other" in the REJ's "message rejected" field
// (cm_format_rej's state REQ_SENT), not "REQ" as ours does; Linux's CM
// finds the passive connection all the same (cm_acquire_rejected_id looks
// at the reason, not that field). The request ends at once instead of
// waiting for the application and then for an RTU that never comes; one
// from another address changes nothing; and one that arrives before its
// REQ is handled keeps that REQ from being served. Before, both were
// dropped: the application got a request of a requester long gone.
func TestRequesterGaveUpREJ(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	db := newDev(t, n, addrB, nil)
	l, err := Listen(db, 7721, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mb, err := managerFor(db)
	if err != nil {
		t.Fatal(err)
	}
	linux := netip.MustParseAddr("198.51.100.20")
	gaveUp := func(src netip.Addr, id uint32) *cm.REJFields {
		rej := &cm.REJFields{LocalCommID: id, MessageRejected: cm.KindOther, Reason: cm.RejTimeout, RejectedInfoLength: 8}
		putGUID(rej.ARI[:], guidOf(src))
		return rej
	}
	const id = 0x5150
	injectFrom(t, mb, linux, forgedREQ(7721, linux, addrB, id, 0x600))
	r, err := l.Next(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	injectFrom(t, mb, netip.MustParseAddr("198.51.100.21"), gaveUp(linux, id)) // not from the requester
	if s := StatsOf(db); s.Ended[CausePeerReject] != 0 {
		t.Fatalf("a REJ from another address ended the request")
	}
	injectFrom(t, mb, linux, gaveUp(linux, id))
	if s := StatsOf(db); s.Ended[CausePeerReject] != 1 || s.Conns != 0 {
		t.Fatalf("after the requester's REJ: ended by a REJ %d, connections %d (want 1, 0)", s.Ended[CausePeerReject], s.Conns)
	}
	_, err = r.Accept(ctxT(t, 5*time.Second), nil)
	var re *RejectError
	if !errors.As(err, &re) || re.Reason != cm.RejTimeout {
		t.Errorf("Accept of the abandoned request: %v, want the requester's REJ (timeout)", err)
	}

	// The REJ first, then the REQ it gives up (handled after answers).
	injectFrom(t, mb, linux, gaveUp(linux, id+1))
	injectFrom(t, mb, linux, forgedREQ(7721, linux, addrB, id+1, 0x601))
	mb.mu.Lock()
	queued := len(l.queue)
	mb.mu.Unlock()
	if s := StatsOf(db); queued != 0 || s.Conns != 0 {
		t.Errorf("the request of a requester that gave up was served: %d queued, %d connections", queued, s.Conns)
	}
}
