package transport

import (
	"testing"
	"unsafe"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// TestOutSlab: small packets queued on a QP lie back to back in its slabs
// (a new slab when one is full), each capped at its length; a large packet
// takes a buffer of its own in between; the flush sends them all intact
// and ends the slabs (a hot QP keeps its first in place), and responses
// taken into a batch (takeOut) carry their slabs with them.
func TestOutSlab(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	qp := a.qp
	qp.mu.Lock()
	defer qp.mu.Unlock()
	small := make([]byte, 400)
	ack := func(psn uint32) { // a small SEND, 416 bytes
		f := packet.Fields{}
		f.BTH.Opcode = bth.RCSendOnly
		f.BTH.DestQP = qp.attr.DestQPN
		f.BTH.PSN = bth.PSN(psn)
		f.Payload = small
		buf := qp.outBufN(packet.Len(bth.RCSendOnly, len(small)))
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		qp.commit(n)
	}
	big := func() {
		f := packet.Fields{}
		f.BTH.Opcode = bth.RCSendOnly
		f.BTH.DestQP = qp.attr.DestQPN
		f.Payload = make([]byte, 2048)
		n, err := packet.Build(qp.outBuf(), &f)
		if err != nil {
			t.Fatal(err)
		}
		qp.commit(n)
	}
	size := packet.Len(bth.RCSendOnly, len(small))
	perSlab := udp.MaxPacketSize / size
	for i := range perSlab + 3 {
		ack(uint32(i))
	}
	big()
	ack(1000)
	if qp.nout != perSlab+5 || len(qp.slabs) != 2 {
		t.Fatalf("%d packets queued in %d slabs, want %d in 2", qp.nout, len(qp.slabs), perSlab+5)
	}
	for i := 0; i < qp.nout; i++ {
		p := qp.out[i].Buf
		if i != perSlab+3 && cap(p) != len(p) {
			t.Fatalf("packet %d: cap %d len %d: the next packet's bytes are reachable", i, cap(p), len(p))
		}
		if i > 0 && i < perSlab && uintptr(unsafe.Pointer(&p[0])) != uintptr(unsafe.Pointer(&qp.out[i-1].Buf[0]))+uintptr(len(qp.out[i-1].Buf)) {
			t.Fatalf("packet %d does not follow packet %d in the slab", i, i-1)
		}
	}
	if bth.BTH(qp.out[perSlab+3].Buf).Opcode() != bth.RCSendOnly || len(qp.out[perSlab+3].Buf) < 2048 {
		t.Fatalf("large packet: %v, %d bytes", bth.BTH(qp.out[perSlab+3].Buf).Opcode(), len(qp.out[perSlab+3].Buf))
	}
	// Taken as a batch's responses: the slabs go along.
	var pkts []udp.Packet
	var bufs []*[udp.MaxPacketSize]byte
	pkts, bufs = qp.takeOut(pkts, bufs)
	slabs := 0
	for _, s := range bufs {
		if s != nil {
			slabs++
		}
	}
	if len(pkts) != perSlab+5 || slabs != 3 || len(qp.slabs) != 0 {
		t.Fatalf("takeOut: %d packets, %d buffers (want the large packet's and 2 slabs), %d slabs left", len(pkts), slabs, len(qp.slabs))
	}
	for i, p := range pkts[:perSlab] {
		if bth.BTH(p.Buf).PSN() != bth.PSN(i) {
			t.Fatalf("taken packet %d: PSN %v", i, bth.BTH(p.Buf).PSN())
		}
	}
	// A flush sends them intact and ends the slabs.
	for range 3 {
		ack(7)
	}
	qp.flushOut()
	if qp.nout != 0 || len(qp.slabs) != 0 || qp.slabOff != 0 {
		t.Fatalf("after flush: %d queued, %d slabs, offset %d", qp.nout, len(qp.slabs), qp.slabOff)
	}
	// A hot QP (its ACK timer kept armed) keeps its first slab in place
	// across a flush, and its next packets start at the slab's start;
	// going cold (dropSpare) gives it back.
	armed, cold := qp.tmr.timerArmed, qp.tmr.coldIdle
	qp.tmr.timerArmed, qp.tmr.coldIdle = true, false
	for range perSlab + 1 {
		ack(8)
	}
	first := qp.slabs[0]
	qp.flushOut()
	if qp.nout != 0 || len(qp.slabs) != 1 || qp.slabs[0] != first || qp.slabOff != 0 {
		t.Fatalf("hot QP after flush: %d queued, %d slabs (the first kept: %v), offset %d", qp.nout, len(qp.slabs), len(qp.slabs) > 0 && qp.slabs[0] == first, qp.slabOff)
	}
	ack(9)
	if &qp.out[0].Buf[0] != &first[0] || bth.BTH(qp.out[0].Buf).PSN() != 9 {
		t.Fatal("the next packet is not at the start of the kept slab")
	}
	qp.flushOut()
	// One slab (flushOut's in-line case of releaseSlabs): kept, and
	// the next packet again at its start.
	if len(qp.slabs) != 1 || qp.slabs[0] != first || qp.slabOff != 0 {
		t.Fatalf("hot QP after its second flush: %d slabs, offset %d", len(qp.slabs), qp.slabOff)
	}
	ack(10)
	if &qp.out[0].Buf[0] != &first[0] || bth.BTH(qp.out[0].Buf).PSN() != 10 {
		t.Fatal("after a flush of one slab, the next packet is not at the start of the kept slab")
	}
	qp.flushOut()
	qp.tmr.timerArmed, qp.tmr.coldIdle = armed, cold
	qp.dropSpare()
	if len(qp.slabs) != 0 {
		t.Fatalf("cold QP: %d slabs kept", len(qp.slabs))
	}
}
