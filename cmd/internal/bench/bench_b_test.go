//go:build linux

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// The testing.B counterparts of `rocev2d bench` rows. Each iteration is one
// round of the row: a raw UDP run and a stack run of benchBRun each, in
// alternating order, on 127.0.0.73 <-> 127.0.0.74 (port 4791: run them
// under flock /tmp/rocev2-cmd.lock, like the command's tests). The metrics
// are the row's columns over all rounds: raw-MB/s, rocev2-MB/s, ratio
// (rocev2 / raw), raw-cpu-ms/MB, rocev2-cpu-ms/MB and cpu-ratio (process
// user + sys time per MB delivered, both ends).

const benchBRun = 50 * time.Millisecond

func benchBConfig() *benchConfig {
	c := &benchConfig{dur: benchBRun}
	c.A, c.B = netip.MustParseAddr("127.0.0.73"), netip.MustParseAddr("127.0.0.74")
	c.MTU = transport.MTU4096
	return c
}

func benchBStack(b *testing.B, c *benchConfig, m benchMode) *benchStack {
	b.Helper()
	s, err := openBenchStack(c, m)
	if err != nil {
		b.Skipf("cannot open the stack on %v/%v: %v", c.A, c.B, err)
	}
	b.Cleanup(s.close)
	return s
}

func reportRow(b *testing.B, row benchRow) {
	b.ReportMetric(row.raw.mbs(), "raw-MB/s")
	b.ReportMetric(row.roc.mbs(), "rocev2-MB/s")
	b.ReportMetric(row.roc.mbs()/row.raw.mbs(), "ratio")
	if row.raw.cpuSeen && row.roc.cpuSeen {
		b.ReportMetric(row.raw.cpuPerMB(), "raw-cpu-ms/MB")
		b.ReportMetric(row.roc.cpuPerMB(), "rocev2-cpu-ms/MB")
		b.ReportMetric(row.roc.cpuPerMB()/row.raw.cpuPerMB(), "cpu-ratio")
	}
	if row.reqResp {
		// READ: raw is the request/response baseline; also against the
		// one-way stream of the responses (the WRITE rows' baseline).
		b.ReportMetric(row.oneWay.mbs(), "raw-oneway-MB/s")
		b.ReportMetric(row.roc.mbs()/row.oneWay.mbs(), "ratio-oneway")
	}
	b.ReportMetric(0, "ns/op") // an iteration is a fixed-length round
}

// BenchmarkBenchRead is the READ rows: 64 B, 4 KiB and 64 KiB READs
// (benchRdAtomic in flight) against the raw request/response baseline
// (rawReadGoodput) and the one-way stream of each section —
// sendmmsg/recvmmsg against rocev2 without GSO, GSO+GRO against rocev2
// with GSO.
func BenchmarkBenchRead(b *testing.B) {
	for _, m := range []benchMode{modePlain, modeGSO} {
		for _, size := range []int{64, 4096, 65536} {
			b.Run(fmt.Sprintf("%s/%s", map[bool]string{false: "sendmmsg", true: "gso"}[m.gso], benchSize(size)), func(b *testing.B) {
				c := benchBConfig()
				s := benchBStack(b, c, m)
				row, err := s.goodputRow(context.Background(), c, m, transport.WRRead, size, b.N)
				if err != nil {
					b.Fatal(err)
				}
				reportRow(b, row)
			})
		}
	}
}

// BenchmarkBenchGSO is the GSO section's 64 KiB rows (WRITE, READ, SEND):
// rocev2 with GSO against raw UDP with GSO+GRO (ratio, the target
// 0.8) and, in the same rounds, against the plain sendmmsg baseline
// (x-sendmmsg: what GSO buys over it).
func BenchmarkBenchGSO(b *testing.B) {
	for _, op := range []transport.WROpcode{transport.WRWrite, transport.WRRead, transport.WRSend} {
		b.Run(cli.OpName(op)+"/64KiB", func(b *testing.B) {
			c := benchBConfig()
			s := benchBStack(b, c, modeGSO)
			ctx := context.Background()
			var plain benchSum
			row := benchRow{}
			for i := 0; i < b.N; i++ {
				r, err := s.goodputRow(ctx, c, modeGSO, op, 65536, 1)
				if err != nil {
					b.Fatal(err)
				}
				row.raw.add(benchRun{bytes: r.raw.bytes, pkts: r.raw.pkts, sent: r.raw.sent, el: r.raw.el, cpu: r.raw.cpu, cpuSeen: r.raw.cpuSeen})
				row.roc.add(benchRun{bytes: r.roc.bytes, pkts: r.roc.pkts, el: r.roc.el, cpu: r.roc.cpu, cpuSeen: r.roc.cpuSeen})
				run, err := rawGoodput(ctx, c, 65536, false)
				if err != nil {
					b.Fatal(err)
				}
				plain.add(run)
			}
			reportRow(b, row)
			b.ReportMetric(plain.mbs(), "raw-sendmmsg-MB/s")
			b.ReportMetric(row.roc.mbs()/plain.mbs(), "x-sendmmsg")
		})
	}
}

// BenchmarkBenchLatencySide is one side of the latency rows alone — raw
// UDP's ping-pong (rawPingPongSpin, blocking), or the stack's SEND or
// WRITE ping-pong (stackPingPongOp) — as one run of b.N × benchBRun, so
// that perf stat or strace over the process counts what one kind of round
// trip makes the kernel and the runtime do (divide by the rtts metric;
// the setup of two devices is a few milliseconds of it). Metrics: rtts
// (round trips in all), µs/rtt and cpu-µs/rtt (process user + sys time
// per round trip).
func BenchmarkBenchLatencySide(b *testing.B) {
	for _, side := range []string{"raw", "SEND", "WRITE"} {
		b.Run(side, func(b *testing.B) {
			c := benchBConfig()
			c.dur = time.Duration(b.N) * benchBRun
			ctx := context.Background()
			var r benchRun
			var err error
			if side == "raw" {
				r, err = rawPingPongSpin(ctx, c, 8+16, 0)
			} else {
				s := benchBStack(b, c, modeGSO)
				_, wa, aerr := s.a.Alloc(64, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
				_, wb, berr := s.b.Alloc(64, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
				if aerr != nil || berr != nil {
					b.Fatal(aerr, berr)
				}
				op := transport.WRSend
				if side == "WRITE" {
					op = transport.WRWriteImm
				}
				r, err = stackPingPongOp(ctx, c, s.a, s.b, op, wa, wb)
			}
			if err != nil {
				b.Fatal(err)
			}
			var sum benchSum
			sum.add(r)
			b.ReportMetric(sum.iters, "rtts")
			b.ReportMetric(sum.rtt(), "µs/rtt")
			if sum.cpuSeen {
				b.ReportMetric(sum.cpuPerRTT(), "cpu-µs/rtt")
			}
			b.ReportMetric(0, "ns/op") // b.N sets the run's length
		})
	}
}
