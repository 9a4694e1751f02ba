package ccsim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// base is the scenario the tests and benchmarks share: a 10 Gb/s switch
// port toward the receiver with a 512 KiB buffer and RED/ECN marking from
// 5 KiB to 200 KiB (1 % at Kmax, as in the DCQCN paper), senders with
// 25 Gb/s NICs, 2 µs per hop, 64 KiB WRITEs, 8 outstanding per QP.
//
// The reaction point runs the DCQCN paper's parameters (Zhu et al. 2015,
// table 1, for 40 Gb/s), their rates scaled by 10/40 to the 10 Gb/s
// bottleneck: α gain 1/256 (G = 1020) updated every 55 µs, the rate
// increase timer 55 µs, the byte counter 10 MB/4, 5 events of fast
// recovery, AI 10 Mb/s, HAI 100 Mb/s. NVIDIA's defaults (α period 1 µs,
// byte counter 32 KiB, threshold 1) are tuned for 100 Gb/s NICs with
// hardware timers: at this scale their α settles near 2 % between the
// 50 µs CNPs while the byte counter raises the rate every 26 µs, and the
// flows never come down to the bottleneck (measured: queue at the buffer
// limit, drops throughout).
func base(n int, dcqcnOn bool, seed int64) scenario {
	return scenario{
		N: n, DCQCN: dcqcnOn, Seed: seed,
		Duration: 200 * time.Millisecond,
		Sample:   time.Millisecond,
		Switch:   memnet.Bottleneck{Rate: 10e9, Buffer: 512 << 10, Kmin: 5 << 10, Kmax: 200 << 10, Pmax: 0.01},
		LineRate: 25e9,
		Delay:    2 * time.Microsecond,
		MsgSize:  64 << 10,
		Depth:    8,
		RP: dcqcn.Config{
			G: 1020, AlphaPeriod: 55 * time.Microsecond,
			TimeReset: 55 * time.Microsecond, ByteReset: 10e6 / 4, Threshold: 5,
			AIRate: 10e6, HAIRate: 100e6, MinRate: 10e6,
		},
	}
}

// csvDir, when set, receives each TestConvergence run's timeline as CSV
// (see result.csv).
var csvDir = flag.String("ccsim.csv", "", "directory to write each TestConvergence run's timeline to, as CSV")

// flowCounts are the N of the issue; -short runs the two smaller ones
// for a shorter time (the race detector makes a run ~10× slower).
func flowCounts() ([]int, time.Duration) {
	if testing.Short() {
		return []int{2, 4}, 100 * time.Millisecond
	}
	return []int{2, 4, 8}, 200 * time.Millisecond
}

// TestConvergence is the "what must show" for the in-memory
// switch: with N flows into one bottleneck and DCQCN on, aggregate
// goodput ≥ 90 % of the bottleneck rate, Jain fairness ≥ 0.95, no drops
// and a mean queue ≤ Kmax, all over the last half of the run (the first
// half is the convergence from line rate); the same run without DCQCN
// drops packets and loses goodput.
func TestConvergence(t *testing.T) {
	ns, dur := flowCounts()
	if testing.Short() {
		t.Logf("-short: N = %v over %v of virtual time (N = 8 and 200 ms without -short)", ns, dur)
	}
	for _, n := range ns {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			on := base(n, true, 1)
			on.Duration = dur
			off := on
			off.DCQCN = false
			ron, roff := run(t, on), run(t, off)
			t.Log(ron)
			t.Log(roff)
			if g := ron.goodput(); g < 0.9 {
				t.Errorf("DCQCN: goodput %.3f of the bottleneck, want >= 0.9", g)
			}
			if j := ron.jain(); j < 0.95 {
				t.Errorf("DCQCN: Jain index %.4f, want >= 0.95", j)
			}
			if _, late := ron.drops(); late != 0 {
				t.Errorf("DCQCN: %d drops in the last half, want 0", late)
			}
			if q := ron.meanQueue(); q > float64(on.Switch.Kmax) {
				t.Errorf("DCQCN: mean queue %.0f B over the last half, want <= Kmax %d", q, on.Switch.Kmax)
			}
			if ron.failed() != 0 {
				t.Errorf("DCQCN: a flow failed: %v", ron.dead)
			}
			if ron.counters[0].NPCNPSent == 0 || ron.marks() == 0 {
				t.Errorf("DCQCN: %d marks, %d CNPs: the run never congested", ron.marks(), ron.counters[0].NPCNPSent)
			}
			if all, late := roff.drops(); all == 0 || late == 0 {
				t.Errorf("without DCQCN: %d drops, %d in the last half; want drops", all, late)
			}
			if roff.goodput() >= ron.goodput() {
				t.Errorf("without DCQCN goodput %.3f, with %.3f: want less without", roff.goodput(), ron.goodput())
			}
			for _, e := range roff.dead {
				if e != nil {
					t.Logf("without DCQCN: %v", e)
				}
			}
			if *csvDir != "" {
				for _, r := range []*result{ron, roff} {
					mode := "dcqcn"
					if !r.sc.DCQCN {
						mode = "nocc"
					}
					name := filepath.Join(*csvDir, fmt.Sprintf("ccsim-N%d-%s-seed%d.csv", n, mode, r.sc.Seed))
					if err := os.WriteFile(name, []byte(r.csv()), 0o644); err != nil {
						t.Error(err)
					}
				}
			}
			if t.Failed() {
				t.Logf("DCQCN timeline (Gb/s goodput/RP rate per flow):\n%s", ron.timeline(10))
			}
		})
	}
}

// TestReproducible runs one scenario twice per seed: the full per-flow
// timeline of completions (flow, virtual time of each), the per-interval
// bytes and the switch counters are identical; another seed gives a
// different run.
func TestReproducible(t *testing.T) {
	sc := base(4, true, 7)
	sc.Duration = 60 * time.Millisecond
	if testing.Short() {
		sc.Duration = 30 * time.Millisecond
	}
	a, b := run(t, sc), run(t, sc)
	sc2 := sc
	sc2.Seed = 8
	c := run(t, sc2)
	t.Log(a)
	t.Log(c)
	if a.hash != b.hash {
		t.Errorf("seed %d twice: completion timelines differ (%#x, %#x)", sc.Seed, a.hash, b.hash)
	}
	for i := range a.flow {
		if !slices.Equal(a.flow[i], b.flow[i]) {
			t.Errorf("seed %d twice: flow %d bytes per interval differ:\n%v\n%v", sc.Seed, i, a.flow[i], b.flow[i])
		}
	}
	if !slices.Equal(a.port, b.port) || a.steps != b.steps {
		t.Errorf("seed %d twice: switch port snapshots or step counts differ (steps %d, %d)", sc.Seed, a.steps, b.steps)
	}
	if a.hash == c.hash {
		t.Errorf("seeds %d and %d gave the same completion timeline", sc.Seed, sc2.Seed)
	}
	if a.marks() == 0 {
		t.Errorf("no marks: the runs never congested, so the seeds could not matter")
	}
}

// BenchmarkConvergence runs the scenario of TestConvergence per N, with
// DCQCN and without, and reports the last half's goodput as a fraction
// of the bottleneck rate, Jain's index, the drops (whole run and last
// half, and the end of the last 1 ms interval with a drop), the mean
// queue and Kmax (bytes), the CE marks and CNPs, and how many flows' QPs
// failed.
// Every iteration is the same run (same seed); run with -benchtime=1x.
func BenchmarkConvergence(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for _, on := range []bool{true, false} {
			name := fmt.Sprintf("N=%d/dcqcn", n)
			if !on {
				name = fmt.Sprintf("N=%d/nocc", n)
			}
			b.Run(name, func(b *testing.B) {
				var r *result
				for range b.N {
					r = run(b, base(n, on, 1))
				}
				all, late := r.drops()
				b.ReportMetric(r.goodput(), "goodput/bottleneck")
				b.ReportMetric(r.jain(), "jain")
				b.ReportMetric(float64(all), "drops")
				b.ReportMetric(float64(late), "drops-last-half")
				b.ReportMetric(r.meanQueue(), "mean-queue-B")
				b.ReportMetric(float64(r.sc.Switch.Kmax), "kmax-B")
				b.ReportMetric(float64(r.failed()), "failed-flows")
				b.ReportMetric(float64(r.counters[0].NPCNPSent), "cnps")
				b.ReportMetric(float64(r.marks()), "marks")
				b.ReportMetric(float64(r.lastDrop().Milliseconds()), "last-drop-ms")
			})
		}
	}
}
