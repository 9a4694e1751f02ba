package transport

import (
	"context"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
)

const benchMsg = 64 << 10

// BenchmarkWrite64KiB measures RDMA WRITE goodput of 64 KiB messages over
// a fault-free MemNetwork (path MTU 4096, 16 WRs in flight); compare with
// BenchmarkCopy64KiB in the same run.
func BenchmarkWrite64KiB(b *testing.B) {
	a, r, _ := newPair(b, pairOpts{mtu: MTU4096, sqDepth: 64})
	const depth = 16
	_, smr := a.buffer(b, benchMsg*depth, 0)
	_, dmr := r.buffer(b, benchMsg*depth, memreg.AccessRemoteWrite)
	wc := make([]WC, depth)
	ctx := context.Background()
	b.SetBytes(benchMsg)
	b.ReportAllocs()
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < depth {
			slot := posted % depth
			wr := SendWR{WRID: uint64(posted), Opcode: WRWrite, Flags: SendSignaled,
				SGEs:       []memreg.SGE{{Addr: smr.IOVA() + uint64(slot*benchMsg), Length: benchMsg, LKey: smr.LKey()}},
				RemoteAddr: dmr.IOVA() + uint64(slot*benchMsg), RKey: dmr.RKey()}
			if err := a.qp.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		n, err := a.scq.Wait(ctx, wc)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range wc[:n] {
			if c.Status != WCSuccess {
				b.Fatalf("%+v", c)
			}
		}
		done += n
	}
}

// BenchmarkCopy64KiB is the baseline: copy of the same 64 KiB.
func BenchmarkCopy64KiB(b *testing.B) {
	src := make([]byte, benchMsg*16)
	dst := make([]byte, benchMsg*16)
	b.SetBytes(benchMsg)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s := (i % 16) * benchMsg
		copy(dst[s:s+benchMsg], src[s:s+benchMsg])
	}
}

// BenchmarkSendPingPong8B measures the round trip of an 8-byte SEND and an
// 8-byte SEND back (ibv_rc_pingpong style, completions by polling).
func BenchmarkSendPingPong8B(b *testing.B) {
	a, r, _ := newPair(b, pairOpts{mtu: MTU1024})
	_, amr := a.buffer(b, 64, 0)
	_, rmr := r.buffer(b, 64, 0)
	asge := []memreg.SGE{{Addr: amr.IOVA(), Length: 8, LKey: amr.LKey()}}
	rsge := []memreg.SGE{{Addr: rmr.IOVA(), Length: 8, LKey: rmr.LKey()}}
	wc := make([]WC, 4)
	ctx := context.Background()
	wait := func(cq *CQ, want WCOpcode) {
		for {
			n, err := cq.Wait(ctx, wc[:1])
			if err != nil {
				b.Fatal(err)
			}
			if n == 1 {
				if wc[0].Status != WCSuccess || wc[0].Opcode != want {
					b.Fatalf("%+v", wc[0])
				}
				return
			}
		}
	}
	if err := a.qp.PostRecv(RecvWR{SGEs: asge}); err != nil {
		b.Fatal(err)
	}
	if err := r.qp.PostRecv(RecvWR{SGEs: rsge}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: asge}); err != nil {
			b.Fatal(err)
		}
		wait(r.rcq, WCRecv)
		if err := r.qp.PostRecv(RecvWR{SGEs: rsge}); err != nil {
			b.Fatal(err)
		}
		if err := r.qp.PostSend(SendWR{Opcode: WRSend, SGEs: rsge}); err != nil {
			b.Fatal(err)
		}
		wait(a.rcq, WCRecv)
		if err := a.qp.PostRecv(RecvWR{SGEs: asge}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/1000, "µs/rtt")
}

// TestAllocsPerMessage checks the steady state: posting and completing a
// 4 KiB WRITE and an 8-byte SEND allocates nothing in the transport
// (allocations anywhere in the process are counted, MemNetwork included).
func TestAllocsPerMessage(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	a, r, _ := newPair(t, pairOpts{mtu: MTU4096})
	_, smr := a.buffer(t, 4096, 0)
	_, dmr := r.buffer(t, 4096, memreg.AccessRemoteWrite)
	wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: []memreg.SGE{{Addr: smr.IOVA(), Length: 4096, LKey: smr.LKey()}},
		RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	send := SendWR{Opcode: WRSend, Flags: SendSignaled, SGEs: []memreg.SGE{{Addr: smr.IOVA(), Length: 8, LKey: smr.LKey()}}}
	recv := RecvWR{SGEs: []memreg.SGE{{Addr: dmr.IOVA(), Length: 64, LKey: dmr.LKey()}}}
	wc := make([]WC, 1)
	ctx := context.Background()
	one := func() {
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if _, err := a.scq.Wait(ctx, wc); err != nil || wc[0].Status != WCSuccess {
			t.Fatal(err, wc[0])
		}
		if err := r.qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(send); err != nil {
			t.Fatal(err)
		}
		if _, err := a.scq.Wait(ctx, wc); err != nil || wc[0].Status != WCSuccess {
			t.Fatal(err, wc[0])
		}
		if _, err := r.rcq.Wait(ctx, wc); err != nil || wc[0].Status != WCSuccess {
			t.Fatal(err, wc[0])
		}
	}
	for i := 0; i < 100; i++ {
		one()
	}
	allocs := testing.AllocsPerRun(500, one)
	t.Logf("allocations per WRITE+SEND round: %.2f", allocs)
	if allocs > 1 {
		t.Errorf("%.2f allocations per message pair in steady state, want ~0", allocs)
	}
}
