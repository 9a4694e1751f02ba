//go:build unix

package scale

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestScale runs the scale table over the in-memory network and over
// loopback sockets with small counts and checks every row: the QP counts
// asked for, in order, and measured values that make sense (a heap per QP
// within the 16 KiB budget, goroutines, positive rates, a ratio).
func TestScale(t *testing.T) {
	runs := [][]string{
		{"scale", "--mem", "--qps", "1,3,500", "--rounds", "2", "--chunk", "32", "--size", "4096"},
		{"scale", "--qps", "2,20", "--rounds", "2", "--chunk", "16", "-v"},
	}
	if testing.Short() {
		runs = runs[:1]
	}
	for _, args := range runs {
		code, out, errOut := runInRetry(t, args...)
		if code != cli.ExitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		want := strings.Split(args[indexOf(args, "--qps")+1], ",")
		var got []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) != 8 || f[0] == "QPs" {
				continue
			}
			n, err := strconv.Atoi(f[0])
			if err != nil {
				continue
			}
			got = append(got, f[0])
			v := make([]float64, 8)
			for i := 1; i < 8; i++ {
				if v[i], err = strconv.ParseFloat(f[i], 64); err != nil {
					t.Fatalf("%v: field %d of %q: %v", args, i, line, err)
				}
			}
			// The 1 QP row carries the QP table's first page (32 KiB);
			// below a few hundred QPs the heap's own noise (a collection's
			// leftovers, the previous row's garbage: some 100 KB) can
			// outweigh the QPs (CI once measured -5 KB per QP at 50).
			if n >= 500 && (v[1] <= 0 || v[1] > 16<<10) {
				t.Errorf("%v: %d QPs: %v bytes per idle QP, want (0, 16 KiB]", args, n, v[1])
			}
			if v[2] < 3 || v[3] <= 0 || v[4] <= 0 || v[5] <= 0 || v[6] <= 0 || v[7] <= 0 || v[7] > v[6] {
				t.Errorf("%v: implausible row %q", args, line)
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%v: rows for %v, want %v:\n%s", args, got, want, out)
		}
		if indexOf(args, "-v") >= 0 && !strings.Contains(out, "counters 127.0.0.1 (20 QPs)") {
			t.Errorf("-v: no counters:\n%s", out)
		}
	}
}

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

// TestScaleFlags: bad options are refused with the usage exit status.
func TestScaleFlags(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"--qps", "1,x"}, "--qps"},
		{[]string{"--qps", "0"}, "--qps"},
		{[]string{"--rounds", "0"}, "--rounds"},
		{[]string{"--chunk", "-1"}, "--chunk"},
		{[]string{"--size", "0"}, "--size"},
		{[]string{"--window", "0"}, "--window"},
		{[]string{"--active", "--depth", "0"}, "--depth"},
		{[]string{"--active", "--duration", "0s"}, "--duration"},
		{[]string{"--duration", "1s"}, "--duration applies to --active"},
		{[]string{"--depth", "2"}, "--depth applies to --active"},
		{[]string{"--active", "--workers", "0"}, "--workers"},
		{[]string{"--workers", "2"}, "--workers applies to --active"},
		{[]string{"--own-mr"}, "--own-mr applies to --active"},
		{[]string{"--a", "127.0.0.5", "--b", "127.0.0.5"}, "different addresses"},
		{[]string{"extra"}, "unexpected argument"},
	}
	for _, tc := range tests {
		code, out, errOut := runIn(t, append([]string{"scale"}, tc.args...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%v: exit %d, %q%q; want exit %d naming %q", tc.args, code, out, errOut, cli.ExitUsage, tc.msg)
		}
	}
	if code, out, _ := runIn(t, "help", "scale"); code != cli.ExitOK || !strings.Contains(out, "B/idle QP") {
		t.Errorf("help scale: exit %d\n%s", code, out)
	}
}

// TestScaleSmall: tiny WRITEs still show their goodput (it printed as 0
// with no decimals), and the ratio is a true median.
func TestScaleSmall(t *testing.T) {
	code, out, errOut := runIn(t, "scale", "--mem", "--qps", "1,2", "--rounds", "2", "--chunk", "64", "--size", "1")
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 8 || f[0] == "QPs" {
			continue
		}
		rows++
		for _, i := range []int{4, 5} {
			if v, err := strconv.ParseFloat(f[i], 64); err != nil || v <= 0 {
				t.Errorf("column %d of %q: %q, want a positive goodput", i+1, line, f[i])
			}
		}
	}
	if rows != 2 {
		t.Errorf("%d rows, want 2:\n%s", rows, out)
	}
	for _, tc := range []struct {
		x    []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{1, 9}, 5}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.x); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
	for v, want := range map[float64]string{2748.4: "2748", 42.25: "42.2", 4.257: "4.26", 0.4249: "0.42", 0.00123: "0.0012", 0: "0"} {
		if got := formatMBs(v); got != want {
			t.Errorf("formatMBs(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestScaleActive: --active keeps every QP busy at once and prints, per
// QP count, the goodputs, the median and lowest round ratio and the
// fairness figures, each within its range; the lowest ratio is no
// higher than the median. With --workers and --own-mr (the outside-style
// probe: goroutines with a CQ each, a region pair per QP) every QP moves
// bytes (min/max above 0: no worker's QPs were left out).
func TestScaleActive(t *testing.T) {
	runs := [][]string{
		{"scale", "--mem", "--active", "--qps", "1,300", "--rounds", "3", "--size", "4096", "--duration", "30ms"},
		{"scale", "--mem", "--active", "--qps", "1,200", "--rounds", "2", "--size", "4096", "--duration", "30ms", "--workers", "4", "--own-mr"},
		{"scale", "--active", "--qps", "50", "--rounds", "2", "--size", "4096", "--duration", "30ms", "--depth", "2"},
	}
	if testing.Short() {
		runs = runs[:2]
	}
	for _, args := range runs {
		code, out, errOut := runInRetry(t, args...)
		if code != cli.ExitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		var got []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) != 7 || f[0] == "QPs" {
				continue
			}
			if _, err := strconv.Atoi(f[0]); err != nil {
				continue
			}
			got = append(got, f[0])
			v := make([]float64, 7)
			for i := 1; i < 7; i++ {
				var err error
				if v[i], err = strconv.ParseFloat(f[i], 64); err != nil {
					t.Fatalf("%v: field %d of %q: %v", args, i, line, err)
				}
			}
			mbs, mbs1, ratio, lo, jain, minMax := v[1], v[2], v[3], v[4], v[5], v[6]
			if mbs <= 0 || mbs1 <= 0 || lo <= 0 || lo > ratio || jain <= 0 || jain > 1 || minMax <= 0 || minMax > 1 {
				t.Errorf("%v: implausible row %q", args, line)
			}
			if f[0] == "1" && (jain != 1 || minMax != 1) {
				t.Errorf("%v: one QP is always fair to itself: %q", args, line)
			}
		}
		want := strings.Split(args[indexOf(args, "--qps")+1], ",")
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%v: rows for %v, want %v:\n%s", args, got, want, out)
		}
		// Every row has a line per round splitting its ratio (getrusage
		// answers on the systems the tests run on).
		if rounds := strings.Count(out, "\n  round "); runtime.GOOS == "linux" && rounds != len(want)*atoi(t, args[indexOf(args, "--rounds")+1]) {
			t.Errorf("%v: %d round lines, want one per round per row:\n%s", args, rounds, out)
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRatioStats: the median and lowest ratio of the rounds, with the
// rounds left in order (printRoundCores names rounds by index).
func TestRatioStats(t *testing.T) {
	r := []float64{0.9, 0.5, 1.1, 0.7}
	med, lo := ratioStats(r)
	if med != 0.8 || lo != 0.5 {
		t.Errorf("median %v, lowest %v; want 0.8, 0.5", med, lo)
	}
	if want := []float64{0.9, 0.5, 1.1, 0.7}; !slices.Equal(r, want) {
		t.Errorf("rounds reordered to %v", r)
	}
}

// TestFairness: Jain's index and min/max of a few distributions.
func TestFairness(t *testing.T) {
	for _, tc := range []struct {
		x            []uint64
		jain, minMax float64
	}{
		{nil, 0, 0},
		{[]uint64{0, 0}, 0, 0},
		{[]uint64{5}, 1, 1},
		{[]uint64{3, 3, 3, 3}, 1, 1},
		{[]uint64{1, 0, 0, 0}, 0.25, 0},
		{[]uint64{1, 2}, 9.0 / 10, 0.5},
	} {
		j, m := fairness(tc.x)
		if d := j - tc.jain; d > 1e-12 || d < -1e-12 || m != tc.minMax {
			t.Errorf("fairness(%v) = %v, %v; want %v, %v", tc.x, j, m, tc.jain, tc.minMax)
		}
	}
}

// TestActiveRoundsNothingMoved: a side that moved nothing prints its CPU
// per MB as "n/a" with the reason, not as cpu/0 (+Inf), and so does a
// side whose CPU time was not measured; a round's line splits its ratio
// into each side's cores and CPU per MB.
func TestActiveRoundsNothingMoved(t *testing.T) {
	n := activeRun{bytes: 0, d: time.Second, cpu: 500 * time.Millisecond, cpuOK: true}
	one := activeRun{bytes: 2e9, d: 2 * time.Second, cpu: time.Second, cpuOK: true, gcs: 1, allocs: 7}
	row := scaleResult{roundRatios: []float64{0}, cpuN: n.cpu, bytesN: n.bytes, cpu1: one.cpu, bytes1: one.bytes,
		cpuMeasured: true, rounds: []activeRound{{n: n, one: one}}}
	var b strings.Builder
	printActiveRounds(&b, 10000, row)
	out := b.String()
	for _, bad := range []string{"Inf", "NaN"} {
		if strings.Contains(out, bad) {
			t.Errorf("output has %s:\n%s", bad, out)
		}
	}
	for _, want := range []string{
		"CPU per MB: 10000 QPs n/a (moved nothing), 1 QP 0.500 ms",
		"round 1: 0.00; 10000 QPs 0.50 cores x n/a (moved nothing) per MB, 1 QP 0.50 cores x 0.500 ms per MB (0.0+0.0 context switches per MB); GCs 1, heap objects allocated 7",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if got := formatCPUPerMB(0, 1e6); got != "n/a (no CPU time measured)" {
		t.Errorf("formatCPUPerMB(0, 1 MB) = %q", got)
	}
	b.Reset()
	printActiveRounds(&b, 3, scaleResult{roundRatios: []float64{1}, rounds: []activeRound{{}}})
	if out := b.String(); out != "  rounds 1.00\n" {
		t.Errorf("CPU not measured: %q, want the ratios alone", out)
	}
}
