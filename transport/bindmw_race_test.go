package transport

import (
	"context"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestBindMWRaceWithErr: QP.BindMW checks the state under qp.mu, releases
// it while the window is (re)bound, and takes it again. A QP that moves to
// ERR meanwhile (Modify, or by itself: a NAK, retry exceeded) flushes the
// bind WR, so the bind must not stand: the window ends unbound and the
// key BindMW returned is not usable remotely. Before, the window was
// bound to the new range while BindMW returned nil and the WR completed
// WR_FLUSH_ERR (a reviewer's reproducer). Made deterministic by pinning
// the window's old binding (a zero-copy READ view's Hold, as Device.send
// holds it) so that the rebind waits in drain while the QP goes to ERR.
func TestBindMWRaceWithErr(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	l, err := n.Link(netipFrom4([4]byte{10, 0, 0, 1}))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := NewDevice(l, DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Connect(ConnParams{Peer: netipFrom4([4]byte{10, 0, 0, 2}), DestQPN: 0x99, PathMTU: MTU1024,
		Access: memreg.AccessRemoteRead | memreg.AccessRemoteWrite, MaxRdAtomic: 1, MaxDestRdAtomic: 1}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteRead|memreg.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw, _ := pd.AllocMW(memreg.MWType1)
	key1, err := qp.BindMW(1, mw, MWBindInfo{MR: mr, Addr: mr.IOVA(), Length: 4096, Access: memreg.AccessRemoteRead}, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Pin the old binding as an in-flight zero-copy READ response would.
	_, hold, err := pd.ForQP(qp.QPN()).ReadView(key1, mr.IOVA(), 2048)
	if err != nil || hold == nil {
		t.Fatalf("ReadView: %v %v", hold, err)
	}
	if !hold.Acquire() {
		t.Fatal("acquire")
	}
	type res struct {
		key uint32
		err error
	}
	done := make(chan res, 1)
	go func() {
		k, err := qp.BindMW(2, mw, MWBindInfo{MR: mr, Addr: mr.IOVA() + 4096, Length: 4096, Access: memreg.AccessRemoteRead}, SendSignaled)
		done <- res{k, err}
	}()
	time.Sleep(100 * time.Millisecond) // BindMW is in drain, without qp.mu
	if err := qp.Modify(&QPAttr{State: QPSErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	hold.Release()
	var r res
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("BindMW hung")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var st WCStatus = 255
	for st == 255 {
		wcs := make([]WC, 8)
		k, err := cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[:k] {
			if wc.WRID == 2 {
				st = wc.Status
			}
		}
	}
	t.Logf("BindMW returned key %#x err %v; window bound %v rkey %#x; WR 2 completed %v", r.key, r.err, mw.Bound(), mw.RKey(), st)
	// Remote check through the returned key: does the new binding work?
	cerr := pd.ForQP(0x99).CheckRemote(r.key, mr.IOVA()+4096, 64, memreg.AccessRemoteRead)
	if st != WCWRFlushErr {
		t.Fatalf("bind WR completed %v, want flushed", st)
	}
	if mw.Bound() || cerr == nil {
		t.Fatalf("bind completion WR_FLUSH_ERR (BindMW: %v), but the window is bound (%v) and rkey %#x usable remotely (%v)", r.err, mw.Bound(), r.key, cerr)
	}
}
