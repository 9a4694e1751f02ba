//go:build linux

package transport

import (
	"errors"
	"net/netip"
	"runtime"
	"testing"

	"github.com/gorocev2/rocev2/memreg"
)

// BenchmarkWrite64BStream streams 64-byte signaled WRITEs from one device
// to another over the polled in-memory link (memLoop), both driven by
// the benchmark's goroutine, with the window of `rocev2d bench`'s
// write:64b row (256 WRs outstanding, refilled in one PostSend; every WR
// signaled, completions polled 64 at a time): the per-message work of
// the send side (post, build, link send, ACK handling, completion) and
// of the responder, without system calls. One op is one WRITE.
// scripts/ir-permsg.sh counts its instructions per op (BENCH=Write64BStream).
func BenchmarkWrite64BStream(b *testing.B) {
	b.ReportAllocs()
	s := newWriteStream(b, 256)
	if err := s.run(1000); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(64)
	b.ResetTimer()
	if err := s.run(b.N); err != nil {
		b.Fatal(err)
	}
}

// writeStream is BenchmarkWrite64BStream's pair of devices.
type writeStream struct {
	a, r   *side
	wrs    []SendWR
	wcs    []WC
	window int
}

func newWriteStream(tb testing.TB, window int) *writeStream {
	tb.Helper()
	aa, ra := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	la, lr := newMemLoop(aa, ra)
	po := pairOpts{mtu: MTU4096, sqDepth: window, rqDepth: 16, cqDepth: 2 * window, retry: 7, rnrRetry: 7, minRNR: 12}
	po.defaults()
	a, r := newSideOn(tb, la, &po), newSideOn(tb, lr, &po)
	connect(tb, a, r, ra, 0x10, 0x20, &po)
	connect(tb, r, a, aa, 0x20, 0x10, &po)
	_, smr := a.buffer(tb, 64, 0)
	_, dmr := r.buffer(tb, 64, memreg.AccessRemoteWrite)
	wr := SendWR{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 64), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}
	s := &writeStream{a: a, r: r, wrs: make([]SendWR, window), wcs: make([]WC, 64), window: window}
	for i := range s.wrs {
		s.wrs[i] = wr
	}
	return s
}

// run streams n WRITEs and waits for their completions.
func (s *writeStream) run(n int) error {
	posted, done, idle := 0, 0, 0
	for done < n {
		if k := min(s.window-(posted-done), n-posted); k > 0 {
			if err := s.a.qp.PostSend(s.wrs[:k]...); err != nil {
				return err
			}
			posted += k
		}
		s.r.dev.Progress()
		got := s.a.scq.Poll(s.wcs)
		for _, c := range s.wcs[:got] {
			if c.Status != WCSuccess {
				return c.Err()
			}
		}
		done += got
		if got > 0 {
			idle = 0
		} else if idle++; idle > 16 {
			runtime.Gosched()
			if idle > 1<<24 {
				return errors.New("write stream: no completion")
			}
		}
	}
	return nil
}
