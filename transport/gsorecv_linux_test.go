//go:build linux

package transport

import (
	"bytes"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestSocketGSOTransfer moves 64 KiB WRITEs, READs and SENDs, several per
// PostSend (more packets than a QP's first output queue holds), between
// two devices on SocketLinks with GSO and GRO — the receive path that
// hands packets out of the link's GRO buffers in place — and checks every
// byte that arrived.
func TestSocketGSOTransfer(t *testing.T) {
	pid := os.Getpid()
	b1, b2 := byte(40+pid%200), byte(1+(pid/200)%250)
	addrA, addrB := netip.AddrFrom4([4]byte{127, b1, b2, 75}), netip.AddrFrom4([4]byte{127, b1, b2, 76})
	a, r := newSocketPairAt(t, &udp.SocketOptions{GSO: true}, addrA, addrB)
	const size, msgs = 1 << 16, 6
	src, smr := a.buffer(t, size*msgs, 0)
	dst, dmr := r.buffer(t, size*msgs, memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
	back, bmr := a.buffer(t, size*msgs, 0)
	recvd, rmr := r.buffer(t, size*msgs, 0)
	fill(src, 1)
	post := func(op WROpcode, lmr *memreg.MR) {
		t.Helper()
		wrs := make([]SendWR, msgs)
		for i := range wrs {
			wrs[i] = SendWR{Opcode: op, Flags: SendSignaled, SGEs: sge(lmr, i*size, size),
				RemoteAddr: dmr.IOVA() + uint64(i*size), RKey: dmr.RKey()}
		}
		if err := a.qp.PostSend(wrs...); err != nil {
			t.Fatal(err)
		}
		for _, wc := range waitWC(t, a.scq, msgs, 20*time.Second) {
			if wc.Status != WCSuccess {
				t.Fatalf("%v: %+v", op, wc)
			}
		}
	}
	// The target's memory is written and read by B's receiving goroutine
	// under its QP's lock, which gives the race detector the order the
	// network gives (a socket carries no happens-before edge).
	underB := func(f func()) {
		r.qp.mu.Lock()
		defer r.qp.mu.Unlock()
		f()
	}
	post(WRWrite, smr)
	underB(func() {})
	if !bytes.Equal(dst, src) {
		t.Fatal("WRITE: target memory differs from the source")
	}
	underB(func() { fill(dst, 2) }) // READ brings back what is there now
	post(WRRead, bmr)
	if !bytes.Equal(back, dst) {
		t.Fatal("READ: local memory differs from the remote")
	}
	for i := range msgs {
		if err := r.qp.PostRecv(RecvWR{SGEs: sge(rmr, i*size, size)}); err != nil {
			t.Fatal(err)
		}
	}
	post(WRSend, smr)
	for _, wc := range waitWC(t, r.rcq, msgs, 20*time.Second) {
		if wc.Status != WCSuccess || wc.ByteLen != size {
			t.Fatalf("receive: %+v", wc)
		}
	}
	if !bytes.Equal(recvd, src) {
		t.Fatal("SEND: received memory differs from the source")
	}
	// 96 packets per PostSend: the output queue grew past its first 32
	// (one Link.Send per PostSend), as it does on a GSO link only.
	a.qp.mu.Lock()
	grown := len(a.qp.out)
	a.qp.mu.Unlock()
	if grown <= outBatch || grown > outBatchMax {
		t.Errorf("output queue of %d packets after PostSends of 96, want %d < n <= %d", grown, outBatch, outBatchMax)
	}
	for _, s := range []*side{a, r} {
		l := s.dev.link.(*udp.SocketLink)
		if l.GROCoalesced() == 0 {
			t.Errorf("%v: no coalesced GRO buffer: the in-place path did not run", l)
		}
		if st := l.Stats(); st.DropBadICRC != 0 || st.DropMalformed != 0 {
			t.Errorf("%v: drops %+v", l, st)
		}
	}
}

// TestOutQueueNoGSO: without GSO (a MemLink) the output queue keeps its 32
// packets however much one PostSend queues.
func TestOutQueueNoGSO(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{mtu: MTU4096})
	const size = 1 << 16
	_, smr := a.buffer(t, 4*size, 0)
	_, dmr := b.buffer(t, 4*size, memreg.AccessRemoteWrite)
	wrs := make([]SendWR, 4)
	for i := range wrs {
		wrs[i] = SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, i*size, size),
			RemoteAddr: dmr.IOVA() + uint64(i*size), RKey: dmr.RKey()}
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, len(wrs), 10*time.Second)
	a.qp.mu.Lock()
	n := len(a.qp.out)
	a.qp.mu.Unlock()
	if n != outBatch {
		t.Errorf("output queue of %d packets on a link without GSO, want %d", n, outBatch)
	}
	// The responder sent ACKs only: its queue kept its first size.
	b.qp.mu.Lock()
	n = len(b.qp.out)
	b.qp.mu.Unlock()
	if n != outFirst {
		t.Errorf("responder's output queue of %d packets after sending ACKs only, want %d", n, outFirst)
	}
}

// TestOutQueueGrowthKeepsFlushes: the output queue starts small and
// doubles, but is sent only when full at its final size: a PostSend of 33
// one-packet WRITEs leaves in two Link.Sends of 32 and 1 without GSO
// (outBatch), as it did when the queue started at 32.
func TestOutQueueGrowthKeepsFlushes(t *testing.T) {
	o := pairOpts{mtu: MTU4096, sqDepth: 64}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	la, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	rec := &sendCounter{Wrap: udp.Wrap{Link: la}}
	a := newSideOn(t, rec, &o)
	b := newSide(t, n, addrB, &o)
	connect(t, a, b, addrB, 1, 2, &o)
	connect(t, b, a, addrA, 2, 1, &o)
	_, smr := a.buffer(t, 64, 0)
	_, dmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	wrs := make([]SendWR, outBatch+1)
	for i := range wrs {
		wrs[i] = SendWR{Opcode: WRWrite, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	}
	wrs[len(wrs)-1].Flags = SendSignaled
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, 1, 10*time.Second)
	sizes := rec.sends()
	// More Sends than two only for resends (a timer that ran out on a
	// loaded machine).
	if len(sizes) < 2 || sizes[0] != outBatch || sizes[1] != 1 || (len(sizes) > 2 && a.dev.Counters().RetransmittedPkts == 0) {
		t.Fatalf("Link.Sends of %v packets for one PostSend of %d WRITEs, want [%d 1]", sizes, len(wrs), outBatch)
	}
}
