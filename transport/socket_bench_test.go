//go:build linux

package transport

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
)

// Benchmarks over real kernel UDP sockets on loopback (udp.SocketLink on
// port 4791 of two 127.0.0.0/8 addresses), shaped like `rocev2d bench`:
// one RC QP per side, path MTU 4096, 64 WRs in flight (8 for 64 KiB).
// They are the ones to profile for syscall and wakeup costs; the
// MemNetwork benchmarks in bench_test.go do not see those.

var (
	sockAddrA = netip.MustParseAddr("127.0.0.71")
	sockAddrB = netip.MustParseAddr("127.0.0.72")
)

// newSocketPair returns two connected sides over SocketLinks, or skips
// when port 4791 on the addresses is taken.
func newSocketPair(b *testing.B) (a, r *side) {
	b.Helper()
	return newSocketPairAt(b, nil, sockAddrA, sockAddrB)
}

// newSocketPairAt returns two connected sides over SocketLinks with socket
// options o on addrA and addrB, or skips when port 4791 on them is taken.
func newSocketPairAt(tb testing.TB, o *udp.SocketOptions, addrA, addrB netip.Addr) (a, r *side) {
	tb.Helper()
	po := pairOpts{mtu: MTU4096, sqDepth: 256, rqDepth: 256, cqDepth: 1024, retry: 7, rnrRetry: 7, minRNR: 12}
	po.defaults()
	mk := func(addr netip.Addr) *side {
		l, err := udp.ListenSocket(addr, o)
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
			tb.Skipf("UDP %v:4791 unavailable: %v", addr, err)
		}
		if err != nil {
			tb.Fatal(err)
		}
		return newSideOn(tb, l, &po)
	}
	a, r = mk(addrA), mk(addrB)
	connect(tb, a, r, addrB, 0x10, 0x20, &po)
	connect(tb, r, a, addrA, 0x20, 0x10, &po)
	return a, r
}

func benchSocketGoodput(b *testing.B, op WROpcode, size int) {
	benchSocketGoodputOpts(b, nil, op, size)
}

// benchSocketGoodputOpts is benchSocketGoodput on links with socket
// options o (nil: the defaults, no GSO).
func benchSocketGoodputOpts(b *testing.B, o *udp.SocketOptions, op WROpcode, size int) {
	a, r := newSocketPairAt(b, o, sockAddrA, sockAddrB)
	_, smr := a.buffer(b, max(size, 1<<16), 0)
	_, dmr := r.buffer(b, max(size, 1<<16), memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
	window := 64
	if size >= 1<<16 {
		window = 8
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recv := RecvWR{SGEs: sge(dmr, 0, 1<<16)}
	rdone := make(chan struct{})
	if op == WRSend {
		for i := 0; i < 200; i++ {
			if err := r.qp.PostRecv(recv); err != nil {
				b.Fatal(err)
			}
		}
		go func() {
			defer close(rdone)
			wcs := make([]WC, 64)
			for {
				n, err := r.rcq.Wait(ctx, wcs)
				if err != nil {
					return
				}
				for range n {
					if err := r.qp.PostRecv(recv); err != nil {
						return
					}
				}
			}
		}()
	} else {
		close(rdone)
	}
	wr := SendWR{Opcode: op, Flags: SendSignaled, SGEs: sge(smr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu0 := cpuTime()
	streamWRs(b, a, wr, window)
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
	b.StopTimer()
	cancel()
	<-rdone
}

func BenchmarkSocketWrite64B(b *testing.B)  { benchSocketGoodput(b, WRWrite, 64) }
func BenchmarkSocketWrite4KiB(b *testing.B) { benchSocketGoodput(b, WRWrite, 4096) }
func BenchmarkSocketWrite64KiB(b *testing.B) {
	benchSocketGoodput(b, WRWrite, 1<<16)
}
func BenchmarkSocketRead64B(b *testing.B)   { benchSocketGoodput(b, WRRead, 64) }
func BenchmarkSocketRead4KiB(b *testing.B)  { benchSocketGoodput(b, WRRead, 4096) }
func BenchmarkSocketRead64KiB(b *testing.B) { benchSocketGoodput(b, WRRead, 1<<16) }
func BenchmarkSocketSend64B(b *testing.B)   { benchSocketGoodput(b, WRSend, 64) }
func BenchmarkSocketSend4KiB(b *testing.B)  { benchSocketGoodput(b, WRSend, 4096) }
func BenchmarkSocketSend64KiB(b *testing.B) { benchSocketGoodput(b, WRSend, 1<<16) }

// The same over links with UDP GSO (and GRO, on by default): `rocev2d
// bench --gso=true`'s stack side.
var gsoOpts = &udp.SocketOptions{GSO: true}

func BenchmarkSocketGSOWrite64B(b *testing.B)   { benchSocketGoodputOpts(b, gsoOpts, WRWrite, 64) }
func BenchmarkSocketGSOWrite4KiB(b *testing.B)  { benchSocketGoodputOpts(b, gsoOpts, WRWrite, 4096) }
func BenchmarkSocketGSOWrite64KiB(b *testing.B) { benchSocketGoodputOpts(b, gsoOpts, WRWrite, 1<<16) }
func BenchmarkSocketGSORead4KiB(b *testing.B)   { benchSocketGoodputOpts(b, gsoOpts, WRRead, 4096) }
func BenchmarkSocketGSORead64KiB(b *testing.B)  { benchSocketGoodputOpts(b, gsoOpts, WRRead, 1<<16) }

// BenchmarkSocketGSORead1MiB and 16MiB: READs longer than one scheduler
// quantum (64 KiB), whose responses go out a quantum per turn.
func BenchmarkSocketGSORead1MiB(b *testing.B)  { benchSocketGoodputOpts(b, gsoOpts, WRRead, 1<<20) }
func BenchmarkSocketGSORead16MiB(b *testing.B) { benchSocketGoodputOpts(b, gsoOpts, WRRead, 16<<20) }
func BenchmarkSocketGSOSend4KiB(b *testing.B)  { benchSocketGoodputOpts(b, gsoOpts, WRSend, 4096) }
func BenchmarkSocketGSOSend64KiB(b *testing.B) { benchSocketGoodputOpts(b, gsoOpts, WRSend, 1<<16) }

// BenchmarkSocketPingPong8B bounces an 8-byte SEND between the sides, the
// echo running in its own goroutine as in `rocev2d bench`.
func BenchmarkSocketPingPong8B(b *testing.B) {
	a, r := newSocketPair(b)
	_, amr := a.buffer(b, 64, 0)
	_, rmr := r.buffer(b, 64, 0)
	asge, rsge := sge(amr, 0, 8), sge(rmr, 0, 8)
	for i := 0; i < 4; i++ {
		if err := a.qp.PostRecv(RecvWR{SGEs: asge}); err != nil {
			b.Fatal(err)
		}
		if err := r.qp.PostRecv(RecvWR{SGEs: rsge}); err != nil {
			b.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		wcs := make([]WC, 8)
		for {
			k, err := r.rcq.Wait(ctx, wcs)
			if err != nil {
				return
			}
			for range k {
				if r.qp.PostRecv(RecvWR{SGEs: rsge}) != nil || r.qp.PostSend(SendWR{Opcode: WRSend, SGEs: rsge}) != nil {
					return
				}
			}
			r.scq.Poll(wcs)
		}
	}()
	wcs := make([]WC, 8)
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: asge}); err != nil {
			b.Fatal(err)
		}
		k, err := a.rcq.Wait(ctx, wcs[:1])
		if err != nil || k != 1 || wcs[0].Status != WCSuccess {
			b.Fatal(err, wcs[0])
		}
		if err := a.qp.PostRecv(RecvWR{SGEs: asge}); err != nil {
			b.Fatal(err)
		}
		a.scq.Poll(wcs)
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/1000, "µs/rtt")
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
	b.StopTimer()
	cancel()
	<-echoDone
}

// cpuTime returns the user plus system CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSocketWrite64B8QP runs 8 QP pairs between the two devices, each
// with 8 64-byte WRITEs in flight, all completing on one send CQ: the ACKs
// of one received batch belong to many QPs.
func BenchmarkSocketWrite64B8QP(b *testing.B) {
	const pairs, window, size = 8, 8, 64
	a, r := newSocketPair(b)
	o := pairOpts{mtu: MTU4096, retry: 7, rnrRetry: 7, minRNR: 12}
	o.defaults()
	_, smr := a.buffer(b, size, 0)
	_, dmr := r.buffer(b, size, memreg.AccessRemoteWrite)
	qps := make([]*QP, pairs)
	for i := range qps {
		qa, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: a.scq, RecvCQ: a.rcq, MaxSendWR: 64, MaxRecvWR: 1})
		if err != nil {
			b.Fatal(err)
		}
		qb, err := r.dev.CreateQP(r.pd, QPInitAttr{Type: QPTypeRC, SendCQ: r.scq, RecvCQ: r.rcq, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			b.Fatal(err)
		}
		sa, sb := &side{dev: a.dev, qp: qa}, &side{dev: r.dev, qp: qb}
		connect(b, sa, sb, sockAddrB, uint32(i*1000), uint32(i*7777), &o)
		connect(b, sb, sa, sockAddrA, uint32(i*7777), uint32(i*1000), &o)
		qps[i] = qa
	}
	wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	wrs := make([]SendWR, window)
	for i := range wrs {
		wrs[i] = wr
	}
	inflight := make([]int, pairs)
	wcs := make([]WC, 64)
	ctx := context.Background()
	qpIndex := map[uint32]int{}
	for i, q := range qps {
		qpIndex[q.QPN()] = i
	}
	b.SetBytes(size)
	b.ResetTimer()
	cpu0 := cpuTime()
	posted, done := 0, 0
	for done < b.N {
		for i, q := range qps {
			if k := min(window-inflight[i], b.N-posted); k > 0 {
				if err := q.PostSend(wrs[:k]...); err != nil {
					b.Fatal(err)
				}
				inflight[i] += k
				posted += k
			}
		}
		n, err := a.scq.Wait(ctx, wcs)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range wcs[:n] {
			if c.Status != WCSuccess {
				b.Fatalf("%+v", c)
			}
			inflight[qpIndex[c.QPN]]--
		}
		done += n
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
}
