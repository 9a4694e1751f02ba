package rdmacm

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestPathMTUMismatch: the two sides ask for different path MTUs. The REP
// has no MTU field, so both QPs must end with the same MTU (the REQ's) or
// a multi-packet message breaks: SEND, WRITE and READ of several MTUs'
// worth both ways must arrive intact, over the in-memory network and
// over UDP sockets on loopback. A Listener whose explicit PathMTU is
// below the REQ's rejects it with "invalid path MTU" (before the fix it
// accepted with the smaller MTU while the dialer kept its own, and the
// first multi-packet SEND failed with a remote invalid request NAK).
func TestPathMTUMismatch(t *testing.T) {
	type netw struct {
		name  string
		links func(t *testing.T) (udp.Link, udp.Link, netip.Addr)
	}
	nets := []netw{
		{"memnet", func(t *testing.T) (udp.Link, udp.Link, netip.Addr) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			la, err := n.Link(addrA)
			if err != nil {
				t.Fatal(err)
			}
			lb, err := n.Link(addrB)
			if err != nil {
				t.Fatal(err)
			}
			return la, lb, addrB
		}},
		{"loopback", func(t *testing.T) (udp.Link, udp.Link, netip.Addr) {
			la, err := udp.ListenSocket(loopbackFor(21), nil)
			if err != nil {
				t.Fatal(err)
			}
			lb, err := udp.ListenSocket(loopbackFor(22), nil)
			if err != nil {
				la.Close()
				t.Fatal(err)
			}
			return la, lb, loopbackFor(22)
		}},
	}
	for _, nw := range nets {
		for _, tc := range []struct{ dial, listen, want transport.MTU }{
			{transport.MTU4096, transport.MTU1024, 0}, // rejected
			{transport.MTU4096, 0, transport.MTU4096}, // default listener: the REQ's
			{transport.MTU1024, transport.MTU4096, transport.MTU1024},
			{transport.MTU2048, transport.MTU2048, transport.MTU2048},
			{0, transport.MTU4096, transport.MTU1024}, // default dialer: 1024
		} {
			t.Run(fmt.Sprintf("%s/dial%d-listen%d", nw.name, tc.dial.Bytes(), tc.listen.Bytes()), func(t *testing.T) {
				la, lb, bAddr := nw.links(t)
				da, err := transport.NewDevice(la, transport.DeviceConfig{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { da.Close() })
				db, err := transport.NewDevice(lb, transport.DeviceConfig{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				mtuTransfer(t, da, db, bAddr, tc.dial, tc.listen, tc.want)
			})
		}
	}
}

// mtuTransfer connects da to a listener on db (want zero: the listener
// must reject the request for its MTU) and moves data both ways.
func mtuTransfer(t *testing.T, da, db *transport.Device, bAddr netip.Addr, dialMTU, listenMTU, want transport.MTU) {
	const size = 5*4096 + 123 // several MTUs' worth at any MTU, with a short last packet
	var rmrA, rmrB *memreg.MR
	recvA, recvB := make([]byte, size), make([]byte, size)
	so := fast
	so.PathMTU = listenMTU
	so.Prepare = prepareRecv(&rmrB, recvB)
	l, err := Listen(db, 7180, &ListenOptions{Options: so})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if want == 0 {
		r := make(chan error, 1)
		go func() {
			rq, err := l.Next(ctxT(t, 5*time.Second))
			if err == nil {
				o := so
				_, err = rq.Accept(ctxT(t, 5*time.Second), &o)
			}
			r <- err
		}()
		co := fast
		co.PathMTU = dialMTU
		_, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(bAddr, 7180), &co)
		var re *RejectError
		if !errors.As(err, &re) || re.Reason != cm.RejInvalidMTU || !errors.Is(err, ErrRejected) {
			t.Fatalf("Dial with MTU %d to a listener of %d: %v, want a rejection for the path MTU",
				dialMTU.Bytes(), listenMTU.Bytes(), err)
		}
		aerr := <-r
		if !errors.As(aerr, &re) || re.Reason != cm.RejInvalidMTU || !strings.Contains(aerr.Error(), "PathMTU") {
			t.Fatalf("Accept: %v, want a rejection naming PathMTU", aerr)
		}
		t.Log(err, "/", aerr)
		return
	}
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := l.Accept(ctxT(t, 5*time.Second))
		acc <- c
	}()
	co := fast
	co.PathMTU = dialMTU
	co.Prepare = prepareRecv(&rmrA, recvA)
	ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(bAddr, 7180), &co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Close() })
	cb := <-acc
	if cb == nil {
		t.Fatal("Accept failed")
	}
	t.Cleanup(func() { cb.Close() })
	if ma, mb := ca.params.PathMTU, cb.params.PathMTU; ma != want || mb != want {
		t.Errorf("path MTU: active %d, passive %d; want both %d", ma.Bytes(), mb.Bytes(), want.Bytes())
	}

	pattern := func(seed byte) []byte {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i*7) ^ seed
		}
		return b
	}
	wait := func(name string, cq *transport.CQ) {
		t.Helper()
		var wc [1]transport.WC
		if _, err := cq.Wait(ctxT(t, 5*time.Second), wc[:]); err != nil || wc[0].Err() != nil {
			t.Fatalf("%s: %v %v", name, err, wc[0].Err())
		}
	}
	// One side's operations toward the other: SEND into the peer's posted
	// receive, WRITE into a peer region, READ from a peer region.
	ops := func(name string, from, to *Conn, recvTo []byte, seed byte) {
		src := pattern(seed)
		smr, err := from.PD().RegisterMR(src, memreg.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		defer smr.Deregister()
		if err := from.QP().PostSend(transport.SendWR{WRID: 2, Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{smr.SGE(0, size)}}); err != nil {
			t.Fatal(err)
		}
		wait(name+" SEND", from.SendCQ())
		wait(name+" SEND receive", to.RecvCQ())
		if !bytes.Equal(recvTo, src) {
			t.Errorf("%s: SEND data differs", name)
		}

		dst := make([]byte, size)
		dmr, err := to.PD().RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		defer dmr.Deregister()
		if err := from.QP().PostSend(transport.SendWR{WRID: 3, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{smr.SGE(0, size)}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
		wait(name+" WRITE", from.SendCQ())
		// The written region is checked by READing it back: the peer's
		// device goroutine wrote it, and over sockets the race detector
		// sees no ordering between that and this goroutine.
		back := make([]byte, size)
		bmr, err := from.PD().RegisterMR(back, memreg.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		defer bmr.Deregister()
		if err := from.QP().PostSend(transport.SendWR{WRID: 4, Opcode: transport.WRRead, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{bmr.SGE(0, size)}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
		wait(name+" READ", from.SendCQ())
		if !bytes.Equal(back, src) {
			t.Errorf("%s: WRITE then READ back: data differs", name)
		}
	}
	ops("active to passive", ca, cb, recvB, 1)
	ops("passive to active", cb, ca, recvA, 3)
	_ = rmrA
	_ = rmrB
}

// TestDefaultPathMTUFromInterface: Dial without a PathMTU asks for what
// Linux's rdma_cm picks from the interface's MTU (iboe_get_mtu: the MTU
// less 96 bytes of RoCE headers), never more than the 1024 it asks for
// anyway. On an interface of 1100 bytes it asked for 1024, and every
// full packet was too large for the link (retry exceeded).
func TestDefaultPathMTUFromInterface(t *testing.T) {
	for _, tc := range []struct {
		linkMTU int
		found   bool
		want    transport.MTU
	}{
		{1100, true, transport.MTU512},
		{1103, true, transport.MTU512},
		{1104, true, transport.MTU512}, // rxe's port says 1024 (80 bytes of headers); rdma_cm 512
		{1119, true, transport.MTU512},
		{1120, true, transport.MTU1024},
		{1500, true, transport.MTU1024},
		{9000, true, transport.MTU1024},
		{607, true, transport.MTU256},
		{608, true, transport.MTU512},
		{300, true, transport.MTU256}, // not even 256 fits: the smallest
		{0, false, transport.MTU1024}, // on no interface (memnet)
	} {
		t.Run(fmt.Sprint(tc.linkMTU), func(t *testing.T) {
			old := interfaceMTU
			interfaceMTU = func(a netip.Addr) (int, bool) {
				if a != addrA {
					t.Errorf("interface MTU looked up for %v, want the dialing device's %v", a, addrA)
				}
				return tc.linkMTU, tc.found
			}
			t.Cleanup(func() { interfaceMTU = old })
			n := memnet.NewMemNetwork(memnet.Faults{})
			da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
			mtuTransfer(t, da, db, addrB, 0, 0, tc.want)
		})
	}
}

// TestIBoEPathMTU checks IBoEPathMTU at the edges of each MTU.
func TestIBoEPathMTU(t *testing.T) {
	for _, tc := range []struct {
		link int
		want transport.MTU
		ok   bool
	}{
		{351, 0, false}, {352, transport.MTU256, true}, {607, transport.MTU256, true},
		{608, transport.MTU512, true}, {1119, transport.MTU512, true}, {1120, transport.MTU1024, true},
		{2143, transport.MTU1024, true}, {2144, transport.MTU2048, true}, {4191, transport.MTU2048, true},
		{4192, transport.MTU4096, true}, {65536, transport.MTU4096, true},
	} {
		if got, ok := IBoEPathMTU(tc.link); got != tc.want || ok != tc.ok {
			t.Errorf("IBoEPathMTU(%d) = %v, %v; want %v, %v", tc.link, got, ok, tc.want, tc.ok)
		}
	}
}
