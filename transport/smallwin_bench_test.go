package transport

import (
	"context"
	"testing"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// BenchmarkSmallWriteWindow streams 64-byte WRITEs, 512 outstanding, over
// an in-memory network without loss and with 1 % loss, with the
// small-packet window (DeviceConfig.MaxUnackedSmallPSNs, default 512) and
// without it (-1: 128 PSNs for every packet). Metric resent/op: request
// packets retransmitted per WRITE (go-back-N resends the window after a
// loss; the window's cut on loss keeps that where it was at 128).
func BenchmarkSmallWriteWindow(b *testing.B) {
	for _, loss := range []struct {
		name string
		p    float64
	}{{"clean", 0}, {"loss1%", 0.01}} {
		for _, small := range []struct {
			name string
			v    int
		}{{"small512", 0}, {"off", -1}} {
			b.Run(loss.name+"/"+small.name, func(b *testing.B) {
				a, r, _ := newPair(b, pairOpts{faults: memnet.Faults{Loss: loss.p, Seed: 7}, small: small.v,
					sqDepth: 1024, cqDepth: 2048, timeout: 10, retry: 7})
				_, smr := a.buffer(b, 64, 0)
				_, dmr := r.buffer(b, 64, memreg.AccessRemoteWrite)
				wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
				r0 := a.dev.Counters().RetransmittedPkts
				b.SetBytes(64)
				b.ResetTimer()
				streamWRs(b, a, wr, 512)
				b.StopTimer()
				b.ReportMetric(float64(a.dev.Counters().RetransmittedPkts-r0)/float64(b.N), "resent/op")
			})
		}
	}
}

// streamWRs posts b.N copies of wr (signaled) on a's QP, keeping window
// of them outstanding, and waits for their completions on a's send CQ;
// any completion but success fails b.
func streamWRs(b *testing.B, a *side, wr SendWR, window int) {
	wrs := make([]SendWR, window)
	for i := range wrs {
		wrs[i] = wr
	}
	wcs := make([]WC, 64)
	ctx := context.Background()
	posted, done := 0, 0
	for done < b.N {
		if k := min(window-(posted-done), b.N-posted); k > 0 {
			if err := a.qp.PostSend(wrs[:k]...); err != nil {
				b.Fatal(err)
			}
			posted += k
		}
		n, err := a.scq.Wait(ctx, wcs)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range wcs[:n] {
			if c.Status != WCSuccess {
				b.Fatalf("%+v", c)
			}
		}
		done += n
	}
}
