package transport

import (
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// sendGateLink is a pipeLink whose Send, once armed, stops until released: a
// Send that takes long (a full socket, a descheduled thread) and never
// comes back into HandlePacket.
type sendGateLink struct {
	*pipeLink
	entered chan struct{}
	release chan struct{}
}

func (l *sendGateLink) Send(pkts []udp.Packet) error {
	if l.entered != nil {
		close(l.entered)
		<-l.release
	}
	return l.pipeLink.Send(pkts)
}

// TestHandlePacketWaitsForAnotherGoroutinesSend: a HandlePacket from a
// goroutine that is inside no Link.Send, for a QP whose lock another
// goroutine holds while its Send is slow, returns once the packet is
// handled, as it did before the inbox: its caller (a replay, an
// injecting test) may look at the effect right after. It returned after
// 64 yields with the packet left to the inbox, still unhandled.
func TestHandlePacketWaitsForAnotherGoroutinesSend(t *testing.T) {
	gl := &sendGateLink{pipeLink: newPipeLink(addrB)}
	var o pairOpts
	o.defaults()
	mk := func(l udp.Link) *side {
		dev, err := NewDevice(l, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		pd, _ := dev.AllocPD()
		scq, _ := dev.CreateCQ(64)
		rcq, _ := dev.CreateCQ(64)
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: rcq,
			MaxSendWR: 16, MaxRecvWR: 16, MaxSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		return &side{dev: dev, pd: pd, scq: scq, rcq: rcq, qp: qp}
	}
	a, b := mk(newPipeLink(addrA)), mk(gl)
	defer a.dev.Close()
	defer b.dev.Close()
	const psn = 0x100
	connect(t, a, b, addrB, psn, 0x200, &o)
	connect(t, b, a, addrA, 0x200, psn, &o)
	dst, dmr := b.buffer(t, 1, memreg.AccessRemoteWrite)
	var f packet.Fields
	f.BTH = bth.Fields{Opcode: bth.RCWriteOnly, PKey: bth.DefaultPKey, DestQP: b.qp.QPN(), PSN: psn}
	f.RETH = packetRETH(dmr.IOVA(), dmr.RKey(), 1)
	f.Payload = []byte{0x5a}
	buf := make([]byte, 128)
	k, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}

	// Another goroutine holds b's QP inside a Send that stops.
	gl.entered, gl.release = make(chan struct{}), make(chan struct{})
	held := make(chan struct{})
	go func() {
		b.qp.mu.Lock()
		b.dev.send([]udp.Packet{{Buf: make([]byte, 64), Addr: addrA}})
		b.qp.mu.Unlock()
		close(held)
	}()
	<-gl.entered

	returned := make(chan struct{})
	go func() {
		if err := b.dev.HandlePacket(buf[:k], addrA); err != nil {
			t.Error(err)
		}
		close(returned)
	}()
	select {
	case <-returned:
		close(gl.release)
		<-held
		t.Fatalf("HandlePacket returned while its QP was held by another goroutine's Send: the WRITE was left unhandled (handle_packet_deferred %d)",
			b.dev.Counters().InboxDeferred)
	case <-time.After(300 * time.Millisecond):
		// Still waiting for the QP, as it should: let the Send finish.
	}
	close(gl.release)
	<-returned
	<-held
	b.qp.mu.Lock()
	got := dst[0]
	b.qp.mu.Unlock()
	if got != 0x5a {
		t.Errorf("after HandlePacket returned the byte is %#x, want 0x5a", got)
	}
	if n := b.dev.Counters().InboxDeferred; n != 0 {
		t.Errorf("handle_packet_deferred %d, want 0: no Send re-entered HandlePacket", n)
	}
}

// probeLink records, from deep inside its Send, whether calledFromSend
// sees the Device.send it was called from.
type probeLink struct {
	*pipeLink
	depth int
	saw   []bool
}

func (l *probeLink) Send(pkts []udp.Packet) error {
	var down func(int) bool
	down = func(n int) bool {
		if n == 0 {
			return calledFromSend()
		}
		return down(n - 1)
	}
	l.saw = append(l.saw, down(l.depth))
	return nil
}

// TestCalledFromSendDeepStack: a Link whose Send goes through many frames
// (wrappers, fault injectors) before it hands a packet to HandlePacket is
// still known to be inside a Send: HandlePacket must not wait there.
// Outside any Send it is not.
func TestCalledFromSendDeepStack(t *testing.T) {
	pl := &probeLink{pipeLink: newPipeLink(addrA)}
	dev, err := NewDevice(pl, DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	for _, depth := range []int{0, 10, 63, 64, 65, 200} {
		pl.depth = depth
		dev.send([]udp.Packet{{Buf: make([]byte, 64), Addr: addrB}})
	}
	for i, ok := range pl.saw {
		if !ok {
			t.Errorf("send %d: calledFromSend false inside a Send", i)
		}
	}
	if calledFromSend() {
		t.Error("calledFromSend true outside any Send")
	}
}
