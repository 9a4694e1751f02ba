package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// sentMAD is a CM message a device sent, and when by its clock (since
// the test's start).
type sentMAD struct {
	msg cm.Message
	at  time.Duration
}

// peerlessDev makes a device at addrA on clk whose CM MADs go to out,
// not to the network: the test stands for the peer.
func peerlessDev(t *testing.T, clk *transport.ManualClock, out chan<- sentMAD) *transport.Device {
	t.Helper()
	n := memnet.NewMemNetwork(memnet.Faults{})
	l, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	capture := &filterLink{Wrap: udp.Wrap{Link: l}, drop: func(p *packet.Packet) bool {
		if p.BTH.DestQP() != 1 || len(p.Payload) != cm.MADSize {
			return false
		}
		if _, msg, err := cm.Decode(p.Payload); err == nil {
			select {
			case out <- sentMAD{msg, clk.Now().Sub(start)}:
			default:
				t.Error("the capture's channel is full")
			}
		}
		return true
	}}
	d, err := transport.NewDevice(capture, transport.DeviceConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// injectFrom hands m to manager m as if src had sent it, and returns once
// it is handled.
func injectFrom(t *testing.T, m *Manager, src netip.Addr, msg cm.Message) {
	t.Helper()
	mad := transport.MAD{Src: src, SrcQP: 1}
	h := cm.NewHeader(0, 1)
	if err := cm.Encode(mad.Data[:], &h, msg); err != nil {
		t.Fatal(err)
	}
	m.dispatch(&mad)
}

// TestMRAForeverBoundsDial: a peer (a listener in Next mode whose
// application never decides, or a hostile one) answers every REQ with an
// MRA asking for as long as the CM allows (service timeout 31: 2.4 h).
// Dial honours the first MRA as Linux's cm_mra_handler does — the REQ goes
// out again after ResponseTimeout plus the service timeout, capped at
// MRAWaitFactor response timeouts — counts the later ones as duplicates,
// and its retries run on: it fails with ErrTimeout, naming the MRA, within
// (MaxRetries+1) × (1+MRAWaitFactor) × ResponseTimeout of the test clock.
// Before, every MRA reset the retry count and bought 2.4 hours: the Dial
// never ended (here: still waiting after 25 s of clock, seven bounds).
func TestMRAForeverBoundsDial(t *testing.T) {
	clk := transport.NewManualClock(time.Unix(1_000_000, 0))
	out := make(chan sentMAD, 64)
	da := peerlessDev(t, clk, out)
	ma, err := managerFor(da)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{ResponseTimeout: 100 * time.Millisecond, MaxRetries: 3}
	done := make(chan error, 1)
	go func() {
		_, err := ma.Dial(context.Background(), netip.AddrPortFrom(addrB, 7710), &o)
		done <- err
	}()
	var first sentMAD
	select {
	case first = <-out:
	case <-time.After(10 * time.Second):
		t.Fatal("no REQ")
	}
	if _, ok := first.msg.(*cm.REQFields); !ok {
		t.Fatalf("first MAD %T, want a REQ", first.msg)
	}
	ma.mu.Lock() // Dial sends its REQ and arms its timer under the lock
	ma.mu.Unlock()

	bound := time.Duration(o.MaxRetries+1) * (1 + MRAWaitFactor) * o.ResponseTimeout
	step := o.ResponseTimeout / 4
	reqs, rejAt := 0, time.Duration(-1)
	handle := func(s sentMAD) {
		switch f := s.msg.(type) {
		case *cm.REQFields:
			reqs++
			// "Wait, my application is deciding": for every REQ.
			injectFrom(t, ma, addrB, &cm.MRAFields{LocalCommID: 0x77, RemoteCommID: f.LocalCommID,
				MessageMRAed: cm.KindREQ, ServiceTimeout: 31})
		case *cm.REJFields:
			if f.Reason == cm.RejTimeout {
				rejAt = s.at // the Dial gave up
			}
		}
	}
	handle(first)
	for i := 0; i < 1000 && rejAt < 0; i++ { // 1000 steps: 25 s of clock
		clk.Advance(step) // the timer's sends are captured within Advance
		for len(out) > 0 {
			handle(<-out)
		}
	}
	if rejAt < 0 {
		t.Fatalf("Dial still waiting after %v of MRAs (%d REQs sent); bound %v", clk.Now().Sub(time.Unix(1_000_000, 0)), reqs, bound)
	}
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Dial did not return after its REJ")
	}
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "MRA") {
		t.Errorf("Dial: %v, want ErrTimeout naming the MRA", err)
	}
	if reqs != o.MaxRetries+1 || rejAt > bound {
		t.Errorf("%d REQs, gave up at %v: want %d, within %v", reqs, rejAt, o.MaxRetries+1, bound)
	}
	// The MRA was honoured: without it the Dial ends at (MaxRetries+1)
	// response timeouts.
	if rejAt <= time.Duration(o.MaxRetries+1)*o.ResponseTimeout {
		t.Errorf("gave up at %v: the MRA bought no time", rejAt)
	}
	if s := StatsOf(da); s.Duplicates != uint64(reqs-1) {
		t.Errorf("duplicate MRAs counted %d, want %d", s.Duplicates, reqs-1)
	}
}

// TestMRAThenREPConnects: a listener whose application takes longer than
// the requester's retries would last answers the repeated REQ with an MRA
// (Next mode, the request not yet answered) and accepts later: the Dial
// waits as the MRA asks and connects. Its retries without the MRA end at
// (MaxRetries+1) × ResponseTimeout; the application accepts after that.
func TestMRAThenREPConnects(t *testing.T) {
	clk := transport.NewManualClock(time.Unix(1_000_000, 0))
	start := clk.Now()
	n := memnet.NewMemNetwork(memnet.Faults{})
	da := devWith(t, n, addrA, transport.DeviceConfig{Clock: clk})
	db := newDev(t, n, addrB, nil)
	o := Options{ResponseTimeout: time.Second, MaxRetries: 3}
	l, err := Listen(db, 7711, &ListenOptions{Options: o, HalfOpenTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ma, err := managerFor(da)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		c   *Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ma.Dial(context.Background(), netip.AddrPortFrom(addrB, 7711), &o)
		done <- result{c, err}
	}()
	r, err := l.Next(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ma.mu.Lock() // the Dial's timer is armed
	ma.mu.Unlock()
	mraed := func() bool {
		ma.mu.Lock()
		defer ma.mu.Unlock()
		for _, c := range ma.conns {
			if c.active && c.mraWait > 0 {
				return true
			}
		}
		return false
	}
	// The REQ again, which the listener answers with an MRA.
	clk.Advance(reqWait(&o)) // the REQ waits what it advertises
	for deadline := time.Now().Add(10 * time.Second); !mraed(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the listener's MRA did not reach the Dial")
		}
	}
	// The application decides after the requester's retries would
	// have run out without the MRA.
	clk.Advance(time.Duration(o.MaxRetries)*reqWait(&o) + o.ResponseTimeout/2)
	if el := clk.Now().Sub(start); el <= time.Duration(o.MaxRetries+1)*reqWait(&o) {
		t.Fatalf("the test accepts at %v, before the unextended retries end", el)
	}
	srv, err := r.Accept(ctxT(t, 10*time.Second), &o)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Dial did not return after the REP")
	}
	if res.err != nil {
		t.Fatalf("Dial of a slow accepter that sent an MRA: %v", res.err)
	}
	writeOver(t, res.c, srv, "accepted late")
	res.c.Close()
	srv.Close()
}

// TestMRAOnlyFromThePeer: an MRA from another address, or one that names
// a REP while the Dial waits for the answer to its REQ, buys no time (as
// cm_mra_handler checks the message MRAed); the Dial gives up after its
// unextended retries. Before, any MRA naming the Dial's ID reset them.
func TestMRAOnlyFromThePeer(t *testing.T) {
	clk := transport.NewManualClock(time.Unix(1_000_000, 0))
	out := make(chan sentMAD, 64)
	da := peerlessDev(t, clk, out)
	ma, err := managerFor(da)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{ResponseTimeout: 100 * time.Millisecond, MaxRetries: 3}
	done := make(chan error, 1)
	go func() {
		_, err := ma.Dial(context.Background(), netip.AddrPortFrom(addrB, 7712), &o)
		done <- err
	}()
	var first sentMAD
	select {
	case first = <-out:
	case <-time.After(10 * time.Second):
		t.Fatal("no REQ")
	}
	ma.mu.Lock()
	ma.mu.Unlock()
	rejAt := time.Duration(-1)
	handle := func(s sentMAD) {
		switch f := s.msg.(type) {
		case *cm.REQFields:
			other := netip.MustParseAddr("192.0.2.99")
			injectFrom(t, ma, other, &cm.MRAFields{LocalCommID: 0x77, RemoteCommID: f.LocalCommID,
				MessageMRAed: cm.KindREQ, ServiceTimeout: 31})
			injectFrom(t, ma, addrB, &cm.MRAFields{LocalCommID: 0x77, RemoteCommID: f.LocalCommID,
				MessageMRAed: cm.KindREP, ServiceTimeout: 31})
		case *cm.REJFields:
			rejAt = s.at
		}
	}
	handle(first)
	for i := 0; i < 1000 && rejAt < 0; i++ {
		clk.Advance(o.ResponseTimeout / 4)
		for len(out) > 0 {
			handle(<-out)
		}
	}
	if want := time.Duration(o.MaxRetries+1) * reqWait(&o); rejAt != want { // the REQ waits what it advertises
		t.Errorf("Dial gave up at %v, want %v (its own retries)", rejAt, want)
	}
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Dial did not return")
	}
	if !errors.Is(err, ErrTimeout) || strings.Contains(err.Error(), "MRA") {
		t.Errorf("Dial: %v, want ErrTimeout without an MRA", err)
	}
	if s := StatsOf(da); s.Unknown < uint64(2*(o.MaxRetries+1)) {
		t.Errorf("%d messages counted unknown, want the %d MRAs", s.Unknown, 2*(o.MaxRetries+1))
	}
}
