package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestAbandonedDialAnswersREP: a Dial given up before the REP sends a REJ
// with no remote communication ID, which a passive side on a shared
// address never gets (its steering program routes by that ID: api24 saw
// Request.Accept wait ~9.5 s for the half-open timeout). The REP that
// comes later is answered with a REJ naming it, so Accept fails at once.
// The first REJ is dropped here, as the steering drops it.
func TestAbandonedDialAnswersREP(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	var dropped int
	dropAnonREJ := func(l udp.Link) udp.Link {
		return &filterLink{Wrap: udp.Wrap{Link: l}, drop: func(p *packet.Packet) bool {
			if p.BTH.DestQP() != 1 || len(p.Payload) != 256 || cm.MAD(p.Payload).AttributeID() != cm.AttrREJ {
				return false
			}
			_, msg, err := cm.Decode(p.Payload)
			if rej, ok := msg.(*cm.REJFields); err == nil && ok && rej.RemoteCommID == 0 {
				dropped++
				return true
			}
			return false
		}}
	}
	da, db := newDev(t, n, addrA, dropAnonREJ), newDev(t, n, addrB, nil)
	slow := Options{ResponseTimeout: time.Second, MaxRetries: 15}
	l, err := Listen(db, 7603, &ListenOptions{Options: slow, HalfOpenTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dctx, dcancel := context.WithCancel(context.Background())
	dialed := make(chan error, 1)
	go func() {
		_, err := Dial(dctx, da, netip.AddrPortFrom(addrB, 7603), &slow)
		dialed <- err
	}()
	r, err := l.Next(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	dcancel()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial: %v, want context.Canceled", err)
	}
	start := time.Now()
	_, err = r.Accept(ctxT(t, 30*time.Second), &slow)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != cm.RejTimeout {
		t.Fatalf("Accept of the abandoned request: %v, want the dialer's REJ (timeout)", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Accept took %v: the REP was not answered", el)
	}
	if dropped != 1 {
		t.Errorf("dropped %d anonymous REJs, want 1 (the Dial's own)", dropped)
	}
}
