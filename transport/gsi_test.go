package transport

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

func testMAD(class, method uint8, tid uint64) []byte {
	m := make([]byte, MADSize)
	m[madBaseVersion], m[madMgmtClass], m[2], m[madMethod] = 1, class, 2, method
	binary.BigEndian.PutUint64(m[madTID:], tid)
	return m
}

// gsiPkt builds a UD SEND_ONLY to QP1 with the given Q_Key and payload.
func gsiPkt(t *testing.T, qkey uint32, payload []byte) []byte {
	t.Helper()
	var f packet.Fields
	f.BTH.Opcode = bth.UDSendOnly
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = 1
	f.DETH.QKey = qkey
	f.DETH.SrcQP = 1
	f.Payload = payload
	buf := make([]byte, udp.MaxPacketSize)
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestGSI: MADs travel between two devices' QP1s to the agent of their
// class; responses find the agent by transaction ID; every kind of bad
// datagram is dropped and counted under its reason; a full agent queue
// drops instead of growing.
func TestGSI(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	ga, err := a.dev.GSI()
	if err != nil {
		t.Fatal(err)
	}
	gb, _ := b.dev.GSI()
	if g2, _ := a.dev.GSI(); g2 != ga {
		t.Fatal("GSI() opened QP1 twice")
	}
	cmA, _ := ga.Register(7, 4)
	cmB, _ := gb.Register(7, 2)
	if _, err := gb.Register(7, 1); err == nil {
		t.Fatal("two agents for one class")
	}
	saB, _ := gb.Register(3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	req := testMAD(7, 0x03, cmA.NewTID())
	if err := cmA.Send(b.dev.Addr(), 1, 0, req); err != nil {
		t.Fatal(err)
	}
	m, err := cmB.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Src != a.dev.Addr() || m.SrcQP != 1 || m.Data != [MADSize]byte(req) {
		t.Fatalf("MAD from %v qp %d differs", m.Src, m.SrcQP)
	}
	// A response (R bit) carrying saB's TID goes to saB, not to the class-7 agent... only if the class matches.
	resp := testMAD(3, 0x81, saB.NewTID())
	if err := cmA.Send(b.dev.Addr(), 1, 0, resp); err != nil {
		t.Fatal(err)
	}
	if m, err := saB.Recv(ctx); err != nil || m.Data[madMethod] != 0x81 {
		t.Fatalf("response: %v", err)
	}

	// Drops, each counted under its reason.
	feed := func(pkt []byte) {
		if err := b.dev.HandlePacket(pkt, a.dev.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	feed(gsiPkt(t, 0x11111111, testMAD(7, 3, 1)))    // Q_Key
	feed(gsiPkt(t, GSIQKey, testMAD(7, 3, 1)[:128])) // size
	bad := testMAD(7, 3, 1)
	bad[0] = 2
	feed(gsiPkt(t, GSIQKey, bad))                 // base version
	feed(gsiPkt(t, GSIQKey, testMAD(0x42, 3, 1))) // no agent
	for i := 0; i < 3; i++ {                      // queue of 2: one dropped
		feed(gsiPkt(t, GSIQKey, testMAD(7, 3, uint64(i))))
	}
	c := b.dev.Counters()
	if c.MADDropQKey != 1 || c.MADDropSize != 1 || c.MADDropVersion != 1 || c.MADDropNoAgent != 1 || c.MADDropQueueFull != 1 {
		t.Fatalf("drop counters qkey %d size %d version %d no_agent %d queue_full %d", c.MADDropQKey, c.MADDropSize,
			c.MADDropVersion, c.MADDropNoAgent, c.MADDropQueueFull)
	}
	if c.MADRcvd != 4 || a.dev.Counters().MADSent != 2 {
		t.Fatalf("mad_rcvd %d (want 4) mad_sent %d (want 2)", c.MADRcvd, a.dev.Counters().MADSent)
	}
	// QP1 is never handed out, and a user QP cannot be QPN 1.
	if b.qp.QPN() == 1 {
		t.Fatal("user QP got QPN 1")
	}
	cmB.Close()
	if _, err := cmB.Recv(ctx); err == nil {
		t.Fatal("Recv after Close")
	}
}
