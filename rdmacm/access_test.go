package rdmacm

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// connectPair returns a client and a server connection; the server
// accepts with so.
func connectPair(t *testing.T, port uint16, so Options) (ca, cb *Conn) {
	t.Helper()
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, err := Listen(db, port, &ListenOptions{Options: so})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := l.Accept(ctxT(t, 5*time.Second))
		acc <- c
	}()
	ca, err = Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, port), &fast)
	if err != nil {
		t.Fatal(err)
	}
	if cb = <-acc; cb == nil {
		t.Fatal("Accept failed")
	}
	return ca, cb
}

// TestDefaultAccess: with default Options a connection grants what Linux's
// CM grants (remote write, read and atomics, as it has responder
// resources), so a FETCH_ADD succeeds; NoRemoteAccess grants nothing, so a
// WRITE is refused (remote invalid request, as rxe answers an operation the
// QP does not allow); NoRemoteAccess with Access is an error.
func TestDefaultAccess(t *testing.T) {
	ca, cb := connectPair(t, 7174, fast)
	if a := cb.opts.Access; a != memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic {
		t.Errorf("default access %v", a)
	}
	res := make([]byte, 8)
	rmr, _ := ca.PD().RegisterMR(res, memreg.AccessLocalWrite)
	ctr := make([]byte, 8)
	binary.NativeEndian.PutUint64(ctr, 40)
	cmr, _ := cb.PD().RegisterMR(ctr, memreg.AccessLocalWrite|memreg.AccessRemoteAtomic)
	if err := ca.QP().PostSend(transport.SendWR{WRID: 1, Opcode: transport.WRFetchAdd, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{rmr.SGE(0, 8)}, RemoteAddr: cmr.IOVA(), RKey: cmr.RKey(), CompareAdd: 2}); err != nil {
		t.Fatal(err)
	}
	var wc [1]transport.WC
	if _, err := ca.SendCQ().Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Err() != nil {
		t.Fatalf("FETCH_ADD with default access: %v %v", err, wc[0].Err())
	}
	if binary.NativeEndian.Uint64(res) != 40 || binary.NativeEndian.Uint64(ctr) != 42 {
		t.Errorf("FETCH_ADD: fetched %d, now %d", binary.NativeEndian.Uint64(res), binary.NativeEndian.Uint64(ctr))
	}
	rmr.Deregister()
	cmr.Deregister()
	if err := ca.Close(); err != nil {
		t.Error(err)
	}
	<-cb.Done()
	cb.Close()

	none := fast
	none.NoRemoteAccess = true
	ca, cb = connectPair(t, 7175, none)
	src := make([]byte, 8)
	smr, _ := ca.PD().RegisterMR(src, memreg.AccessLocalWrite)
	dst := make([]byte, 8)
	dmr, _ := cb.PD().RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err := ca.QP().PostSend(transport.SendWR{WRID: 2, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{smr.SGE(0, 8)}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.SendCQ().Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Status != transport.WCRemInvReqErr {
		t.Fatalf("WRITE to a NoRemoteAccess QP: %v %v", err, wc[0].Status)
	}
	smr.Deregister()
	dmr.Deregister()

	bad := fast
	bad.NoRemoteAccess, bad.Access = true, memreg.AccessRemoteWrite
	if _, err := Listen(cb.m.dev, 7176, &ListenOptions{Options: bad}); err == nil || errors.Is(err, ErrInUse) {
		t.Errorf("Listen with NoRemoteAccess and Access: %v", err)
	}
}

// TestCloseReportsBusyPD: Close cannot deallocate the PD the connection
// created while a region registered in Prepare lives in it: it says so
// (memreg.ErrBusy) instead of returning nil and leaving the PD behind,
// and a Close after the region is deregistered frees the PD.
func TestCloseReportsBusyPD(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, err := Listen(db, 7174, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := l.Accept(ctxT(t, 5*time.Second))
		acc <- c
	}()
	var mr *memreg.MR
	o := fast
	o.Prepare = prepareRecv(&mr, make([]byte, 64))
	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7174), &o)
	if err != nil {
		t.Fatal(err)
	}
	cb := <-acc
	if cb == nil {
		t.Fatal("Accept failed")
	}
	defer cb.Close()
	pd := ca.PD()
	if err := ca.Close(); !errors.Is(err, memreg.ErrBusy) {
		t.Fatalf("Close with a region in the connection's PD: %v", err)
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := ca.Close(); err != nil {
		t.Fatalf("Close after deregistering: %v", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, memreg.ErrClosed) {
		t.Errorf("the connection's PD was not deallocated: %v", err)
	}
}

// prepareRecv is an Options.Prepare that registers buf in the QP's PD
// (the region lands in *mr) and posts one receive into it, wr_id 1.
func prepareRecv(mr **memreg.MR, buf []byte) func(*transport.QP) error {
	return func(qp *transport.QP) error {
		var err error
		if *mr, err = qp.PD().RegisterMR(buf, memreg.AccessLocalWrite); err != nil {
			return err
		}
		return qp.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{(*mr).SGE(0, uint32(len(buf)))}})
	}
}
