package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// acceptOnce starts l's Accept (and so its workers) and returns the one
// connection it accepts; the application then stops accepting.
func acceptOnce(t *testing.T, l *Listener) <-chan *Conn {
	ch := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(ctxT(t, 10*time.Second))
		if err != nil {
			t.Errorf("the first Accept: %v", err)
		}
		ch <- c
	}()
	return ch
}

// forgedPeer completes forged connections from src as the hostile probe
// does: a REQ each, then an RTU for each REP (found in the manager's
// state: the forged address has no device; hearREJs lets it see the
// REJs sent to it).
type forgedPeer struct {
	in   *madInjector
	mb   *Manager
	src  netip.Addr
	port uint16
	rtu  map[uint32]uint32 // comm IDs answered with an RTU: the listener's comm ID answered
	// direct: its MADs are handled in the sending goroutine (the
	// manager's dispatch), not queued at the device's GSI.
	direct bool

	mu   sync.Mutex
	rejs []cm.REJFields // sent to src, seen by hearREJs' tap, not yet taken by takeREJs
}

func newForgedPeer(t *testing.T, dev *transport.Device, src netip.Addr, port uint16) *forgedPeer {
	mb, err := managerFor(dev)
	if err != nil {
		t.Fatal(err)
	}
	return &forgedPeer{in: &madInjector{dev: dev}, mb: mb, src: src, port: port, rtu: map[uint32]uint32{}}
}

// hearREJs lets peers see the REJs n carries to their addresses (n's
// tap: the forged addresses have no link), as their requesters would
// receive them.
func hearREJs(n *memnet.MemNetwork, peers ...*forgedPeer) {
	n.SetTap(func(src, dst netip.Addr, _ uint16, _ uint8, payload []byte) {
		if len(payload) < transport.MADOffset+cm.MADSize {
			return
		}
		_, msg, err := cm.Decode(payload[transport.MADOffset : transport.MADOffset+cm.MADSize])
		rej, ok := msg.(*cm.REJFields)
		if err != nil || !ok {
			return
		}
		for _, p := range peers {
			if p.src == dst {
				p.mu.Lock()
				p.rejs = append(p.rejs, *rej)
				p.mu.Unlock()
			}
		}
	})
}

// takeREJs handles the REJs heard since the last call, as a requester
// does: a connection it completed with an RTU and the listener rejected
// since (shed while the RTU was on its way: the REJ of a REP; or its
// half-open bound) is forgotten, so that resend sends its REQ again.
// It returns how many it forgot.
func (p *forgedPeer) takeREJs() int {
	p.mu.Lock()
	rejs := p.rejs
	p.rejs = nil
	p.mu.Unlock()
	forgot := 0
	for _, r := range rejs {
		if local, ok := p.rtu[r.RemoteCommID]; ok && local == r.LocalCommID {
			delete(p.rtu, r.RemoteCommID)
			forgot++
		}
	}
	return forgot
}

// req sends the REQ of connection id.
func (p *forgedPeer) req(t *testing.T, id uint32) {
	p.send(t, id, forgedREQ(p.port, p.src, p.mb.dev.Addr(), id, 0x4000+id))
}

// send sends msg of connection id (its transaction ID).
func (p *forgedPeer) send(t *testing.T, id uint32, msg cm.Message) {
	if !p.direct {
		p.in.send(t, p.src, uint64(id), msg)
		return
	}
	mad := transport.MAD{Src: p.src, SrcQP: 1}
	h := cm.NewHeader(0, uint64(id))
	if err := cm.Encode(mad.Data[:], &h, msg); err != nil {
		t.Fatal(err)
	}
	p.mb.dispatch(&mad)
}

// answerREPs sends an RTU for every REP the listener has sent this peer
// so far, and returns how many it sent.
func (p *forgedPeer) answerREPs(t *testing.T) int {
	type rep struct{ id, local uint32 }
	var reps []rep
	p.mb.mu.Lock()
	for k, c := range p.mb.remote {
		if _, done := p.rtu[k.id]; k.addr == p.src && c.state == stREPSent && !done {
			reps = append(reps, rep{k.id, c.localID})
		}
	}
	p.mb.mu.Unlock()
	for _, r := range reps {
		p.rtu[r.id] = r.local
		p.send(t, r.id, &cm.RTUFields{LocalCommID: r.id, RemoteCommID: r.local})
	}
	return len(reps)
}

// resend sends again the REQs of the connections among ids that got
// no REP yet (shed unanswered, or waiting), as a requester does on its
// response timeout.
func (p *forgedPeer) resend(t *testing.T, ids []uint32) {
	for _, id := range ids {
		if _, done := p.rtu[id]; !done {
			p.req(t, id)
		}
	}
}

// established returns the listener's established connections to this
// peer: its comm ID to ours.
func (p *forgedPeer) established() map[uint32]uint32 {
	out := map[uint32]uint32{}
	p.mb.mu.Lock()
	defer p.mb.mu.Unlock()
	for k, c := range p.mb.remote {
		if k.addr == p.src && c.state == stEstablished {
			out[k.id] = c.localID
		}
	}
	return out
}

// flood sends n REQs (ids from first on), each handled as it is sent
// (direct), and answers every REP with an RTU until listener l has
// settled (settled); the deadline only bounds a hang. Before, it returned
// once no REP had come for a while (100 ms), too early on a loaded
// machine whose workers had not run yet.
func (p *forgedPeer) flood(t *testing.T, l *Listener, first, n uint32) {
	t.Helper()
	p.direct = true
	for i := uint32(0); i < n; i++ {
		p.req(t, first+i)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Millisecond) {
		p.answerREPs(t)
		if settled(l) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listener did not settle after %d requests from %v (%+v)", n, p.src, StatsOf(p.mb.dev))
		}
	}
}

// settled reports whether nothing is left to happen at listener l but
// by a peer's message or the application's Accept, with every request
// its peer sent handled: every request queued waits for a place in the
// accept queue, no worker sets one up, no answered request waits for
// its RTU, and every ended connection's release is done (each gives its
// place back last): the places held (l.owed) are those of the live
// answered connections.
func settled(l *Listener) bool {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range l.queue {
		if !l.waitsForPlaceLocked(c) {
			return false
		}
	}
	live := 0
	for _, c := range m.conns {
		if c.listener != l || !c.life.owed || !c.life.replied || c.ended {
			continue
		}
		if c.state == stREPSent {
			return false
		}
		live++
	}
	return l.owed == live
}

// waitQPs waits until dev holds want QPs (5 s at most) and returns how
// many it holds.
func waitQPs(dev *transport.Device, want int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := dev.Resources().QPs
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAcceptQueueBoundsQPs: a listener whose application accepts once
// and then stops, flooded by one client address that completes every
// handshake it is answered (found by a hostile-peer probe: the workers answered
// every request, each with a QP, until the device's QP table was full,
// and then every REQ to any listener of the device and every Dial from
// it failed with REJ consumer reject). The listener's device holds at
// most Backlog of those connections' QPs (the flooding address half of
// them); the flooder's extra Dials fail clearly (a REJ or ErrTimeout)
// rather than hang; a client from another address connects at once, and
// the application finds it when it accepts again.
//
// It runs twice: on a prompt network and on one that delays every packet
// by 160 ms, a handshake (REQ to RTU) of at least 320 ms, as a loaded
// machine's scheduling stretches it (up to 400 ms measured for the
// legitimate Dial under CPU load with -race). Before, the listener's
// HalfOpenTimeout was 300 ms: a handshake that took longer on the wall
// clock was rejected (timeout) after the client had its REP and sent its
// RTU, so the first Accept or the final one did not find its connection
// (the delayed run failed so every time; under load, now and then). The
// bound is not what this test measures: it is a hang guard now.
func TestAcceptQueueBoundsQPs(t *testing.T) {
	t.Run("prompt", func(t *testing.T) { testAcceptQueueBoundsQPs(t, 0) })
	t.Run("slow", func(t *testing.T) { testAcceptQueueBoundsQPs(t, 160*time.Millisecond) })
}

func testAcceptQueueBoundsQPs(t *testing.T, delay time.Duration) {
	const backlog = 8
	n := memnet.NewMemNetwork(memnet.Faults{Delay: delay})
	da := newDev(t, n, addrA, nil)
	db := devWith(t, n, addrB, transport.DeviceConfig{MaxQP: 32})
	addrC := netip.MustParseAddr("192.0.2.3")
	dc := newDev(t, n, addrC, nil)
	l, err := Listen(db, 7300, &ListenOptions{Options: fast, Backlog: backlog, HalfOpenTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first := acceptOnce(t, l)
	c0, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7300), &fast)
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	if c := <-first; c != nil {
		defer c.Close()
	}

	// The flood: 60 Dials at once from addrA, none accepted. Each ends
	// by its own retries (fast: 16 REQs 33.5 ms apart, and one MRA's
	// extra wait of at most MRAWaitFactor response timeouts: about a
	// second) or by a REJ; the context only tells a Dial that does not
	// end (before: 8 s, a bound on a loaded machine's speed too).
	const dials = 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []*Conn
	var failed, hung int
	for i := 0; i < dials; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Dial(ctxT(t, 60*time.Second), da, netip.AddrPortFrom(addrB, 7300), &fast)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				held = append(held, c)
			case errors.Is(err, context.DeadlineExceeded):
				hung++
			default:
				failed++
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	qps := db.Resources().QPs
	s := StatsOf(db)
	t.Logf("flood: %d connected, %d failed, %d hung; listener device QPs %d; accept queue full %d, dropped %d",
		len(held), failed, hung, qps, s.AcceptQueueFull, s.AcceptQueueDropped)
	if qps > backlog+1 {
		t.Errorf("the listener's device holds %d QPs: more than its backlog %d and the accepted connection", qps, backlog)
	}
	live := 0 // a Dial may return a connection the listener shed after the RTU left, ended
	for _, c := range held {
		select {
		case <-c.Done():
		default:
			live++
		}
	}
	if live > (backlog+1)/2 {
		t.Errorf("the flooding address holds %d connections (its share of backlog %d is %d)", live, backlog, (backlog+1)/2)
	}
	if hung != 0 || failed == 0 {
		t.Errorf("%d of the flood's Dials hung until their deadline, %d failed", hung, failed)
	}
	if s.AcceptQueueFull == 0 || s.AcceptQueueDropped == 0 {
		t.Errorf("AcceptQueueFull %d, AcceptQueueDropped %d", s.AcceptQueueFull, s.AcceptQueueDropped)
	}

	// A legitimate client from another address gets in: answered while
	// the application accepts nothing, so its request did not wait for a
	// place in the accept queue (one that waits gets no REP and no MRA:
	// its retries run out and Dial fails, ErrTimeout). Its response
	// timeout is ten times fast's, so that a loaded machine's slow
	// answer is not taken for that; no bound on the time it took
	// (before: legitBound, 3 s with -race, a timed assertion).
	patient := fast
	patient.ResponseTimeout = 10 * fast.ResponseTimeout
	start := time.Now()
	cc, err := Dial(ctxT(t, 60*time.Second), dc, netip.AddrPortFrom(addrB, 7300), &patient)
	if err != nil {
		t.Fatalf("legitimate Dial after the flood: %v after %v", err, time.Since(start))
	}
	defer cc.Close()
	t.Logf("legitimate Dial: %v", time.Since(start))
	// And the device still dials out.
	la, err := Listen(da, 7301, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	acceptAll(t, la)
	if c, err := Dial(ctxT(t, 5*time.Second), db, netip.AddrPortFrom(addrA, 7301), &fast); err != nil {
		t.Errorf("Dial from the listener's device after the flood: %v", err)
	} else {
		c.Close()
	}
	// The application accepts again: the legitimate client is among the
	// connections waiting.
	found := false
	for i := 0; i <= backlog && !found; i++ {
		c, err := l.Accept(ctxT(t, 2*time.Second))
		if err != nil {
			break
		}
		found = c.RemoteAddr().Addr() == addrC
		defer c.Close()
	}
	if !found {
		t.Error("Accept did not return the legitimate client's connection")
	}
}

// TestAcceptQueueFairness: one address that fills its share of the
// accept queue does not hold up another's requests, which the workers
// answer first when places come free.
func TestAcceptQueueFairness(t *testing.T) {
	const backlog = 4
	n := memnet.NewMemNetwork(memnet.Faults{})
	db := newDev(t, n, addrB, nil)
	l, err := Listen(db, 7302, &ListenOptions{Options: fast, Backlog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Accept(ctx) // starts the workers; the application accepts nothing
	heavy := newForgedPeer(t, db, netip.MustParseAddr("198.51.100.7"), 7302)
	heavy.flood(t, l, 1, 20)
	if got := len(heavy.established()); got != (backlog+1)/2 {
		t.Fatalf("the flooding address established %d connections, want its share %d", got, (backlog+1)/2)
	}
	light := newForgedPeer(t, db, netip.MustParseAddr("198.51.100.8"), 7302)
	light.flood(t, l, 1, 2)
	if got := len(light.established()); got != 2 {
		t.Fatalf("another address established %d connections, want 2", got)
	}
	if qps := db.Resources().QPs; qps != backlog {
		t.Errorf("device holds %d QPs, want %d", qps, backlog)
	}
}

// TestAcceptQueueEndedReleases: connections that wait for Accept and
// end — by keep-alive (a peer that answers no probe), or by the peer's
// DREQ — give their QPs back to the device at once, without the
// application accepting them (before: their goroutines waited to hand
// them to Accept, holding the QPs until the application accepted and
// closed each); the workers then answer the requests that waited. Accept
// hands them out later, ended.
func TestAcceptQueueEndedReleases(t *testing.T) {
	for _, how := range []string{"keepalive", "dreq"} {
		t.Run(how, func(t *testing.T) {
			const backlog = 8
			n := memnet.NewMemNetwork(memnet.Faults{})
			db := newDev(t, n, addrB, nil)
			lo := ListenOptions{Options: fast, Backlog: backlog, HalfOpenTimeout: 5 * time.Second}
			if how == "keepalive" {
				lo.KeepAlive, lo.KeepAliveTimeout = 50*time.Millisecond, 50*time.Millisecond
			}
			l, err := Listen(db, 7303, &lo)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			l.Accept(ctx) // starts the workers; the application accepts nothing
			var peers []*forgedPeer
			var ids []uint32
			for id := uint32(1); id <= 8; id++ {
				ids = append(ids, id)
			}
			for i := byte(0); i < 2; i++ {
				peers = append(peers, newForgedPeer(t, db, netip.AddrFrom4([4]byte{198, 51, 100, 10 + i}), 7303))
			}
			hearREJs(n, peers...)
			// The peers complete every handshake they are answered and
			// send again the requests that were not, or were rejected
			// after their RTU left (shed by a newer request handled
			// before the RTU: only the REJ tells); then they answer
			// no probe (keepalive) or disconnect (dreq). Each ended
			// connection gives its QP back, and the workers answer
			// the requests that waited, which end the same way: all 16
			// are established in turn, and their QPs go, without an
			// Accept. The loop ends on that state; its deadline only
			// bounds a hang.
			maxQPs, redials := 0, 0
			var s Stats
			var last time.Time
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
				for _, p := range peers {
					redials += p.takeREJs()
				}
				if time.Since(last) > 30*time.Millisecond {
					last = time.Now()
					for _, p := range peers {
						p.resend(t, ids)
					}
				}
				for _, p := range peers {
					p.answerREPs(t)
					if how == "dreq" {
						for id, local := range p.established() {
							p.in.send(t, p.src, uint64(id), &cm.DREQFields{LocalCommID: id, RemoteCommID: local, RemoteQPN: 0x4000 + id})
						}
					}
				}
				qps := db.Resources().QPs
				maxQPs = max(maxQPs, qps)
				if s = StatsOf(db); s.Established == 16 && qps == 0 {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			t.Logf("at most %d QPs; %d requests rejected after their RTU, sent again; %+v", maxQPs, redials, s)
			if qps := db.Resources().QPs; qps != 0 || s.Established != 16 {
				t.Fatalf("%d QPs held, %d of the 16 requests established, without an Accept (ended %v)", qps, s.Established, s.Ended)
			}
			if maxQPs > backlog {
				t.Errorf("the device held up to %d QPs (backlog %d)", maxQPs, backlog)
			}
			// Accept hands out the ones that ended in its queue, ended;
			// at most backlog of them are kept.
			got := 0
			done, cancel := context.WithCancel(context.Background())
			cancel() // what waits in the queue, no more
			for {
				c, err := l.Accept(done)
				if err != nil {
					break
				}
				got++
				select {
				case <-c.Done():
				default:
					t.Errorf("Accept handed out a live connection from %v", c.RemoteAddr())
				}
				if err := c.Close(); err != nil {
					t.Errorf("Close of an ended connection: %v", err)
				}
			}
			if s := StatsOf(db); got > backlog || got+int(s.AcceptQueueEvicted) != 16 {
				t.Errorf("Accept handed out %d ended connections, %d evicted (want 16 together, at most %d handed out)", got, s.AcceptQueueEvicted, backlog)
			}
			for deadline := time.Now().Add(60 * time.Second); db.Resources().CQs != 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if r := db.Resources(); r.QPs != 0 || r.CQs != 0 {
				t.Errorf("left: %+v", r)
			}
		})
	}
}

// TestAcceptQueueGoroutines: a flood of connections nobody accepts costs
// no goroutine each (before: one each, blocked handing its connection to
// Accept, besides its QP's watcher).
func TestAcceptQueueGoroutines(t *testing.T) {
	const backlog, flood = 8, 200
	n := memnet.NewMemNetwork(memnet.Faults{})
	db := newDev(t, n, addrB, nil)
	l, err := Listen(db, 7304, &ListenOptions{Options: fast, Backlog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Accept(ctx) // starts the workers; the application accepts nothing
	time.Sleep(20 * time.Millisecond)
	base := runtime.NumGoroutine()
	// Many addresses, so that the share per source does not do the
	// bounding here.
	for i := 0; i < flood/20; i++ {
		p := newForgedPeer(t, db, netip.AddrFrom4([4]byte{203, 0, 113, byte(1 + i)}), 7304)
		p.flood(t, l, 1, 20)
	}
	grown := runtime.NumGoroutine() - base
	s := StatsOf(db)
	t.Logf("goroutines: %d more after %d requests (%d established, QPs %d)", grown, flood, s.Established, db.Resources().QPs)
	if grown > 2*backlog+16 {
		t.Errorf("%d goroutines more after a flood of %d connections (backlog %d)", grown, flood, backlog)
	}
}

// TestFloodFromManyAddresses measures what a flood from many source
// addresses costs a listener whose application accepts nothing: 3 REQs
// from each of 762 addresses (every address of three /24s but ours), each
// handshake the listener answers completed with an RTU, as fast as the
// test injects them. Whatever the number of addresses, the manager knows
// at most 2×Backlog connections (Backlog half-open, Backlog answered and
// not accepted), the device holds at most Backlog of their QPs (and CQs:
// two each), the goroutines grow by at most 2×Backlog+16, and the
// manager's remembered-request tables and the listener's per-source counts
// stay within their caps.
func TestFloodFromManyAddresses(t *testing.T) {
	const backlog = 16
	n := memnet.NewMemNetwork(memnet.Faults{})
	db := newDev(t, n, addrB, nil)
	l, err := Listen(db, 7305, &ListenOptions{Options: fast, Backlog: backlog})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Accept(ctx) // starts the workers; the application accepts nothing
	time.Sleep(20 * time.Millisecond)
	mb, err := managerFor(db)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	base := runtime.NumGoroutine()
	res0 := db.Resources()

	in := &madInjector{dev: db}
	var srcs []netip.Addr
	for _, p := range [][3]byte{{192, 0, 2}, {198, 51, 100}, {203, 0, 113}} {
		for h := 1; h < 255; h++ {
			if a := netip.AddrFrom4([4]byte{p[0], p[1], p[2], byte(h)}); a != addrB {
				srcs = append(srcs, a)
			}
		}
	}
	var maxConns, maxQPs, maxCQs, maxG, maxTables int
	rtu := map[remoteKey]bool{}
	// answer completes every handshake answered so far and samples.
	answer := func() int {
		type rep struct {
			k     remoteKey
			local uint32
		}
		var reps []rep
		mb.mu.Lock()
		for k, c := range mb.remote {
			if c.state == stREPSent && !rtu[k] {
				reps = append(reps, rep{k, c.localID})
			}
		}
		maxConns = max(maxConns, len(mb.conns))
		maxTables = max(maxTables, len(mb.gaveUp)+len(mb.shedIDs)+len(mb.abandoned)+len(l.perSrc)+len(l.owedBy))
		mb.mu.Unlock()
		for _, r := range reps {
			rtu[r.k] = true
			in.send(t, r.k.addr, uint64(r.k.id), &cm.RTUFields{LocalCommID: r.k.id, RemoteCommID: r.local})
		}
		res := db.Resources()
		maxQPs = max(maxQPs, res.QPs-res0.QPs)
		maxCQs = max(maxCQs, res.CQs-res0.CQs)
		maxG = max(maxG, runtime.NumGoroutine()-base)
		return len(reps)
	}
	sent := 0
	for round := uint32(1); round <= 3; round++ {
		for i, a := range srcs {
			id := round<<16 | uint32(i)
			// A QPN of its own each: a REQ from a QP with a
			// connection still known replaces that connection
			// (the stale rule), which is not measured here.
			in.send(t, a, uint64(id), forgedREQ(7305, a, addrB, id, id))
			sent++
			if i%16 == 0 {
				answer()
			}
		}
	}
	// Until the accept queue is full of established connections and the
	// listener has settled (the deadline only bounds a hang; before, 100
	// ms without a REP ended this wait, too early on a loaded machine).
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		answer()
		if StatsOf(db).Established >= backlog && settled(l) {
			break
		}
	}
	runtime.GC()
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	s := StatsOf(db)
	t.Logf("%d REQs from %d addresses: at most %d connections known, %d QPs, %d CQs, %d goroutines more, %d table entries; "+
		"heap in use %+d KiB; established %d, shed %d, accept queue full %d, dropped at the GSI %d",
		sent, len(srcs), maxConns, maxQPs, maxCQs, maxG, maxTables, (int64(ms1.HeapInuse)-int64(ms0.HeapInuse))/1024,
		s.Established, s.Shed, s.AcceptQueueFull, db.Counters().MADDropQueueFull)
	if s.Established < backlog {
		t.Fatalf("only %d connections established: the flood did not fill the accept queue", s.Established)
	}
	if maxConns > 2*backlog || maxQPs > backlog || maxCQs > 2*backlog || maxG > 2*backlog+16 ||
		maxTables > 256+1024+2*backlog {
		t.Errorf("bounds exceeded: %d connections (max %d), %d QPs (max %d), %d CQs (max %d), %d goroutines (max %d), %d table entries",
			maxConns, 2*backlog, maxQPs, backlog, maxCQs, 2*backlog, maxG, 2*backlog+16, maxTables)
	}
}

// TestAcceptQueuePlaceHeldWhileSettingUp: a request that ends while one
// of Accept's workers sets it up (its QP created, its REP not yet sent:
// the requester gave up, or it was shed) keeps its place in the accept
// queue until the worker has released its QP; only then may another
// worker create one. Before, the place came free at the end, with the QP
// still there, and up to Backlog+acceptWorkers of the listener's QPs
// could exist at once (seen by TestFloodFromManyAddresses: 17 with a
// Backlog of 16).
func TestAcceptQueuePlaceHeldWhileSettingUp(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	db := newDev(t, n, addrB, nil)
	mb, err := managerFor(db)
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddr("198.51.100.30")
	const id = 0x31
	type seen struct{ owed, qps int }
	during := make(chan seen, 4)
	var l *Listener
	o := fast
	o.Prepare = func(qp *transport.QP) error {
		// The requester gives up while its QP is being set up.
		injectFrom(t, mb, src, &cm.REJFields{LocalCommID: id, MessageRejected: cm.KindREQ, Reason: cm.RejTimeout})
		mb.mu.Lock()
		owed := l.owed
		mb.mu.Unlock()
		during <- seen{owed, db.Resources().QPs}
		return nil
	}
	l, err = Listen(db, 7306, &ListenOptions{Options: o, Backlog: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Accept(ctx) // starts the workers; the application accepts nothing
	injectFrom(t, mb, src, forgedREQ(7306, src, addrB, id, 0x700))
	var s seen
	select {
	case s = <-during:
	case <-time.After(10 * time.Second):
		t.Fatal("no worker set the request up")
	}
	if s.qps != 1 || s.owed < s.qps {
		t.Errorf("after the request ended during its set-up: %d of the accept queue's places held, %d QPs (want the place held while the QP exists)", s.owed, s.qps)
	}
	// The worker releases the QP and then the place.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mb.mu.Lock()
		owed := l.owed
		mb.mu.Unlock()
		if owed == 0 && db.Resources().QPs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the worker's release: %d places held, %d QPs", owed, db.Resources().QPs)
		}
	}
}

// TestAcceptQueueAnsweredKeptForNewer: what left one of the 16 requests
// of TestAcceptQueueEndedReleases unestablished in a loaded CI run
// (Unknown:1, one REJ "no resources" sent). With the backlog full of
// answered requests (REP sent, waiting for the RTU), a newer request
// from the source that holds the most shed that source's oldest
// answered one, rejected (REJ of the REP, no resources) — while its
// requester's RTU was on its way: here the RTU is handled just after the
// newer request, as a loaded manager handles an RTU that came in behind
// it. A client that reconnects in a loop lost the attempt about to
// complete to its next one. Now the newer request is dropped unanswered
// (BacklogDropped), the RTU establishes the answered one, and the newer
// request, sent again once the application has accepted, gets in.
func TestAcceptQueueAnsweredKeptForNewer(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	db := newDev(t, n, addrB, nil)
	l, err := Listen(db, 7307, &ListenOptions{Options: fast, Backlog: 2, HalfOpenTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Accept(ctx) // starts the workers; the application accepts nothing
	a := newForgedPeer(t, db, netip.MustParseAddr("198.51.100.40"), 7307)
	b := newForgedPeer(t, db, netip.MustParseAddr("198.51.100.41"), 7307)
	hearREJs(n, a, b)
	// answered waits until the workers have sent p's request id its REP
	// and returns the listener's comm ID for it.
	answered := func(p *forgedPeer, id uint32) uint32 {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			p.mb.mu.Lock()
			c := p.mb.remote[remoteKey{p.src, id}]
			var local uint32
			if c != nil && c.state == stREPSent {
				local = c.localID
			}
			p.mb.mu.Unlock()
			if local != 0 {
				return local
			}
		}
		t.Fatalf("request %d from %v not answered (%+v)", id, p.src, StatsOf(db))
		return 0
	}
	a.req(t, 1)
	b.req(t, 1)
	first := answered(a, 1)
	answered(b, 1)
	before := StatsOf(db)

	// A's request 2, then A's RTU of request 1, in that order.
	injectFrom(t, a.mb, a.src, forgedREQ(7307, a.src, addrB, 2, 0x4000+2))
	a.rtu[1] = first
	injectFrom(t, a.mb, a.src, &cm.RTUFields{LocalCommID: 1, RemoteCommID: first})
	s := StatsOf(db)
	if s.BacklogDropped-before.BacklogDropped != 1 || s.Shed != before.Shed || s.Established-before.Established != 1 {
		t.Errorf("dropped %d, shed %d, established %d: want the newer request dropped and the answered one established by its RTU",
			s.BacklogDropped-before.BacklogDropped, s.Shed-before.Shed, s.Established-before.Established)
	}
	a.mu.Lock()
	rejs := append([]cm.REJFields(nil), a.rejs...)
	a.mu.Unlock()
	if len(rejs) != 0 {
		t.Fatalf("REJs to the requester: %+v; want none", rejs)
	}
	if a.established()[1] != first {
		t.Fatalf("A's request 1 not established by its RTU: %v", a.established())
	}

	// B's request completes, and the application accepts both (A's
	// place in the accept queue comes free); then A sends request 2
	// again, and it is answered and established.
	b.answerREPs(t)
	for deadline := time.Now().Add(10 * time.Second); len(a.established())+len(b.established()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("established: %v from A, %v from B; want A's request 1 and B's 1", a.established(), b.established())
		}
	}
	for i := 0; i < 2; i++ {
		c, err := l.Accept(ctx) // ctx is done: what waits in the queue
		if err != nil {
			t.Fatalf("Accept of the established connection %d: %v", i+1, err)
		}
		defer c.Close()
	}
	a.resend(t, []uint32{2})
	second := answered(a, 2)
	a.answerREPs(t)
	for deadline := time.Now().Add(10 * time.Second); a.established()[2] != second; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("request 2 sent again after it was dropped: not established (%+v)", StatsOf(db))
		}
	}
	if got := len(a.established()) + len(b.established()); got != 3 {
		t.Errorf("%d connections established, want 3", got)
	}
}
