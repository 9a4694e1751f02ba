package transport

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

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
	// queued and handled count the packets put in the queue and those
	// the goroutine is done with; wait waits on done for a caller of
	// HandlePacket that is inside no Send.
	queued, handled uint64
	done            *sync.Cond
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
// goroutine that handles the queue if it is not running. It returns the
// packet's number for wait, 0 if the packet was dropped.
func (b *inbox) put(d *Device, buf []byte, src netip.Addr) uint64 {
	c := append([]byte(nil), buf...)
	b.mu.Lock()
	if len(b.q) >= inboxMax {
		b.mu.Unlock()
		inc(&d.ctr.InboxDropped)
		return 0
	}
	b.q = append(b.q, inboxPkt{buf: c, src: src})
	b.queued++
	seq := b.queued
	start := !b.running
	b.running = true
	b.mu.Unlock()
	inc(&d.ctr.InboxDeferred)
	if start {
		go b.run(d)
	}
	return seq
}

// wait returns once the goroutine is done with packet seq (put's
// number; 0 returns at once).
func (b *inbox) wait(seq uint64) {
	b.mu.Lock()
	if b.done == nil {
		b.done = sync.NewCond(&b.mu)
	}
	for b.handled < seq {
		b.done.Wait()
	}
	b.mu.Unlock()
}

// run handles the queued packets until there are none, waiting for the
// QPs' locks as a received batch does: it holds nothing and is inside no
// Link.Send.
func (b *inbox) run(d *Device) {
	var p packet.Packet
	first := true
	for {
		b.mu.Lock()
		if !first {
			b.handled++
			if b.done != nil {
				b.done.Broadcast()
			}
		}
		first = false
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

// sendFunc is the name runtime.CallersFrames gives Device.send.
const sendFunc = "github.com/gorocev2/rocev2/transport.(*Device).send"

// calledFromSend reports whether the calling goroutine is inside a
// Device.send (this device's or another's): a Link delivering in process
// whose Send came back into HandlePacket. Only such a caller may be what
// the holder of a lock HandlePacket needs is waiting for; any other
// caller waits for the lock as it always did. It walks the caller's
// stack, so it is asked only when a lock is found taken while a Send is
// under way.
func calledFromSend() bool {
	if testHookInSend.Load() {
		return true
	}
	var pcs [64]uintptr
	for skip := 2; ; skip += len(pcs) {
		n := runtime.Callers(skip, pcs[:])
		fr := runtime.CallersFrames(pcs[:n])
		for {
			f, more := fr.Next()
			if f.Function == sendFunc {
				return true
			}
			if !more {
				break
			}
		}
		if n < len(pcs) {
			return false // the whole stack was looked at
		}
	}
}

// testHookInSend makes calledFromSend report true: a test standing in
// for a Send (TestInboxOrderAndBound).
var testHookInSend atomic.Bool

// inputNoWait is QP.input outside a received batch (HandlePacket) that
// does not block on the QP's lock or the device's respMu when it is
// called from inside a Link.Send (calledFromSend) while they are taken
// and a Send of the device is under way: the holder may be waiting for
// that Send. It then reports false, having done nothing.
func (qp *QP) inputNoWait(p *packetT, up *udp.Packet) bool {
	d := qp.dev
	inSend := -1 // not asked yet
	lock := func(m *sync.Mutex) bool {
		if m.TryLock() {
			return true
		}
		if d.sending.Load() != 0 {
			if inSend < 0 {
				inSend = 0
				if calledFromSend() {
					inSend = 1
				}
			}
			if inSend == 1 {
				return false
			}
		}
		m.Lock() // the holder is not waiting for us
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
