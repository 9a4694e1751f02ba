package transport

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// pipeLink is the in-process link a Go user writes first: Send hands
// every packet straight to the peer device's HandlePacket, in the
// sending goroutine, and Recv has nothing to return until Close.
type pipeLink struct {
	addr   netip.Addr
	mu     sync.Mutex
	peer   *Device
	closed chan struct{}
	once   sync.Once
}

func newPipeLink(a netip.Addr) *pipeLink {
	return &pipeLink{addr: a, closed: make(chan struct{})}
}

func (l *pipeLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	peer := l.peer
	l.mu.Unlock()
	for i := range pkts {
		b := pkts[i].AppendWire(nil)
		if peer != nil {
			peer.HandlePacket(b, l.addr)
		}
	}
	return nil
}

func (l *pipeLink) Recv(pkts []udp.Packet) (int, error) {
	<-l.closed
	return 0, net.ErrClosed
}

func (l *pipeLink) LocalAddr() netip.Addr { return l.addr }
func (l *pipeLink) BatchSize() int        { return 8 }
func (l *pipeLink) Stats() udp.Stats      { return udp.Stats{} }
func (l *pipeLink) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// TestSynchronousPipeLink: two devices joined by a Link whose Send calls
// the peer's HandlePacket. A SEND from A makes B's QP answer with an ACK
// from inside A's Send, which came back into A's HandlePacket while A's
// QP lock (and, from a received batch, the device's respMu) was held up
// the same goroutine's stack: the first message deadlocked. HandlePacket
// now leaves a packet it cannot take without waiting to the device's
// input queue; everything completes, in both directions at once.
func TestSynchronousPipeLink(t *testing.T) {
	la, lb := newPipeLink(addrA), newPipeLink(addrB)
	var o pairOpts
	o.defaults()
	mk := func(l udp.Link) *side {
		dev, err := NewDevice(l, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		pd, _ := dev.AllocPD()
		scq, _ := dev.CreateCQ(1024)
		rcq, _ := dev.CreateCQ(1024)
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: rcq,
			MaxSendWR: 256, MaxRecvWR: 256, MaxSGE: 4})
		if err != nil {
			t.Fatal(err)
		}
		return &side{dev: dev, pd: pd, scq: scq, rcq: rcq, qp: qp}
	}
	a, b := mk(la), mk(lb)
	la.peer, lb.peer = b.dev, a.dev
	connect(t, a, b, addrB, 100, 200, &o)
	connect(t, b, a, addrA, 200, 100, &o)

	const msgs, size = 64, 3000
	type end struct {
		s, peer *side
		src     []byte
		dst     []byte
		dstMR   *memreg.MR
	}
	ends := [2]*end{{s: a, peer: b}, {s: b, peer: a}}
	for i, e := range ends {
		var srcMR *memreg.MR
		e.src, srcMR = e.s.buffer(t, size*msgs, 0)
		fill(e.src, uint64(i+1))
		e.dst, e.dstMR = e.s.buffer(t, size*msgs, memreg.AccessRemoteWrite)
		for m := 0; m < msgs; m++ {
			if err := e.s.qp.PostRecv(RecvWR{WRID: uint64(m), SGEs: sge(e.dstMR, m*size, size)}); err != nil {
				t.Fatal(err)
			}
		}
		_ = srcMR
	}
	done := make(chan error, 2)
	for _, e := range ends {
		go func() {
			srcMR, _ := e.s.pd.RegisterMR(e.src, memreg.AccessLocalWrite)
			for m := 0; m < msgs; m++ {
				op := WRSend
				wr := SendWR{WRID: uint64(m), Opcode: op, Flags: SendSignaled, SGEs: sge(srcMR, m*size, size)}
				if err := e.s.qp.PostSend(wr); err != nil {
					done <- err
					return
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			wcs := make([]WC, 16)
			for got := 0; got < msgs; {
				n, err := e.s.scq.Wait(ctx, wcs)
				if err != nil {
					done <- err
					return
				}
				for _, wc := range wcs[:n] {
					if wc.Status != WCSuccess {
						t.Errorf("send completion %+v", wc)
					}
				}
				got += n
			}
			done <- nil
		}()
	}
	deadlocked := false
	for range ends {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			deadlocked = true
		}
		if deadlocked {
			break
		}
	}
	if deadlocked {
		// Closing would wait on the locks the stuck goroutines hold:
		// leave the devices to the end of the test binary.
		t.Fatal("the devices deadlocked: a synchronous Link's Send re-entered HandlePacket")
	}
	for i, e := range ends {
		r := waitWC(t, e.peer.rcq, msgs, 10*time.Second)
		for j, wc := range r {
			if wc.Status != WCSuccess || wc.WRID != uint64(j) || wc.ByteLen != size {
				t.Fatalf("recv completion %d: %+v", j, wc)
			}
		}
		if !bytes.Equal(e.src, ends[1-i].dst) {
			t.Fatal("received data differs")
		}
	}
	if a.dev.Counters().InboxDeferred == 0 && b.dev.Counters().InboxDeferred == 0 {
		t.Error("no packet was left to the inbox: the re-entered HandlePacket was not exercised")
	}
	a.dev.Close()
	b.dev.Close()
}

// TestInboxOrderAndBound: packets HandlePacket cannot take while their QP
// is busy and a Send is under way are handled later in the order given,
// and the inbox holds at most inboxMax of them (the rest are dropped and
// counted, not queued without bound).
func TestInboxOrderAndBound(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_ = a
	const extra = 10
	dst, dmr := b.buffer(t, inboxMax+extra, memreg.AccessRemoteWrite)
	psn := bth.PSN(0xfffff0) // b's expected PSN (newPair)
	build := func(i int) []byte {
		var f packet.Fields
		f.BTH = bth.Fields{Opcode: bth.RCWriteOnly, PKey: bth.DefaultPKey, DestQP: b.qp.QPN(), PSN: psn.Add(i)}
		f.RETH = packetRETH(dmr.IOVA()+uint64(i), dmr.RKey(), 1)
		f.Payload = []byte{byte(i%255 + 1)}
		buf := make([]byte, 128)
		k, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:k]
	}
	before := b.dev.Counters()
	b.qp.mu.Lock()
	b.dev.sending.Add(1)       // as if the QP's holder were inside a Link.Send
	testHookInSend.Store(true) // and this goroutine inside one
	defer testHookInSend.Store(false)
	for i := range inboxMax + extra {
		if err := b.dev.HandlePacket(build(i), addrA); err != nil {
			t.Fatal(err)
		}
	}
	b.dev.sending.Add(-1)
	b.qp.mu.Unlock()
	for i := 0; b.dev.inbox.busy(); i++ {
		if i > 2000 {
			t.Fatal("the inbox was never emptied")
		}
		time.Sleep(5 * time.Millisecond)
	}
	after := b.dev.Counters()
	// The goroutine may have taken the first one out of the queue (and
	// wait for the QP) before the queue filled.
	deferred, dropped := after.InboxDeferred-before.InboxDeferred, after.InboxDropped-before.InboxDropped
	if deferred+dropped != inboxMax+extra || deferred < inboxMax || deferred > inboxMax+1 {
		t.Errorf("handle_packet_deferred +%d, handle_packet_dropped +%d; want %d or %d deferred, the rest of %d dropped",
			deferred, dropped, inboxMax, inboxMax+1, inboxMax+extra)
	}
	b.qp.mu.Lock()
	defer b.qp.mu.Unlock()
	for i := range inboxMax {
		if dst[i] != byte(i%255+1) {
			t.Fatalf("byte %d is %#x, want %#x: the WRITEs were not all placed, in order", i, dst[i], byte(i%255+1))
		}
	}
}
