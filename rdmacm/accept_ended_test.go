package rdmacm

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// holdEstablished holds the goroutine of the active (Dial) or passive
// (Accept) side between a connection's establishment and its look at the
// connection's state, until the connection has ended (5 s at most).
func holdEstablished(t *testing.T, active bool) {
	t.Helper()
	hook := func(c *Conn) {
		if c.active != active {
			return
		}
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
		}
	}
	testHookEstablished.Store(&hook)
	t.Cleanup(func() { testHookEstablished.Store(nil) })
}

// TestAcceptConnEndedByPeer: a connection the peer establishes, uses and
// disconnects before the listener's goroutine that waits for the
// establishment gets to run (a loaded machine: the client's RTU, WRITE and
// DREQ all arrive within one scheduling delay) is still returned by
// Accept — as accept(2) returns a socket whose peer has already closed —
// with its completions in its CQ, its Done closed and Err reporting the
// disconnect. It was dropped: Accept waited until its context ended
// although the client's WRITE with immediate had been acknowledged
// (examples/rdmawrite TestTwoProcesses, CI run of 12-05).
func TestAcceptConnEndedByPeer(t *testing.T) {
	// Hold the listener's goroutine between the establishment and its
	// look at the connection's state until the peer has disconnected.
	holdEstablished(t, false)

	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	pd, err := db.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 64)
	dmr, err := pd.RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	lo := ListenOptions{Options: fast}
	lo.PD = pd
	lo.Prepare = func(qp *transport.QP) error { return qp.PostRecv(transport.RecvWR{WRID: 5}) }
	l, err := Listen(db, 7174, &lo)
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
		c, err := l.Accept(ctxT(t, 3*time.Second))
		acc <- res{c, err}
	}()

	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7174), &fast)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("before the disconnect")
	smr, err := ca.PD().RegisterMR(msg, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.QP().PostSend(transport.SendWR{WRID: 1, Opcode: transport.WRWriteImm, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{smr.SGE(0, uint32(len(msg)))}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey(), Imm: uint32(len(msg))}); err != nil {
		t.Fatal(err)
	}
	var wc [1]transport.WC
	if _, err := ca.SendCQ().Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Err() != nil {
		t.Fatalf("WRITE with immediate: %v %v", err, wc[0].Err())
	}
	smr.Deregister()
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}

	r := <-acc
	if r.err != nil {
		t.Fatalf("Accept of a connection established and then disconnected by the peer: %v", r.err)
	}
	cb := r.c
	select {
	case <-cb.Done():
	default:
		t.Error("Done not closed on a connection the peer disconnected")
	}
	if err := cb.Err(); !errors.Is(err, ErrDisconnected) {
		t.Errorf("Err() = %v, want ErrDisconnected", err)
	}
	// Both sides count the connection as ended once Done closed, not at
	// the end of their TimeWait (2 s later), as Ended does.
	for _, d := range []*transport.Device{da, db} {
		if s := StatsOf(d); s.Disconnected != 1 || s.Ended[CausePeerDisconnect]+s.Ended[CauseLocalClose] != 1 {
			t.Errorf("%v: Disconnected %d, Ended %v: want one ended connection in both", d.Addr(), s.Disconnected, s.Ended)
		}
	}
	n0, err := cb.RecvCQ().Wait(ctxT(t, 2*time.Second), wc[:])
	if err != nil || n0 != 1 || wc[0].Err() != nil || wc[0].Flags&transport.WCWithImm == 0 || wc[0].Imm != uint32(len(msg)) || wc[0].WRID != 5 {
		t.Fatalf("the WRITE's receive completion: n=%d %+v %v", n0, wc[0], err)
	}
	if string(dst[:len(msg)]) != string(msg) {
		t.Errorf("buffer holds %q, want %q", dst[:len(msg)], msg)
	}
	if err := cb.Close(); err != nil {
		t.Errorf("Close of the ended connection: %v", err)
	}
	dmr.Deregister()
	pd.Dealloc()
}

// TestDialConnEndedByPeer is TestAcceptConnEndedByPeer's active side: a
// server that accepts and disconnects at once, before the dialling
// goroutine has looked at the established connection, leaves Dial with
// the connection, ended (Done closed, Err ErrDisconnected), not with an
// error for a connection that was made.
func TestDialConnEndedByPeer(t *testing.T) {
	holdEstablished(t, true)

	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, err := Listen(db, 7175, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(ctxT(t, 5*time.Second)); err == nil {
			c.Close()
		}
	}()
	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7175), &fast)
	if err != nil {
		t.Fatalf("Dial of a connection established and then disconnected by the peer: %v", err)
	}
	select {
	case <-ca.Done():
	default:
		t.Error("Done not closed on a connection the peer disconnected")
	}
	if err := ca.Err(); !errors.Is(err, ErrDisconnected) {
		t.Errorf("Err() = %v, want ErrDisconnected", err)
	}
	if err := ca.Close(); err != nil {
		t.Errorf("Close of the ended connection: %v", err)
	}
}
