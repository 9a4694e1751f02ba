package transport

import (
	"net/netip"
	"runtime"
	"sync"

	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// inbox holds the packets HandlePacket left for later (inputNoWait),
// handled in order by a goroutine that runs while it has any.
//
// A Link may call a device's HandlePacket from inside its Send: an
// in-process pipe between two devices hands each packet to the peer,
// whose answer (an ACK) comes back into the sender's HandlePacket while
// the sender's QP lock, or the device's respMu, is held further up the
// same goroutine — or by another goroutine whose Send is waiting for
// this one the other way round. Waiting for that lock there is a
// deadlock (TestSynchronousPipeLink). The goroutine here holds nothing
// when it waits for a QP, and the Sends it makes may come back into
// HandlePacket, which again leaves what it cannot take at once here.
type inbox struct {
	mu      sync.Mutex
	q       []inboxPkt
	running bool // a goroutine is handling the queue
}

type inboxPkt struct {
	buf []byte
	src netip.Addr
}

// busy reports that packets are queued or being handled: HandlePacket
// queues behind them to keep its order.
func (b *inbox) busy() bool {
	b.mu.Lock()
	r := b.running
	b.mu.Unlock()
	return r
}

// inboxMax bounds the packets the inbox holds: a Link delivering faster
// than the device handles them loses the rest, as a full receive queue
// does (handle_packet_dropped), instead of growing without bound.
const inboxMax = 4096

// put queues a copy of buf (the caller may reuse it) and starts the
// goroutine that handles the queue if it is not running.
func (b *inbox) put(d *Device, buf []byte, src netip.Addr) {
	c := append([]byte(nil), buf...)
	b.mu.Lock()
	if len(b.q) >= inboxMax {
		b.mu.Unlock()
		inc(&d.ctr.InboxDropped)
		return
	}
	b.q = append(b.q, inboxPkt{buf: c, src: src})
	start := !b.running
	b.running = true
	b.mu.Unlock()
	inc(&d.ctr.InboxDeferred)
	if start {
		go b.run(d)
	}
}

// run handles the queued packets until there are none, waiting for the
// QPs' locks as a received batch does: it holds nothing and is inside no
// Link.Send.
func (b *inbox) run(d *Device) {
	var p packet.Packet
	for {
		b.mu.Lock()
		if len(b.q) == 0 {
			b.q = nil
			b.running = false
			b.mu.Unlock()
			return
		}
		e := b.q[0]
		b.q[0] = inboxPkt{}
		b.q = b.q[1:]
		b.mu.Unlock()
		if d.isClosed() {
			continue
		}
		if p.Parse(e.buf) != nil {
			continue // parsed once by HandlePacket
		}
		qp, err := d.route(&p)
		if err != nil {
			continue // counted by route: the QP went away meanwhile
		}
		qp.input(&p, &udp.Packet{Buf: e.buf, Addr: e.src}, false)
	}
}

// inputSpins is how many times inputNoWait yields for a lock held while a
// Send is under way before it leaves the packet to the inbox.
const inputSpins = 64

// inputNoWait is QP.input outside a received batch (HandlePacket) that
// does not block on the QP's lock or the device's respMu while a
// Link.Send of the device is under way: the caller may be inside that
// Send, and the holder waiting for it. It yields a few times
// (inputSpins) for the lock, then reports false, having done nothing.
func (qp *QP) inputNoWait(p *packetT, up *udp.Packet) bool {
	d := qp.dev
	lock := func(m *sync.Mutex) bool {
		if m.TryLock() {
			return true
		}
		// A holder whose Send does not come back here (another
		// goroutine's, the usual case) lets go within a few yields;
		// one whose Send is this call's caller never does.
		for i := 0; d.sending.Load() != 0; i++ {
			if i == inputSpins {
				return false
			}
			runtime.Gosched()
			if m.TryLock() {
				return true
			}
		}
		m.Lock() // no Send under way: the holder is not waiting for us
		return true
	}
	for {
		if !lock(&qp.mu) {
			return false
		}
		// afterTakenResponses, not waiting under qp.mu either.
		if d.respMu.TryLock() {
			d.respMu.Unlock()
			break
		}
		qp.mu.Unlock()
		if !lock(&d.respMu) {
			return false
		}
		d.respMu.Unlock()
	}
	qp.inputLocked(p, up, false)
	qp.mu.Unlock()
	return true
}
