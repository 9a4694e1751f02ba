package transport

import (
	"context"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// BenchmarkScaleActiveMem is the many-QP case's per-message work on cold
// QP state, for cachegrind (issue 30 item 4): N RC QP pairs over an
// in-memory network, each QP with its own source and destination region,
// and every iteration posts one WRITE of scaleMissSize bytes on every QP
// at once and waits for all N completions (the scheduler serves them
// round-robin, as with 10,000 active QPs over loopback; 8 MB of QP state
// and 32 MB of regions, far beyond the caches). The ACK timeout
// is long enough that no timer expires under valgrind. Run it under
// cachegrind for two iteration counts of 2 or more and divide the
// difference of the miss counts by the difference of the WRITEs
// (scripts/miss-scale.sh): -benchtime Nx with N > 1 runs it with b.N = 1
// first (a setup and three rounds), so 1x and 3x differ by a setup too.
func BenchmarkScaleActiveMem(b *testing.B) {
	// 4,000 pairs: under valgrind (or a machine as slow) every QP goes
	// stale and stops counting in the scheduler's budget, so all n
	// WRITEs and then all n ACKs may be on their way at once; the
	// in-memory network's queue holds 4,096 packets per link (a NIC
	// ring), and a drop would wait for the long ACK timeout below.
	const n = 4000
	net := memnet.NewMemNetwork(memnet.Faults{})
	la, err := net.Link(addrA)
	if err != nil {
		b.Fatal(err)
	}
	lb, err := net.Link(addrB)
	if err != nil {
		b.Fatal(err)
	}
	cfg := DeviceConfig{MaxQP: n + 16}
	a, err := NewDevice(la, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	d, err := NewDevice(lb, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	apd, _ := a.AllocPD()
	bpd, _ := d.AllocPD()
	acq, _ := a.CreateCQ(n + 16)
	bcq, _ := d.CreateCQ(16)
	retry := Retry{Timeout: 28, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12} // ~18 min: no expiry under valgrind
	qa := make([]*QP, n)
	wrs := make([]SendWR, n)
	for i := range n {
		smr, err := apd.RegisterMR(make([]byte, scaleMissSize), memreg.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		dmr, err := bpd.RegisterMR(make([]byte, scaleMissSize), memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
		if err != nil {
			b.Fatal(err)
		}
		q, err := a.CreateQP(apd, QPInitAttr{Type: QPTypeRC, SendCQ: acq, RecvCQ: acq, MaxSendWR: 2, MaxRecvWR: 1})
		if err != nil {
			b.Fatal(err)
		}
		p, err := d.CreateQP(bpd, QPInitAttr{Type: QPTypeRC, SendCQ: bcq, RecvCQ: bcq, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			b.Fatal(err)
		}
		if err := q.Connect(ConnParams{Peer: d.Addr(), DestQPN: p.QPN(), PathMTU: MTU4096, Retry: &retry}); err != nil {
			b.Fatal(err)
		}
		if err := p.Connect(ConnParams{Peer: a.Addr(), DestQPN: q.QPN(), PathMTU: MTU4096, Retry: &retry, Access: memreg.AccessRemoteWrite}); err != nil {
			b.Fatal(err)
		}
		qa[i] = q
		wrs[i] = SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: []memreg.SGE{smr.SGE(0, scaleMissSize)},
			RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(scaleMissWait)*time.Second)
	defer cancel()
	wcs := make([]WC, 256)
	round := func() {
		for i, q := range qa {
			if err := q.PostSend(wrs[i]); err != nil {
				b.Fatal(err)
			}
		}
		for done := 0; done < n; {
			k, err := acq.Wait(ctx, wcs)
			if err != nil {
				b.Fatalf("%d of %d: %v; A %+v; B %+v; net %+v; queued %d inflight %d stalled %v", done, n, err, a.Counters(), d.Counters(), net.Counters(),
					a.sched.queued.Load(), a.sched.inflight.Load(), a.sched.stalled.Load())
			}
			for _, wc := range wcs[:k] {
				if wc.Status != WCSuccess {
					b.Fatal(wc.Err())
				}
			}
			done += k
		}
	}
	round() // every QP's first traffic
	round()
	b.ResetTimer()
	for range b.N {
		round()
	}
	b.StopTimer()
	c := a.Counters()
	b.ReportMetric(float64(c.RetransmittedPkts), "resent")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/write")
}

const scaleMissSize = 4096

var scaleMissWait = 600
