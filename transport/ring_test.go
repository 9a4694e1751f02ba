package transport

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestGrowRing: entries keep their indexes across a growth, also when
// they wrap around the old ring's end, and every slot has SGE room.
func TestGrowRing(t *testing.T) {
	old := growRing[recvWQE](nil, 0, 0, 4, 2)
	for i := uint64(6); i < 10; i++ { // indexes 6..9 sit in slots 2,3,0,1
		old[i%4].wrid = i
	}
	r := growRing(old, 6, 10, 8, 2)
	for i := uint64(6); i < 10; i++ {
		if r[i%8].wrid != i {
			t.Fatalf("index %d at slot %d holds %d", i, i%8, r[i%8].wrid)
		}
	}
	for i := range r {
		if cap(r[i].sges) < 2 {
			t.Fatalf("slot %d has SGE room %d", i, cap(r[i].sges))
		}
	}
}

// TestRingsGrowUnderTraffic: send and receive rings start small and grow
// to their maximum while WRs are outstanding; later rounds wrap around the
// grown rings.
func TestRingsGrowUnderTraffic(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{sqDepth: 64, rqDepth: 64})
	if len(a.qp.sq) != ringStart || len(b.qp.rq) != ringStart {
		t.Fatalf("rings start with %d and %d slots, want %d", len(a.qp.sq), len(b.qp.rq), ringStart)
	}
	src, smr := a.buffer(t, 64*64, 0)
	fill(src, 9)
	dst, dmr := b.buffer(t, 64*64, 0)
	for round := 0; round < 3; round++ {
		var recvs []RecvWR
		var sends []SendWR
		for i := 0; i < 64; i++ {
			recvs = append(recvs, RecvWR{WRID: uint64(i), SGEs: sge(dmr, i*64, 64)})
			sends = append(sends, SendWR{WRID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, i*64, 64)})
		}
		if err := b.qp.PostRecv(recvs...); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(sends...); err != nil {
			t.Fatal(err)
		}
		for i, wc := range waitWC(t, a.scq, 64, 5*time.Second) {
			if wc.WRID != uint64(i) || wc.Status != WCSuccess {
				t.Fatalf("round %d send %d: %+v", round, i, wc)
			}
		}
		for i, wc := range waitWC(t, b.rcq, 64, 5*time.Second) {
			if wc.WRID != uint64(i) || wc.Status != WCSuccess {
				t.Fatalf("round %d recv %d: %+v", round, i, wc)
			}
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("round %d: data differs", round)
		}
		clear(dst)
	}
	if len(a.qp.sq) != 64 || len(b.qp.rq) != 64 {
		t.Errorf("rings have %d and %d slots after 64 outstanding WRs, want 64", len(a.qp.sq), len(b.qp.rq))
	}
}

// TestIdleQPMemory: an idle RC QP (128-deep queues, created, no traffic)
// costs at most 16 KiB of heap: rings grow as WRs are posted, packet
// buffers come from the device's pool only while packets are queued.
func TestIdleQPMemory(t *testing.T) {
	var cq *CQ
	per := idleQPHeap(t, func(dev *Device, pd *memreg.PD) (*QP, error) {
		if cq == nil {
			cq, _ = dev.CreateCQ(1024)
		}
		return dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 128, MaxRecvWR: 128})
	})
	t.Logf("heap per idle QP: %d bytes", per)
	if per > 16<<10 {
		t.Errorf("an idle QP costs %d bytes of heap, want <= 16 KiB", per)
	}
}

// TestIdleQPWithOwnCQMemory: a server that gives every connection its own
// CQ (here of depth 1024, send and receive completions both) pays at most
// 16 KiB of heap per idle connection, QP and CQ together: a CQ's ring grows
// as completions pile up (a whole ring of 1024 completions is 40 KB).
func TestIdleQPWithOwnCQMemory(t *testing.T) {
	per := idleQPHeap(t, func(dev *Device, pd *memreg.PD) (*QP, error) {
		cq, err := dev.CreateCQ(1024)
		if err != nil {
			return nil, err
		}
		return dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 128, MaxRecvWR: 128, MaxSGE: 4})
	})
	t.Logf("heap per idle QP with its own CQ: %d bytes", per)
	if per > 16<<10 {
		t.Errorf("an idle QP with its own CQ of depth 1024 costs %d bytes of heap, want <= 16 KiB", per)
	}
}

// idleQPHeap creates 2000 QPs with create on one device and returns the
// heap growth per QP (what create allocated and kept). It skips under the
// race detector, whose shadow memory skews heap sizes.
func idleQPHeap(t *testing.T, create func(*Device, *memreg.PD) (*QP, error)) int64 {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector's shadow memory skews heap sizes")
	}
	n := memnet.NewMemNetwork(memnet.Faults{})
	l, _ := n.Link(addrA)
	dev, _ := NewDevice(l, DeviceConfig{MaxQP: 4096})
	defer dev.Close()
	pd, _ := dev.AllocPD()
	const N = 2000
	qps := make([]*QP, N)
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for i := range qps {
		var err error
		if qps[i], err = create(dev, pd); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	runtime.KeepAlive(qps)
	return int64(m1.HeapAlloc-m0.HeapAlloc) / N
}
