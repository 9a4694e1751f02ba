package rdmacm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

var (
	addrA = netip.MustParseAddr("192.0.2.1")
	addrB = netip.MustParseAddr("192.0.2.2")
)

// filterLink drops the packets drop says so, and counts them.
type filterLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	drop     func(p *packet.Packet) bool
	dropped  atomic.Int64
}

func (l *filterLink) Send(pkts []udp.Packet) error {
	keep := pkts[:0:0]
	for _, p := range pkts {
		var pk packet.Packet
		if pk.Parse(p.Buf) == nil && l.drop(&pk) {
			l.dropped.Add(1)
			continue
		}
		keep = append(keep, p)
	}
	if len(keep) == 0 {
		return nil
	}
	return l.Link.Send(keep)
}

func newDev(t *testing.T, n *memnet.MemNetwork, a netip.Addr, wrap func(udp.Link) udp.Link) *transport.Device {
	t.Helper()
	l, err := n.Link(a)
	if err != nil {
		t.Fatal(err)
	}
	var link udp.Link = l
	if wrap != nil {
		link = wrap(l)
	}
	d, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var fast = Options{ResponseTimeout: 20 * time.Millisecond, MaxRetries: 15}

// TestDialAccept: a connection through the CM carries private data both
// ways and then an RDMA WRITE; closing it from the active side ends the
// passive side too.
func TestDialAccept(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	lo := ListenOptions{Options: fast}
	lo.PrivateData = []byte("from the server")
	l, err := Listen(db, 7174, &lo)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Listen(db, 7174, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("second Listen on the port: %v", err)
	}
	type res struct {
		c   *Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctxT(t, 5*time.Second))
		acc <- res{c, err}
	}()
	o := fast
	o.PrivateData = []byte("hello server")
	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7174), &o)
	if err != nil {
		t.Fatal(err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	cb := r.c
	if !bytes.HasPrefix(cb.PeerPrivateData(), []byte("hello server")) || len(cb.PeerPrivateData()) != cm.CMAREQPrivateDataSize {
		t.Errorf("server got private data %q", cb.PeerPrivateData())
	}
	if !bytes.HasPrefix(ca.PeerPrivateData(), []byte("from the server")) {
		t.Errorf("client got private data %q", ca.PeerPrivateData())
	}
	if cb.RemoteAddr().Addr() != addrA || ca.RemoteAddr() != netip.AddrPortFrom(addrB, 7174) || cb.LocalAddr().Port() != 7174 {
		t.Errorf("addresses: client %v -> %v, server %v <- %v", ca.LocalAddr(), ca.RemoteAddr(), cb.LocalAddr(), cb.RemoteAddr())
	}
	if ca.QP().State() != transport.QPSRTS || cb.QP().State() != transport.QPSRTS {
		t.Fatalf("QP states %v %v", ca.QP().State(), cb.QP().State())
	}
	// An RDMA WRITE over the connection.
	src := make([]byte, 64)
	copy(src, "written through a CM connection")
	smr, _ := ca.PD().RegisterMR(src, memreg.AccessLocalWrite)
	dst := make([]byte, 64)
	dmr, _ := cb.PD().RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err := ca.QP().PostSend(transport.SendWR{WRID: 1, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{smr.SGE(0, 64)}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	var wc [1]transport.WC
	if _, err := ca.SendCQ().Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Err() != nil {
		t.Fatalf("WRITE: %v %v", err, wc[0].Err())
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("WRITE data differs")
	}
	smr.Deregister()
	dmr.Deregister()
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cb.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the server's connection did not end on the client's DREQ")
	}
	if cb.QP().State() != transport.QPSErr {
		t.Errorf("server QP %v after disconnect", cb.QP().State())
	}
	cb.Close()
	sa, sb := StatsOf(da), StatsOf(db)
	if sa.Established != 1 || sb.Established != 1 {
		t.Errorf("established: client %d server %d", sa.Established, sb.Established)
	}
}

// TestRefused: nothing listens: the REQ is rejected (invalid service ID)
// at once — librdmacm's ECONNREFUSED, not a timeout.
func TestRefused(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	if _, err := managerFor(db); err != nil { // the peer runs a CM, with no listener
		t.Fatal(err)
	}
	start := time.Now()
	_, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 9999), &fast)
	var rej *RejectError
	if !errors.Is(err, ErrRefused) || !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID {
		t.Fatalf("Dial to no listener: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusal took %v", d)
	}
	if StatsOf(db).RejNoListener == 0 { // one per REQ (a slow REJ may meet a retransmitted REQ)
		t.Errorf("rej_no_listener %d", StatsOf(db).RejNoListener)
	}
}

// TestRefusedWithoutCM: the peer device has never used rdmacm (no
// manager, no CM agent on its GSI): its GSI still answers a REQ with a REJ
// and a SIDR_REQ with a SIDR_REP, both "invalid service ID", so Dial and
// ResolveUD are refused at once, as by the kernel's CM, not timed out.
func TestRefusedWithoutCM(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	slow := Options{ResponseTimeout: 2 * time.Second, MaxRetries: 3}
	start := time.Now()
	_, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 9999), &slow)
	var rej *RejectError
	if !errors.Is(err, ErrRefused) || !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID {
		t.Fatalf("Dial to a device without a CM: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusal took %v", d)
	}
	_, err = ResolveUD(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 9999), &UDOptions{ResponseTimeout: 2 * time.Second})
	if !errors.Is(err, ErrRefused) || !errors.As(err, &rej) || rej.SIDRStatus != cm.SIDRUnsupported {
		t.Fatalf("ResolveUD to a device without a CM: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("both refusals took %v", d)
	}
	// A stray DREQ (a connection the device forgot) gets a DREP.
	in := &madInjector{dev: db}
	in.send(t, addrA, 5, &cm.DREQFields{LocalCommID: 0x1234, RemoteCommID: 0x5678, RemoteQPN: 0x11})
	deadline := time.Now().Add(5 * time.Second)
	for StatsOf(da).Unknown == 0 && time.Now().Before(deadline) { // the DREP, for nothing the client knows
		time.Sleep(time.Millisecond)
	}
	c := db.Counters()
	if c.UnknownQP != 0 || c.MADDropNoAgent < 3 || c.MADSent < 3 {
		t.Errorf("server counters unknown_qp %d mad_drop_no_agent %d mad_sent %d", c.UnknownQP, c.MADDropNoAgent, c.MADSent)
	}
	if StatsOf(da).Unknown == 0 {
		t.Error("no DREP came back for a stray DREQ")
	}
	if s := StatsOf(db); s.MADsIn != 0 || s.Conns != 0 {
		t.Errorf("the server started a connection manager: %+v", s)
	}
}

// TestReject: the server refuses with private data; the client sees it.
func TestReject(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, _ := Listen(db, 1, &ListenOptions{Options: fast})
	go func() {
		r, err := l.Next(ctxT(t, 5*time.Second))
		if err == nil {
			r.Reject([]byte("go away"))
		}
	}()
	_, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 1), &fast)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != cm.RejConsumer || !bytes.HasPrefix(rej.PrivateData, []byte("go away")) ||
		errors.Is(err, ErrRefused) {
		t.Fatalf("Dial rejected: %v", err)
	}
}

// TestLossyCM: 20 % of all packets are lost; connections still come up
// (MADs retransmitted, duplicates answered) and carry a WRITE each, and
// both sides disconnect.
func TestLossyCM(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{Loss: 0.2, Seed: 7})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, _ := Listen(db, 7174, &ListenOptions{Options: fast})
	defer l.Close()
	const conns = 8
	var wg sync.WaitGroup
	server := make(chan *Conn, conns)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < conns; i++ {
			c, err := l.Accept(ctxT(t, 20*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			server <- c
		}
	}()
	var clients []*Conn
	for i := 0; i < conns; i++ {
		c, err := Dial(ctxT(t, 20*time.Second), da, netip.AddrPortFrom(addrB, 7174), &fast)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		clients = append(clients, c)
	}
	// Every connection comes up on the server too (a lost RTU is made
	// good by the REP's retransmission), then either side disconnects.
	wg.Wait()
	close(server)
	i := 0
	for c := range server {
		if i%2 == 0 {
			c.Close()
		}
		i++
	}
	for _, c := range clients {
		c.Close()
	}
	sa, sb := StatsOf(da), StatsOf(db)
	if sa.Retransmits+sb.Retransmits == 0 {
		t.Error("no MAD was retransmitted at 20 % loss")
	}
	t.Logf("client %+v\nserver %+v", sa, sb)
}

// TestCommEstWithoutRTU: every RTU is lost; the first packet the client
// sends establishes the server's side (communication established).
func TestCommEstWithoutRTU(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	var fl *filterLink
	da := newDev(t, n, addrA, func(l udp.Link) udp.Link {
		fl = &filterLink{Wrap: udp.Wrap{Link: l}, drop: func(p *packet.Packet) bool {
			return p.BTH.DestQP() == 1 && len(p.Payload) == 256 && cm.MAD(p.Payload).AttributeID() == cm.AttrRTU
		}}
		return fl
	})
	db := newDev(t, n, addrB, nil)
	o := fast
	o.MaxRetries = 100 // the REP keeps coming; only the data may end it
	l, _ := Listen(db, 5, &ListenOptions{Options: o})
	acc := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(ctxT(t, 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 5), &fast)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	buf := make([]byte, 8)
	mr, _ := ca.PD().RegisterMR(buf, memreg.AccessLocalWrite)
	// The server posts no receive: the SEND meets an RNR, but its first
	// packet is all it takes.
	if err := ca.QP().PostSend(transport.SendWR{Opcode: transport.WRSend, SGEs: []memreg.SGE{mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-acc:
		if c == nil {
			t.FailNow()
		}
		defer c.Close()
		if c.QP().State() != transport.QPSRTS {
			t.Fatalf("server QP %v", c.QP().State())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server never established without the RTU")
	}
	if fl.dropped.Load() == 0 {
		t.Fatal("no RTU was dropped")
	}
}

// TestCancelDial: a Dial whose context ends before the server answers
// sends a REJ; the server's request ends with it (and leaves the queue:
// Next does not hand out a request that is over).
func TestCancelDial(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, _ := Listen(db, 6, &ListenOptions{Options: fast})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, da, netip.AddrPortFrom(addrB, 6), &fast)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled Dial: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for StatsOf(db).Ended[CausePeerReject] == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s := StatsOf(db); s.Ended[CausePeerReject] != 1 || s.RejRecv[cm.RejTimeout] != 1 || s.Conns != 0 {
		t.Fatalf("server: ended by a REJ %d, REJ timeout received %d, connections %d", s.Ended[CausePeerReject], s.RejRecv[cm.RejTimeout], s.Conns)
	}
	if r, err := l.Next(ctxT(t, 100*time.Millisecond)); err == nil {
		t.Fatalf("Next handed out the request its requester gave up: %v", r.RemoteAddr())
	}
}

// TestREQFlood: a listener that never accepts holds at most its backlog of
// requests; each newer one sheds an older (unanswered: dropped silently,
// its requester would send it again), and the manager's state stays
// bounded.
func TestREQFlood(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, _ := Listen(db, 8, &ListenOptions{Options: fast, Backlog: 4})
	defer l.Close()
	const dials = 40
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	for i := 0; i < dials; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := fast
			o.ResponseTimeout = 10 * time.Second // the held ones wait until cancelled
			Dial(ctx, da, netip.AddrPortFrom(addrB, 8), &o)
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for StatsOf(db).Shed < dials-4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	mb, _ := managerFor(db)
	mb.mu.Lock()
	held := len(mb.conns)
	mb.mu.Unlock()
	cancel()
	wg.Wait()
	s := StatsOf(db)
	if s.Shed != dials-4 || held != 4 {
		t.Fatalf("%d of %d shed for the backlog, %d connections held (backlog 4)", s.Shed, dials, held)
	}
	if s.RejBacklog != dials-4 || s.Ended[CauseShed] != dials-4 {
		t.Errorf("rej_backlog %d, ended by shedding %d", s.RejBacklog, s.Ended[CauseShed])
	}
}

// TestPassiveClose: the server disconnects; the client's Done closes and
// its QP flushes.
func TestPassiveClose(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, _ := Listen(db, 9, &ListenOptions{Options: fast})
	acc := make(chan *Conn, 1)
	go func() { c, _ := l.Accept(ctxT(t, 5*time.Second)); acc <- c }()
	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 9), &fast)
	if err != nil {
		t.Fatal(err)
	}
	cb := <-acc
	buf := make([]byte, 8)
	mr, _ := ca.PD().RegisterMR(buf, memreg.AccessLocalWrite)
	ca.QP().PostRecv(transport.RecvWR{WRID: 77, SGEs: []memreg.SGE{mr.SGE(0, 8)}})
	cb.Close()
	select {
	case <-ca.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client not told of the server's disconnect")
	}
	var wc [1]transport.WC
	if _, err := ca.RecvCQ().Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Status != transport.WCWRFlushErr || wc[0].WRID != 77 {
		t.Fatalf("posted receive after disconnect: %+v %v", wc[0], err)
	}
	mr.Deregister()
	ca.Close()
}

// TestSIDR: UD service resolution; an unknown port is refused.
func TestSIDR(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	pd, _ := db.AllocPD()
	cq, _ := db.CreateCQ(4)
	qp, _ := db.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	if err := qp.ReadyUD(UDPQKey, 0); err != nil {
		t.Fatal(err)
	}
	ul, err := ListenUD(db, 7174, qp, UDPQKey, []byte("ud hello"))
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	p, err := ResolveUD(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7174), &UDOptions{ResponseTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if p.QPN != qp.QPN() || p.QKey != UDPQKey || p.Addr != addrB || !bytes.HasPrefix(p.PrivateData, []byte("ud hello")) {
		t.Fatalf("resolved %+v", p)
	}
	_, err = ResolveUD(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 1), &UDOptions{ResponseTimeout: 20 * time.Millisecond})
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("unknown UD port: %v", err)
	}
}
