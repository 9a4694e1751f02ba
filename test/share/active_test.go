//go:build linux

package share_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

const (
	activePort = 7301 // the parent's rdma_cm listener
	udPort     = 7302 // the parent's UD service (SIDR)
	udQKey     = 0x11223344
	udMsg      = 256
)

// childActive is a sharing process on the active side: it dials the
// parent's listener (REP, RTU and DREP reach it by its communication ID),
// resolves the parent's UD service (the SIDR_REP by its request ID), and
// exchanges a datagram with the parent's UD QP (by QPN).
func childActive() int {
	idx, _ := strconv.Atoi(os.Getenv("CHILD_INDEX"))
	addr := netip.MustParseAddr(os.Getenv("CHILD_ADDR"))
	peer := netip.MustParseAddr(os.Getenv("CHILD_PEER"))
	fail := func(f string, a ...any) int { fmt.Printf("FAIL "+f+"\n", a...); return 1 }
	l, err := udp.ListenSocket(addr, &udp.SocketOptions{Share: udp.ShareOn, ShareTimeWait: 200 * time.Millisecond})
	if err != nil {
		return fail("%v", err)
	}
	dev, err := transport.NewDevice(l, transport.DeviceConfig{})
	if err != nil {
		return fail("%v", err)
	}
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, c, err := dialAndRead(ctx, dev, netip.AddrPortFrom(peer, activePort))
	if err != nil {
		return fail("dial: %v", err)
	}
	if got != "parent" {
		return fail("parent said %q", got)
	}
	if err := c.Close(); err != nil {
		return fail("close: %v", err)
	}
	up, err := rdmacm.ResolveUD(ctx, dev, netip.AddrPortFrom(peer, udPort), nil)
	if err != nil {
		return fail("resolve: %v", err)
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(8)
	qp, err := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		return fail("ud qp: %v", err)
	}
	if err := qp.ReadyUD(udQKey, 1); err != nil {
		return fail("%v", err)
	}
	buf := make([]byte, 2*(transport.GRHSize+udMsg))
	mr, _ := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	if err := qp.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{mr.SGE(0, transport.GRHSize+udMsg)}}); err != nil {
		return fail("%v", err)
	}
	out := buf[transport.GRHSize+udMsg:]
	copy(out, fmt.Sprintf("ud from child %d", idx))
	ah, err := dev.CreateAH(transport.AHAttr{Addr: up.Addr})
	if err != nil {
		return fail("%v", err)
	}
	if err := qp.PostSend(transport.SendWR{WRID: 2, Opcode: transport.WRSend, AH: ah, RemoteQPN: up.QPN, RemoteQKey: up.QKey,
		SGEs: []memreg.SGE{mr.SGE(uint64(transport.GRHSize+udMsg), udMsg)}}); err != nil {
		return fail("%v", err)
	}
	wc := make([]transport.WC, 4)
	for recv := false; !recv; {
		n, err := cq.Wait(ctx, wc)
		if err != nil {
			return fail("ud wait: %v", err)
		}
		for _, w := range wc[:n] {
			if w.Err() != nil {
				return fail("ud wc: %v", w.Err())
			}
			recv = recv || w.WRID == 1
		}
	}
	want := fmt.Sprintf("echo: ud from child %d", idx)
	if g := string(buf[transport.GRHSize : transport.GRHSize+len(want)]); g != want {
		return fail("ud echo %q, want %q", g, want)
	}
	ss := l.ShareStats()
	fmt.Printf("DONE steered=%d rcvd=%d misrouted=%d unknownqp=%d\n", ss.Steered, l.Stats().RcvdPkts, ss.Misrouted, dev.Counters().UnknownQP)
	bufio.NewScanner(os.Stdin).Scan()
	return 0
}

// TestCMActiveSide: sharing processes as rdma_cm clients and SIDR
// resolvers, and UD QPs: replies find their process by the owner bits of
// the communication and request IDs, datagrams by QPN.
func TestCMActiveSide(t *testing.T) {
	needRoot(t)
	a := testAddrs(16)
	shared, peer := a[14], a[15]
	t.Cleanup(func() { share.Remove(netip.AddrPortFrom(shared, udp.Port), "") })
	pl, err := udp.ListenSocket(peer, &udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := transport.NewDevice(pl, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ln, err := rdmacm.Listen(dev, activePort, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			msg := []byte("parent")
			mr, _ := c.PD().RegisterMR(msg, memreg.AccessLocalWrite)
			c.QP().PostSend(transport.SendWR{Opcode: transport.WRSend, SGEs: []memreg.SGE{mr.SGE(0, uint32(len(msg)))}})
		}
	}()
	// The parent's UD service echoes every datagram to its sender's QP.
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	uqp, err := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := uqp.ReadyUD(udQKey, 1); err != nil {
		t.Fatal(err)
	}
	const slots = 8
	slot := transport.GRHSize + udMsg
	ubuf := make([]byte, 2*slots*slot)
	umr, _ := pd.RegisterMR(ubuf, memreg.AccessLocalWrite)
	for i := range slots {
		uqp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{umr.SGE(uint64(i*slot), uint32(slot))}})
	}
	udl, err := rdmacm.ListenUD(dev, udPort, uqp, udQKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer udl.Close()
	go func() {
		wc := make([]transport.WC, 8)
		for {
			n, err := cq.Wait(ctx, wc)
			if err != nil {
				return
			}
			for _, w := range wc[:n] {
				if w.Opcode != transport.WCRecv || w.Err() != nil {
					continue
				}
				i := int(w.WRID)
				in := ubuf[i*slot+transport.GRHSize:]
				out := ubuf[(slots+i)*slot:][:udMsg]
				copy(out, append([]byte("echo: "), in[:udMsg-6]...))
				ah, err := transport.AHFromGRH(ubuf[i*slot : i*slot+transport.GRHSize])
				if err == nil {
					if a, err := dev.CreateAH(ah); err == nil {
						uqp.PostSend(transport.SendWR{WRID: 100 + w.WRID, Opcode: transport.WRSend, AH: a, RemoteQPN: w.SrcQP, RemoteQKey: udQKey,
							SGEs: []memreg.SGE{umr.SGE(uint64((slots+i)*slot), udMsg)}})
					}
				}
				uqp.PostRecv(transport.RecvWR{WRID: w.WRID, SGEs: []memreg.SGE{umr.SGE(uint64(i*slot), uint32(slot))}})
			}
		}
	}()
	var procs []*proc
	for i := range 3 {
		procs = append(procs, startChildMode(t, "active", i, shared, peer, 0, false))
	}
	for i, p := range procs {
		r := fields(p.expect(t, "DONE"))
		t.Logf("child %d: %v", i, r)
		if r["misrouted"] != 0 || r["unknownqp"] != 0 || r["steered"] != r["rcvd"] {
			t.Errorf("child %d: %v", i, r)
		}
	}
}
