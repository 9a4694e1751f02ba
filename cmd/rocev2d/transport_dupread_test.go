package main

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// TestTransportLateDuplicateRead shows a transport bug found by
// `rocev2d demo --mem --loss ... --reorder ...`: a late duplicate READ
// request (a retransmission or network duplicate that arrives after the READ
// completed and the application deregistered the region) makes the
// responder send NAK REMOTE_ACCESS_ERROR and move its QP to ERR; every later
// request on the connection is then dropped and the requester fails with
// "transport retry counter exceeded". A duplicate request must never be
// fatal to the responder (rxe replays from its saved resource, which holds
// the MR, or drops the duplicate: rxe_resp.c duplicate_request, "Class D
// error. Drop the request"). Owner: transport (engineer F); run with
// ROCEV2_KNOWN_BUGS=1 until fixed.
func TestTransportLateDuplicateRead(t *testing.T) {
	if os.Getenv("ROCEV2_KNOWN_BUGS") == "" {
		t.Skip("known transport bug (late duplicate READ after deregistration kills the responder QP); set ROCEV2_KNOWN_BUGS=1 to run")
	}
	n := udp.NewMemNetwork(udp.Faults{})
	addrA, addrB := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	la, _ := n.Link(addrA)
	lb, _ := n.Link(addrB)
	a, err := newDemoEnd("A", la)
	if err != nil {
		t.Fatal(err)
	}
	defer a.dev.Close()
	b, err := newDemoEnd("B", lb)
	if err != nil {
		t.Fatal(err)
	}
	defer b.dev.Close()
	acc := memreg.AccessRemoteWrite | memreg.AccessRemoteRead
	if err := connectRC(a.qp, addrB, b.qp.QPN(), 100, 500, transport.MTU1024, 16, acc, 14); err != nil {
		t.Fatal(err)
	}
	if err := connectRC(b.qp, addrA, a.qp.QPN(), 500, 100, transport.MTU1024, 16, acc, 14); err != nil {
		t.Fatal(err)
	}
	local := make([]byte, 4096)
	lmr, _ := a.pd.RegisterMR(local, memreg.AccessLocalWrite)
	remote := make([]byte, 4096)
	rmr, _ := b.pd.RegisterMR(remote, memreg.AccessLocalWrite|acc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	post := func(op transport.WROpcode, mr *memreg.MR) transport.WC {
		t.Helper()
		err := a.qp.PostSend(transport.SendWR{Opcode: op, Flags: transport.SendSignaled,
			SGEs:       []memreg.SGE{{Addr: lmr.IOVA(), Length: 4096, LKey: lmr.LKey()}},
			RemoteAddr: mr.IOVA(), RKey: mr.RKey()})
		if err != nil {
			t.Fatal(err)
		}
		wcs, err := demoWait(ctx, a.scq, 1)
		if err != nil {
			t.Fatal(err)
		}
		return wcs[0]
	}
	// 1. A READ of 4 KiB (PSNs 100..103) completes.
	if wc := post(transport.WRRead, rmr); wc.Status != transport.WCSuccess {
		t.Fatalf("READ: %v", wc.Status)
	}
	// 2. B's application deregisters the region.
	if err := rmr.Deregister(); err != nil {
		t.Fatal(err)
	}
	// 3. A late duplicate of the READ request (PSN 100) reaches B.
	buf := make([]byte, udp.MaxPacketSize)
	k, err := packet.Build(buf, &packet.Fields{
		BTH:  bth.Fields{Opcode: bth.RCReadRequest, PKey: bth.DefaultPKey, DestQP: b.qp.QPN(), PSN: 100, AckReq: true},
		RETH: reth.Fields{VA: rmr.IOVA(), RKey: rmr.RKey(), DMALength: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.dev.HandlePacket(buf[:k], addrA); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	// The responder must still be usable.
	if st := b.qp.State(); st != transport.QPSRTS {
		t.Errorf("responder QP state %v after a duplicate READ request, want RTS", st)
	}
	remote2 := make([]byte, 4096)
	rmr2, _ := b.pd.RegisterMR(remote2, memreg.AccessLocalWrite|acc)
	if wc := post(transport.WRWrite, rmr2); wc.Status != transport.WCSuccess {
		t.Errorf("WRITE after the duplicate: %v, want success", wc.Status)
	}
}
