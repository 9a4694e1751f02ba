package transport

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/memreg"
)

// BenchmarkPacerAccuracy measures how close the requester's pacing comes
// to the reaction point's rate on the wall clock: a QP held at a fixed
// rate (a CNP set it with RateOnFirstCNP; no increase events) streams
// 64 KiB WRITEs over the in-memory network, and the achieved rate of IP
// datagrams is reported as a ratio of the target. Below 1 means timer
// wake-ups arrive late by more than the pacer's catch-up credit covers, or
// that the target is above what the machine carries unpaced (the
// rate=unpaced row, measured in the same run).
func BenchmarkPacerAccuracy(b *testing.B) {
	for _, rate := range []float64{0, 100e6, 500e6, 2e9} {
		name := fmt.Sprintf("rate=%gMbps", rate/1e6)
		if rate == 0 {
			name = "rate=unpaced" // the baseline: what the link and CPU carry without a CNP
		}
		b.Run(name, func(b *testing.B) {
			a, r, _ := newPair(b, pairOpts{retry: 7, sqDepth: 64, cc: CongestionConfig{DCQCN: dcqcn.Config{
				LineRate: 100e9, RateOnFirstCNP: rate, TimeReset: time.Hour, ByteReset: -1}}})
			if rate > 0 {
				if err := a.dev.HandlePacket(cnpTo(a.qp.QPN()), addrB); err != nil {
					b.Fatal(err)
				}
			}
			const size = 64 << 10
			_, lmr := a.buffer(b, size, 0)
			_, rmr := r.buffer(b, size, memreg.AccessRemoteWrite)
			wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}
			// Enough messages for ~200 ms at the rate.
			n := max(8, int(rate*0.2/8/size))
			if rate == 0 {
				n = 200
			}
			wcs := make([]WC, 16)
			b.ResetTimer()
			var elapsed time.Duration
			for range b.N {
				start := time.Now()
				posted, done := 0, 0
				for done < n {
					for posted < n && posted-done < 8 {
						if err := a.qp.PostSend(wr); err != nil {
							b.Fatal(err)
						}
						posted++
					}
					k := waitAny(b, a.scq, wcs)
					done += k
				}
				elapsed += time.Since(start)
			}
			// IP bytes per message: 64 packets of 1024 payload + BTH 12 +
			// ICRC 4 + UDP/IP 28, and a RETH on the first.
			bits := float64(b.N*n) * (64*(1024+12+4+28) + 16) * 8
			achieved := bits / elapsed.Seconds()
			b.ReportMetric(achieved/1e6, "Mbps")
			if rate > 0 {
				b.ReportMetric(achieved/rate, "achieved/target")
			}
		})
	}
}

// waitAny waits for at least one completion on cq and returns how many it took.
func waitAny(tb testing.TB, cq *CQ, buf []WC) int {
	k := waitWC(tb, cq, 1, 10*time.Second)
	n := len(k)
	for {
		m := cq.Poll(buf)
		n += m
		if m == 0 {
			return n
		}
	}
}
