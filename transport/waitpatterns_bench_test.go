//go:build linux

package transport

import (
	"testing"
	"time"
)

// BenchmarkWaitPatterns measures an 8-byte SEND ping-pong between two
// devices over loopback socket links (default options: no busy polling)
// with the ways applications wait for completions, one op per round trip:
//
//   - raw: two plain UDP sockets bouncing a datagram (blocking reads), for
//     reference;
//   - wait: CQ.Wait with one long-lived context;
//   - wait-ctx-per-wait: CQ.Wait with a context.WithTimeout made for each
//     wait and cancelled after it (TestWaitContextPerCall);
//   - poll-loop: CQ.Poll and runtime.Gosched until a completion, on both
//     sides (ibv_poll_cq's idiom; TestPollLoopDrivesLink);
//   - 8-waiters: 8 QP pairs at once, a goroutine per QP waiting in CQ.Wait
//     on a CQ of its own (TestWaitersAnswerWithACK); an op is one round
//     trip of any pair.
//
// Both devices live in this process, so the polling loops of both sides
// share its two processors with everything else; docs/PERFORMANCE.md
// ("How applications wait") has the same patterns between two processes.
func BenchmarkWaitPatterns(b *testing.B) {
	// timed warms round up, then times round(n) and reports it per b.N
	// round trips.
	timed := func(b *testing.B, round func(int) error, n int) {
		if err := round(20); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		t0 := time.Now()
		if err := round(n); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(time.Since(t0).Nanoseconds())/1e3/float64(b.N), "µs/rtt")
	}
	b.Run("raw", func(b *testing.B) {
		p := newRawPingPong(b, false)
		defer p.stop()
		timed(b, p.round, b.N)
	})
	for _, mode := range []string{"wait", "wait-ctx-per-wait", "poll-loop"} {
		b.Run(mode, func(b *testing.B) {
			s := newStackPingPong(b, "SEND", false)
			defer s.stop()
			s.ctxPerWait = mode == "wait-ctx-per-wait"
			s.pollOnly = mode == "poll-loop"
			timed(b, s.round, b.N)
		})
	}
	b.Run("8-waiters", func(b *testing.B) {
		timed(b, newWaiterPairs(b, 8).run, max(1, b.N/8)) // 8 round trips per round
	})
}
