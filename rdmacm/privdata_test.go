package rdmacm

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestPrivateDataLimits: Listen refuses options whose PrivateData no REP
// can carry (196 bytes), naming the field, as Dial refuses more than the
// REQ's 56; the limits themselves are accepted.
func TestPrivateDataLimits(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	mb, err := NewManager(db)
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(7300)
	for _, tc := range []struct {
		name string
		size int
		call func(o Options) error
		ok   bool
	}{
		{"Listen 196", cm.REPPrivateDataSize, func(o Options) error {
			l, err := Listen(db, port, &ListenOptions{Options: o})
			if err == nil {
				l.Close()
			}
			return err
		}, true},
		{"Listen 197", cm.REPPrivateDataSize + 1, func(o Options) error {
			l, err := Listen(db, port, &ListenOptions{Options: o})
			if err == nil {
				l.Close()
			}
			return err
		}, false},
		{"Manager.Listen 197", cm.REPPrivateDataSize + 1, func(o Options) error {
			l, err := mb.Listen(port, &ListenOptions{Options: o})
			if err == nil {
				l.Close()
			}
			return err
		}, false},
		{"Dial 57", cm.CMAREQPrivateDataSize + 1, func(o Options) error {
			c, err := Dial(ctxT(t, time.Second), da, netip.AddrPortFrom(addrB, port), &o)
			if err == nil {
				c.Close()
			}
			return err
		}, false},
	} {
		port++
		o := fast
		o.PrivateData = make([]byte, tc.size)
		err := tc.call(o)
		if tc.ok {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "Options.PrivateData") {
			t.Errorf("%s: %v, want an error naming Options.PrivateData", tc.name, err)
		}
	}
}

// TestUnbuildableReplyRejected: a request the listener cannot reply to
// (options no REP carries, which Listen refuses now but Request.Accept
// can still be given) is rejected at once — consumer reject, as
// rdma_accept's failure path sends — and leaves nothing half-open: it
// used to be dropped without a word, and the dialer waited for its
// deadline.
func TestUnbuildableReplyRejected(t *testing.T) {
	for _, next := range []bool{false, true} {
		n := memnet.NewMemNetwork(memnet.Faults{})
		da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
		mb, err := NewManager(db)
		if err != nil {
			t.Fatal(err)
		}
		l, err := mb.Listen(7310, &ListenOptions{Options: fast})
		if err != nil {
			t.Fatal(err)
		}
		bad := fast
		bad.PrivateData = make([]byte, cm.REPPrivateDataSize+1)
		acc := make(chan error, 1)
		if next {
			go func() {
				r, err := l.Next(ctxT(t, 5*time.Second))
				if err == nil {
					_, err = r.Accept(ctxT(t, 5*time.Second), &bad)
				}
				acc <- err
			}()
		} else {
			l.opts.PrivateData = bad.PrivateData // as if Listen had let it through
			go func() {
				_, err := l.Accept(ctxT(t, 2*time.Second))
				acc <- err
			}()
		}
		t0 := time.Now()
		_, err = Dial(ctxT(t, 3*time.Second), da, netip.AddrPortFrom(addrB, 7310), &fast)
		var rej *RejectError
		if !errors.As(err, &rej) || rej.Reason != cm.RejConsumer {
			t.Fatalf("next=%v: Dial to a listener that cannot reply: %v after %v, want a consumer reject", next, err, time.Since(t0))
		}
		if next {
			if err := <-acc; err == nil || !strings.Contains(err.Error(), "Options.PrivateData") {
				t.Errorf("Request.Accept with 197 bytes of private data: %v", err)
			}
		}
		if got := mb.Stats().RejSent[cm.RejConsumer]; got != 1 {
			t.Errorf("next=%v: RejSent consumer %d, want 1", next, got)
		}
		mb.mu.Lock()
		half, conns := len(l.half), len(mb.conns)
		mb.mu.Unlock()
		if half != 0 || conns != 0 {
			t.Errorf("next=%v: %d requests half-open, %d connections left after the reject", next, half, conns)
		}
		l.Close()
		if !next {
			<-acc
		}
	}
}
