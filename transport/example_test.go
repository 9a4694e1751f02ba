package transport_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// endpoint is one side of the examples: a device on the in-memory
// network, a PD, one CQ and one RC QP.
type endpoint struct {
	dev *transport.Device
	pd  *memreg.PD
	cq  *transport.CQ
	qp  *transport.QP
}

func newEndpoint(n *memnet.MemNetwork, addr string) *endpoint {
	link, err := n.Link(netip.MustParseAddr(addr))
	if err != nil {
		log.Fatal(err)
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		log.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	cq, err := dev.CreateCQ(64)
	if err != nil {
		log.Fatal(err)
	}
	qp, err := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		log.Fatal(err)
	}
	return &endpoint{dev: dev, pd: pd, cq: cq, qp: qp}
}

// connectPair connects a's and b's QPs to each other. Over a real network
// each side learns the other's QPN and first PSN out of band (a TCP
// exchange, or the connection manager).
func connectPair(a, b *endpoint) {
	all := memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic
	if err := a.qp.Connect(transport.ConnParams{Peer: b.dev.Addr(), DestQPN: b.qp.QPN(),
		SQPSN: 1000, RQPSN: 2000, Access: all}); err != nil {
		log.Fatal(err)
	}
	if err := b.qp.Connect(transport.ConnParams{Peer: a.dev.Addr(), DestQPN: a.qp.QPN(),
		SQPSN: 2000, RQPSN: 1000, Access: all}); err != nil {
		log.Fatal(err)
	}
}

// wait waits for one completion and fails on an error status.
func wait(cq *transport.CQ) transport.WC {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]transport.WC
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		log.Fatal(err)
	}
	if err := wc[0].Err(); err != nil {
		log.Fatal(err)
	}
	return wc[0]
}

// Two endpoints over the in-memory network: an RDMA WRITE places bytes in
// the peer's registered memory, an RDMA READ fetches them back, a SEND
// with immediate data lands in a posted receive, and a fetch-and-add
// returns the old value (in host byte order, as verbs does).
func Example() {
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newEndpoint(n, "192.0.2.1")
	b := newEndpoint(n, "192.0.2.2")
	defer a.dev.Close()
	defer b.dev.Close()
	connectPair(a, b)

	local := make([]byte, 64)
	lmr, err := a.pd.RegisterMR(local, memreg.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	remote := make([]byte, 64)
	rmr, err := b.pd.RegisterMR(remote, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|
		memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
	if err != nil {
		log.Fatal(err)
	}

	// WRITE "hello" into b's region; b's CPU takes no part.
	copy(local, "hello")
	if err := a.qp.PostSend(transport.SendWR{WRID: 1, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{lmr.SGE(0, 5)}, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(wait(a.cq).Opcode, string(remote[:5]))

	// READ it back into another part of a's region.
	if err := a.qp.PostSend(transport.SendWR{WRID: 2, Opcode: transport.WRRead, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{lmr.SGE(16, 5)}, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		log.Fatal(err)
	}
	wc := wait(a.cq)
	fmt.Println(wc.Opcode, wc.ByteLen, string(local[16:21]))

	// SEND with immediate data into a receive b posted.
	if err := b.qp.PostRecv(transport.RecvWR{WRID: 3, SGEs: []memreg.SGE{rmr.SGE(32, 16)}}); err != nil {
		log.Fatal(err)
	}
	if err := a.qp.PostSend(transport.SendWR{WRID: 4, Opcode: transport.WRSendImm, Imm: 0xcafe,
		SGEs: []memreg.SGE{lmr.SGE(0, 5)}}); err != nil {
		log.Fatal(err)
	}
	wc = wait(b.cq)
	fmt.Printf("%v %d bytes imm %#x: %s\n", wc.Opcode, wc.ByteLen, wc.Imm, remote[32:37])

	// Fetch-and-add on b's first 8 bytes (8-byte aligned).
	binary.NativeEndian.PutUint64(remote[56:], 40)
	if err := a.qp.PostSend(transport.SendWR{WRID: 5, Opcode: transport.WRFetchAdd, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{lmr.SGE(48, 8)}, RemoteAddr: rmr.IOVA() + 56, RKey: rmr.RKey(), CompareAdd: 2}); err != nil {
		log.Fatal(err)
	}
	wait(a.cq)
	fmt.Println("old", binary.NativeEndian.Uint64(local[48:]), "new", binary.NativeEndian.Uint64(remote[56:]))
	// Output:
	// RDMA_WRITE hello
	// RDMA_READ 5 hello
	// RECV 5 bytes imm 0xcafe: hello
	// old 40 new 42
}

// A refused work request names itself: PostSend returns a *WRError with
// the index of the WR it refused (the ones before it were posted) and the
// field at fault.
func ExampleWRError() {
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newEndpoint(n, "192.0.2.1")
	b := newEndpoint(n, "192.0.2.2")
	defer a.dev.Close()
	defer b.dev.Close()
	connectPair(a, b)
	buf := make([]byte, 8)
	mr, _ := a.pd.RegisterMR(buf, memreg.AccessLocalWrite)
	good := transport.SendWR{WRID: 7, Opcode: transport.WRFetchAdd, SGEs: []memreg.SGE{mr.SGE(0, 8)}, RemoteAddr: 0x1000}
	bad := good
	bad.WRID, bad.RemoteAddr = 8, 0x1003
	err := a.qp.PostSend(good, bad)
	var we *transport.WRError
	if errors.As(err, &we) {
		fmt.Println(we.Index, we.WRID, we.Field, errors.Is(err, transport.ErrInvalidWR))
	}
	// Output:
	// 1 8 remote_addr true
}

// A completion channel lets one goroutine wait on several CQs, and on
// anything else, in one select.
func ExampleCompChannel() {
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newEndpoint(n, "192.0.2.1")
	link, _ := n.Link(netip.MustParseAddr("192.0.2.2"))
	dev, _ := transport.NewDevice(link, transport.DeviceConfig{})
	defer a.dev.Close()
	defer dev.Close()
	ch, _ := dev.CreateCompChannel(1)
	cq, _ := dev.CreateCQWith(transport.CQAttr{Depth: 16, Channel: ch})
	pd, _ := dev.AllocPD()
	qp, _ := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	b := &endpoint{dev: dev, pd: pd, cq: cq, qp: qp}
	connectPair(a, b)

	buf := make([]byte, 16)
	mr, _ := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	qp.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{mr.SGE(0, 16)}})
	cq.ReqNotify(false) // arm: the next completion sends cq on ch.C()

	src := make([]byte, 4)
	smr, _ := a.pd.RegisterMR(src, 0)
	a.qp.PostSend(transport.SendWR{Opcode: transport.WRSend, SGEs: []memreg.SGE{smr.SGE(0, 4)}})

	select {
	case got := <-ch.C():
		var wc [4]transport.WC
		k := got.Poll(wc[:])
		fmt.Println("event for our CQ:", got == cq, "completions:", k, wc[0].Opcode)
		got.ReqNotify(false) // re-arm before polling again
	case ev := <-dev.Events():
		fmt.Println("async event:", ev)
	case <-time.After(5 * time.Second):
		fmt.Println("timeout")
	}
	// Output:
	// event for our CQ: true completions: 1 RECV
}
