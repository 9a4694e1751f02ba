package transport

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// gatedZCLink is a zero-copy link (udp.ZeroCopyLink) over a MemNetwork
// that reads each packet's Payload only inside Send, as the socket link's
// iovecs do, and holds the first Send that carries a packet gate picks
// until release is closed (a sendmmsg on a full socket buffer, a
// descheduled thread). It records whether any sent packet had its
// payload outside Buf.
type gatedZCLink struct {
	*memnet.MemLink
	gate    func(op bth.Opcode) bool
	once    sync.Once
	blocked chan struct{} // closed when the gated Send starts waiting
	release chan struct{}

	mu      sync.Mutex
	zcPkts  int // packets sent with Payload set
	allPkts int
}

func newGatedZCLink(t *testing.T, n *memnet.MemNetwork, addr netip.Addr, gate func(bth.Opcode) bool) *gatedZCLink {
	t.Helper()
	ml, err := n.Link(addr)
	if err != nil {
		t.Fatal(err)
	}
	return &gatedZCLink{MemLink: ml, gate: gate, blocked: make(chan struct{}), release: make(chan struct{})}
}

func (l *gatedZCLink) ZeroCopy() bool { return true }

func (l *gatedZCLink) Send(pkts []udp.Packet) error {
	for i := range pkts {
		if l.gate != nil && l.gate(bth.Opcode(pkts[i].Buf[0])) {
			l.once.Do(func() {
				close(l.blocked)
				<-l.release
			})
			break
		}
	}
	out := make([]udp.Packet, len(pkts))
	l.mu.Lock()
	for i := range pkts {
		if pkts[i].Payload != nil {
			l.zcPkts++
		}
		l.allPkts++
		out[i] = udp.Packet{Buf: pkts[i].AppendWire(nil), Addr: pkts[i].Addr, SrcPort: pkts[i].SrcPort, TOS: pkts[i].TOS}
	}
	l.mu.Unlock()
	return l.MemLink.Send(out)
}

// TestZeroCopyDeregisterWaitsForSend: a READ's responses, built as views
// of the responder's region (zero-copy), are in a Send that has not read
// them yet when the responder deregisters the region and then reuses the
// memory. Deregister must wait for that Send (MR.Deregister: when it
// returns no access reaches the memory), so the requester never receives
// a byte written after it returned. Before, Deregister returned at once
// and the READ delivered the reused memory (with mmap'd memory unmapped
// after Deregister, the process died of SIGSEGV in the link's send).
func TestZeroCopyDeregisterWaitsForSend(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{mtu: MTU4096, timeout: 8, retry: 1}
	o.defaults()
	a := newSide(t, n, addrA, &o)
	bl := newGatedZCLink(t, n, addrB, func(op bth.Opcode) bool { return op.Info().Kind == bth.KindReadResponse })
	b := newSideOn(t, bl, &o)
	if !b.dev.zc {
		t.Fatal("the responder's device does not send zero-copy")
	}
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	const size = 64 << 10
	dst, dmr := a.buffer(t, size, 0)
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	for i := range src {
		src[i] = 0xaa
	}
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size), RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bl.blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("no READ response was sent")
	}
	deregistered := make(chan error, 1)
	go func() {
		err := smr.Deregister()
		for i := range src {
			src[i] = 0x55 // the memory is the application's again
		}
		deregistered <- err
	}()
	var derr error
	select {
	case derr = <-deregistered:
		t.Errorf("Deregister returned (%v) while a Send was still to read its memory", derr)
		close(bl.release)
	case <-time.After(50 * time.Millisecond):
		close(bl.release)
		derr = <-deregistered
	}
	if derr != nil {
		t.Fatal(derr)
	}
	wc := waitWC(t, a.scq, 1, 10*time.Second)[0]
	if k := bytes.Count(dst, []byte{0x55}); k > 0 {
		t.Fatalf("the READ (%v) delivered %d bytes written after Deregister returned", wc.Status, k)
	}
	if bl.zcPkts == 0 {
		t.Error("no packet left zero-copy: the test did not test zero-copy")
	}
}

// TestZeroCopyDroppedAfterDeregister: a zero-copy packet whose memory was
// deregistered after it was queued is not handed to the link (it would
// carry memory the application owns again, or read unmapped memory); it
// is counted in zero_copy_dropped, and the packets around it still go.
func TestZeroCopyDroppedAfterDeregister(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	l := newGatedZCLink(t, n, addrA, nil)
	s := newSideOn(t, l, &o)
	buf, mr := s.buffer(t, 4096, memreg.AccessRemoteRead)
	_ = buf
	view, hold, err := s.pd.GatherView(sge(mr, 0, 2048), 0, 2048)
	if err != nil || view == nil || hold == nil {
		t.Fatalf("GatherView: %v %v %v", len(view), hold, err)
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	// Three ACK-sized packets to addrB; the middle one carries the view.
	mk := func() udp.Packet {
		b := make([]byte, 12+4+4)
		b[0] = byte(bth.RCAck)
		return udp.Packet{Buf: b, Addr: addrB, SrcPort: 49152}
	}
	pkts := []udp.Packet{mk(), mk(), mk()}
	pkts[1].Buf[0] = byte(bth.RCReadResponseOnly)
	pkts[1].Payload, pkts[1].Hold = view, hold
	before := s.dev.Counters()
	s.dev.send(pkts)
	after := s.dev.Counters()
	if l.allPkts != 2 || l.zcPkts != 0 {
		t.Errorf("link got %d packets (%d zero-copy), want the 2 without the deregistered view", l.allPkts, l.zcPkts)
	}
	if d := after.ZeroCopyDropped - before.ZeroCopyDropped; d != 1 {
		t.Errorf("zero_copy_dropped went up by %d, want 1", d)
	}
	if d := after.SentPkts - before.SentPkts; d != 2 {
		t.Errorf("sent_pkts went up by %d, want 2", d)
	}
}

// TestUCCompletionAfterPayloadRead: a UC send completes when its last
// packet is queued (no ACK will come), and verbs lets the application
// reuse the buffer then; so UC must not leave its payload for the link to
// read later (zero-copy). The link holds the first UC SEND; the buffer is
// overwritten once the send has completed; the receiver must get the
// bytes as posted. Before, it got the overwritten ones (84 of 2,969
// messages over real sockets).
func TestUCCompletionAfterPayloadRead(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	la := newGatedZCLink(t, n, netip.MustParseAddr("192.0.2.1"), func(op bth.Opcode) bool { return op == bth.UCSendOnly })
	lb, err := n.Link(netip.MustParseAddr("192.0.2.2"))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(l udp.Link) *side {
		dev, err := NewDevice(l, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(64)
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeUC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		return &side{dev: dev, pd: pd, scq: cq, rcq: cq, qp: qp}
	}
	a, b := mk(la), mk(lb)
	if !a.dev.zc {
		t.Fatal("the sender's device does not send zero-copy")
	}
	for _, c := range []struct {
		s, peer *side
	}{{a, b}, {b, a}} {
		if err := c.s.qp.Connect(ConnParams{Peer: c.peer.dev.Addr(), DestQPN: c.peer.qp.QPN(), SQPSN: 1, RQPSN: 1, PathMTU: MTU4096}); err != nil {
			t.Fatal(err)
		}
	}
	const size = 2048
	src, smr := a.buffer(t, size, 0)
	dst, dmr := b.buffer(t, size, 0)
	fill(src, 9)
	want := bytes.Clone(src)
	if err := b.qp.PostRecv(RecvWR{WRID: 2, SGEs: sge(dmr, 0, size)}); err != nil {
		t.Fatal(err)
	}
	posted := make(chan error, 1)
	go func() {
		posted <- a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, size)})
	}()
	select {
	case <-la.blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("the UC SEND was not sent")
	}
	// The send completes while the link still holds the packet (or, with
	// the payload copied, whenever it does): wait for it, then reuse.
	var wc [1]WC
	deadline := time.Now().Add(200 * time.Millisecond)
	for a.scq.Poll(wc[:]) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	completed := wc[0].WRID == 1
	for i := range src {
		src[i] = 0x55
	}
	close(la.release)
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	if !completed {
		if wcs := waitWC(t, a.scq, 1, 5*time.Second); wcs[0].WRID != 1 || wcs[0].Status != WCSuccess {
			t.Fatalf("send completion %+v", wcs[0])
		}
	}
	if wcs := waitWC(t, b.rcq, 1, 5*time.Second); wcs[0].WRID != 2 || wcs[0].Status != WCSuccess || wcs[0].ByteLen != size {
		t.Fatalf("receive completion %+v", wcs[0])
	}
	if !bytes.Equal(dst, want) {
		t.Fatalf("the receiver got %d bytes written after the send completed", bytes.Count(dst, []byte{0x55}))
	}
}

// TestFlushOutDropsZeroCopyViews: once the output queue is sent, no slot
// of it still points into registered memory or holds the region (flushOut
// clears a zero-copy packet's Payload and Hold; it tests for them rather
// than clearing every slot).
func TestFlushOutDropsZeroCopyViews(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{mtu: MTU4096}
	o.defaults()
	al := newGatedZCLink(t, n, addrA, nil)
	a := newSideOn(t, al, &o)
	b := newSide(t, n, addrB, &o)
	if !a.dev.zc {
		t.Fatal("the requester's device does not send zero-copy")
	}
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	const size = 16 << 10
	_, smr := a.buffer(t, size, 0)
	_, dmr := b.buffer(t, size, memreg.AccessRemoteWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, size),
		RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("WRITE: %v", wc.Status)
	}
	al.mu.Lock()
	zc := al.zcPkts
	al.mu.Unlock()
	if zc == 0 {
		t.Fatal("no packet was sent zero-copy")
	}
	a.qp.mu.Lock()
	defer a.qp.mu.Unlock()
	for i := range a.qp.out {
		if p := &a.qp.out[i]; p.Payload != nil || p.Hold != nil || p.Buf != nil {
			t.Fatalf("output slot %d after the flush: Buf %v, Payload %v, Hold %v", i, p.Buf != nil, p.Payload != nil, p.Hold != nil)
		}
	}
}
