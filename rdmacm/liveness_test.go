package rdmacm

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// blackhole is a link that, once cut, neither sends nor delivers: the
// process behind it is gone (a crash sends no DREQ).
type blackhole struct {
	udp.Wrap // forwards the wrapped link's capabilities
	cut      atomic.Bool
}

func (l *blackhole) Send(pkts []udp.Packet) error {
	if l.cut.Load() {
		return nil
	}
	return l.Link.Send(pkts)
}

// pairWith connects a client on addrA to a server on addrB with the
// given options on both sides; the server's link can be cut.
func pairWith(t *testing.T, o Options) (ca, cb *Conn, bh *blackhole, da, db *transport.Device) {
	t.Helper()
	n := memnet.NewMemNetwork(memnet.Faults{})
	da = newDev(t, n, addrA, nil)
	db = newDev(t, n, addrB, func(l udp.Link) udp.Link { bh = &blackhole{Wrap: udp.Wrap{Link: l}}; return bh })
	l, err := Listen(db, 7300, &ListenOptions{Options: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	acc := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(ctxT(t, 5*time.Second))
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	ca, err = Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7300), &o)
	if err != nil {
		t.Fatal(err)
	}
	cb = <-acc
	if cb == nil {
		t.FailNow()
	}
	t.Cleanup(func() { ca.Close(); cb.Close() })
	return ca, cb, bh, da, db
}

// A peer that dies while the connection is idle is found by keep-alive:
// Done closes within 2×KeepAlive + KeepAliveTimeout (+ the probe's
// retries), Err matches ErrKeepAlive.
func TestKeepAliveDeadIdlePeer(t *testing.T) {
	o := fast
	o.KeepAlive, o.KeepAliveTimeout = 100*time.Millisecond, 300*time.Millisecond
	o.Retry = &transport.Retry{Timeout: 12, RetryCnt: 3, RNRRetry: 7} // ~17 ms ACK timeout
	ca, _, bh, da, _ := pairWith(t, o)
	bh.cut.Store(true)
	start := time.Now()
	select {
	case <-ca.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed 5 s after the idle peer died")
	}
	el := time.Since(start)
	if lim := 2*o.KeepAlive + o.KeepAliveTimeout + time.Second; el > lim {
		t.Errorf("dead peer found after %v, want within %v", el, lim)
	}
	if err := ca.Err(); !errors.Is(err, ErrKeepAlive) {
		t.Fatalf("Err = %v, want ErrKeepAlive", err)
	}
	if s := StatsOf(da); s.KeepAliveFailed != 1 || s.KeepAliveProbes == 0 {
		t.Errorf("stats: %+v", s)
	}
	t.Logf("dead idle peer found after %v: %v", el, ca.Err())
}

// An idle connection to a live peer survives many keep-alive intervals
// with no false alarm: the peer's QP answers the probes by itself.
func TestKeepAliveLiveIdlePeer(t *testing.T) {
	o := fast
	// Many probes (every 20 ms) but a timeout a loaded -race run does not
	// reach by a stall of its own (200 ms did, 1 run in 30 on 2 cores).
	o.KeepAlive, o.KeepAliveTimeout = 20*time.Millisecond, 2*time.Second
	ca, cb, _, da, db := pairWith(t, o)
	time.Sleep(time.Second)
	for _, c := range []*Conn{ca, cb} {
		select {
		case <-c.Done():
			t.Fatalf("live idle connection ended: %v", c.Err())
		default:
		}
	}
	sa, sb := StatsOf(da), StatsOf(db)
	if sa.KeepAliveProbes < 5 || sb.KeepAliveProbes < 5 {
		t.Errorf("probes: client %d server %d, want many", sa.KeepAliveProbes, sb.KeepAliveProbes)
	}
	if sa.KeepAliveFailed+sb.KeepAliveFailed+sa.QPFailed+sb.QPFailed != 0 {
		t.Errorf("false alarms: %+v %+v", sa, sb)
	}
	// Probes complete nowhere.
	var wc [1]transport.WC
	if ca.SendCQ().Poll(wc[:]) != 0 || cb.SendCQ().Poll(wc[:]) != 0 || cb.RecvCQ().Poll(wc[:]) != 0 {
		t.Errorf("a probe produced a completion: %+v", wc[0])
	}
}

// Probes reach a peer whose QP grants no remote write.
func TestKeepAliveNoRemoteAccessPeer(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	o := fast
	o.KeepAlive = 20 * time.Millisecond
	so := o
	so.NoRemoteAccess = true
	l, err := Listen(db, 7301, &ListenOptions{Options: so})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan *Conn, 1)
	go func() { c, _ := l.Accept(ctxT(t, 5*time.Second)); acc <- c }()
	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7301), &o)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb := <-acc
	if cb == nil {
		t.Fatal("accept failed")
	}
	defer cb.Close()
	time.Sleep(300 * time.Millisecond)
	if err := ca.Err(); err != nil {
		t.Fatalf("client connection ended: %v", err)
	}
	if StatsOf(da).KeepAliveProbes == 0 {
		t.Fatal("no probe sent")
	}
}

// A server killed under a stream of WRITEs: the client's QP runs out of
// retries and the connection ends with ErrQPFailed and the WCError.
func TestQPFailureEndsConn(t *testing.T) {
	o := fast
	o.KeepAlive = -1 // off: the QP's failure alone must end it
	o.Retry = &transport.Retry{Timeout: 10, RetryCnt: 3, RNRRetry: 7}
	ca, cb, bh, da, _ := pairWith(t, o)
	src := make([]byte, 4096)
	smr, err := ca.PD().RegisterMR(src, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Deregister()
	dst := make([]byte, 4096)
	dmr, err := cb.PD().RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Deregister()
	wr := transport.SendWR{Opcode: transport.WRWrite, SGEs: []memreg.SGE{smr.SGE(0, 4096)}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	for i := 0; i < 8; i++ {
		if err := ca.QP().PostSendContext(ctxT(t, 5*time.Second), wr); err != nil {
			t.Fatal(err)
		}
	}
	bh.cut.Store(true)
	for i := 0; i < 4; i++ {
		ca.QP().PostSend(wr)
	}
	select {
	case <-ca.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed 5 s after the server died under WRITEs")
	}
	var we *transport.WCError
	if err := ca.Err(); !errors.Is(err, ErrQPFailed) || !errors.As(err, &we) || we.Status != transport.WCRetryExcErr {
		t.Fatalf("Err = %v, want ErrQPFailed with retry exceeded", err)
	}
	if s := StatsOf(da); s.QPFailed != 1 {
		t.Errorf("QPFailed = %d", s.QPFailed)
	}
}

// A peer's DREQ ends the connection with ErrDisconnected (which matches
// ErrClosed).
func TestDisconnectErr(t *testing.T) {
	ca, cb, _, _, _ := pairWith(t, fast)
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cb.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("no disconnect")
	}
	if err := cb.Err(); !errors.Is(err, ErrDisconnected) || !errors.Is(err, ErrClosed) {
		t.Fatalf("Err = %v, want ErrDisconnected and ErrClosed", err)
	}
	if err := ca.Err(); !errors.Is(err, ErrClosed) || errors.Is(err, ErrDisconnected) {
		t.Fatalf("closing side's Err = %v, want ErrClosed only", err)
	}
}

// A remote access error (a WRITE with a bad rkey) fails the requester's
// QP (WCRemAccessErr): its connection ends with ErrQPFailed, and the
// responder's (whose QP failed too, after its NAK) ends as well — by its
// own QP's failure or by the requester's DREQ, whichever it sees first.
func TestRemoteAccessErrorEndsConns(t *testing.T) {
	o := fast
	o.KeepAlive = -1
	ca, cb, _, _, _ := pairWith(t, o)
	src := make([]byte, 64)
	smr, err := ca.PD().RegisterMR(src, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Deregister()
	if err := ca.QP().PostSend(transport.SendWR{Opcode: transport.WRWrite, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{smr.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0xdead00}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Conn{ca, cb} {
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Done not closed after a remote access error")
		}
	}
	var we *transport.WCError
	if err := ca.Err(); !errors.Is(err, ErrQPFailed) || !errors.As(err, &we) || we.Status != transport.WCRemAccessErr {
		t.Fatalf("requester's Err = %v, want ErrQPFailed with a remote access error (QP err %v; responder %v)", err, ca.QP().Err(), cb.Err())
	}
	if err := cb.Err(); !errors.Is(err, ErrQPFailed) && !errors.Is(err, ErrDisconnected) {
		t.Fatalf("responder's Err = %v, want ErrQPFailed or ErrDisconnected", err)
	}
}
