package congestion

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// syntheticRun is a 2-flow run of 10 samples of 1 ms into a 10 Gb/s
// bottleneck: flow 1 alone at 8 Gb/s for 2 ms, then both at 4.5 Gb/s;
// the queue steps between 20 and 40 KB; flow 2 starts at 2 ms.
func syntheticRun() *ccRun {
	r := &ccRun{Flows: 2, Bottleneck: 10e9, Buffer: 200000, Kmin: 20000, Kmax: 80000, Pmax: 0.2, DCQCN: true,
		Interval: time.Millisecond, Starts: []time.Duration{0, 2 * time.Millisecond}}
	for i := 1; i <= 10; i++ {
		s := ccSample{T: time.Duration(i) * time.Millisecond, Queue: float64(20000 * (1 + i%2)), MeanQueue: 30000,
			CNPSent: uint64(i), CNPHandled: uint64(i), Marked: uint64(2 * i)}
		if i <= 2 {
			s.Goodput = []float64{8e9, 0}
			s.Rate = []float64{10e9, math.NaN()}
			s.Dropped = 3
		} else {
			s.Goodput = []float64{4.5e9, 4.5e9}
			s.Rate = []float64{5e9, 5e9}
		}
		r.Samples = append(r.Samples, s)
	}
	return r
}

func TestCongestionCSV(t *testing.T) {
	r := syntheticRun()
	var buf bytes.Buffer
	if err := r.WriteCSV(&buf); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := "time_s flow1_goodput_gbps flow1_rate_gbps flow2_goodput_gbps flow2_rate_gbps aggregate_gbps queue_bytes mean_queue_bytes cnp_sent cnp_handled ce_marked dropped"
	if got := strings.Join(rows[0], " "); got != want {
		t.Fatalf("header %q\nwant   %q", got, want)
	}
	if len(rows) != 11 {
		t.Fatalf("%d rows, want 11", len(rows))
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	num := func(row []string, name string) float64 {
		t.Helper()
		v, err := strconv.ParseFloat(row[col[name]], 64)
		if err != nil {
			t.Fatalf("%s = %q: %v", name, row[col[name]], err)
		}
		return v
	}
	if r1 := rows[1]; num(r1, "time_s") != 0.001 || num(r1, "flow1_goodput_gbps") != 8 || r1[col["flow2_rate_gbps"]] != "" ||
		num(r1, "aggregate_gbps") != 8 || num(r1, "queue_bytes") != 40000 || num(r1, "dropped") != 3 {
		t.Errorf("row 1 %v", r1)
	}
	if r10 := rows[10]; num(r10, "time_s") != 0.01 || num(r10, "flow2_rate_gbps") != 5 || num(r10, "aggregate_gbps") != 9 ||
		num(r10, "ce_marked") != 20 || num(r10, "cnp_handled") != 10 {
		t.Errorf("row 10 %v", r10)
	}
}

func TestCongestionSVG(t *testing.T) {
	r := syntheticRun()
	var a, b bytes.Buffer
	if err := r.Plot().Encode(&a); err != nil {
		t.Fatal(err)
	}
	if err := r.Plot().Encode(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same run plotted to different bytes")
	}
	d := xml.NewDecoder(&a)
	series := map[string]int{}
	refs := map[string]bool{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("malformed SVG: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		for _, at := range se.Attr {
			switch {
			case se.Name.Local == "polyline" && at.Name.Local == "data-series":
				series[at.Value]++
			case se.Name.Local == "line" && at.Name.Local == "data-label":
				refs[at.Value] = true
			}
		}
	}
	// goodput and rate panels: one line per flow each; then the
	// aggregate, the queue and the four event series.
	want := map[string]int{"flow 1": 2, "flow 2": 2, "aggregate": 1, "depth": 1, "CNPs sent": 1, "CNPs handled": 1, "CE marks": 1, "drops": 1}
	for k, v := range want {
		if series[k] != v {
			t.Errorf("%d polylines %q, want %d (all: %v)", series[k], k, v, series)
		}
	}
	if len(series) != len(want) {
		t.Errorf("series %v, want %v", series, want)
	}
	for _, l := range []string{"fair share", "bottleneck", "Kmin", "Kmax"} {
		if !refs[l] {
			t.Errorf("no reference line %q (have %v)", l, refs)
		}
	}
	// Scales: the aggregate panel's axis runs to the bottleneck (10 Gb/s),
	// the queue's to Kmax (80 KB).
	geo, _, _, err := r.Plot().Layout()
	if err != nil {
		t.Fatal(err)
	}
	if geo[2].YMax != 10 || geo[3].YMax != 80 || geo[0].XMin != 1 || geo[0].XMax != 10 {
		t.Errorf("aggregate axis to %v, queue axis to %v, x %v..%v; want 10, 80, 1..10", geo[2].YMax, geo[3].YMax, geo[0].XMin, geo[0].XMax)
	}
}

func TestCongestionSummary(t *testing.T) {
	r := syntheticRun()
	s := r.Summary()
	// After the last start (2 ms): 8 samples of 9 Gb/s; the last half
	// (after 5 ms) too.
	if math.Abs(s.Goodput-9e9) > 1 || math.Abs(s.LastHalf-9e9) > 1 || math.Abs(s.Utilization-0.9) > 1e-9 {
		t.Errorf("goodput %v, last half %v (%v of the bottleneck), want 9e9, 9e9 (0.9)", s.Goodput, s.LastHalf, s.Utilization)
	}
	if s.Jain != 1 || s.Drops != 6 || s.LateDrops != 0 || s.MeanQueue != 30000 || s.CNPSent != 55 || s.Marked != 110 {
		t.Errorf("summary %+v", s)
	}
	line := s.format(r)
	for _, w := range []string{"last half: aggregate goodput 9.000 Gb/s = 90.0 %", "Jain fairness 1.000, drops 0,", "mean queue 30.0 KB",
		"whole run: goodput 9.000 Gb/s after the last start, drops 6,"} {
		if !strings.Contains(line, w) {
			t.Errorf("summary %q lacks %q", line, w)
		}
	}
}

// TestCongestionSummaryNoGoodput: Jain's index of flows that all got
// nothing is undefined: "n/a", not 0.000 (which reads as unfair).
func TestCongestionSummaryNoGoodput(t *testing.T) {
	r := syntheticRun()
	for i := range r.Samples {
		r.Samples[i].Goodput = []float64{0, 0}
	}
	s := r.Summary()
	if !math.IsNaN(s.Jain) {
		t.Errorf("Jain %v, want NaN", s.Jain)
	}
	if line := s.format(r); !strings.Contains(line, "Jain fairness n/a, drops 0,") {
		t.Errorf("summary %q lacks %q", line, "Jain fairness n/a")
	}
	// The whole command, whose flows get nothing through in 2 ms of a
	// 2 ms one-way delay; its CSV holds the zeros.
	code, out, errOut, rows, _ := congestionRun(t, "-n", "2", "--duration", "2ms", "--stagger", "0", "--interval", "1ms", "--delay", "2ms")
	if code != cli.ExitOK || !strings.Contains(out, "Jain fairness n/a,") || len(rows) < 2 {
		t.Errorf("exit %d, %d CSV rows; want %d, Jain n/a and samples\n%s%s", code, len(rows), cli.ExitOK, out, errOut)
	}
}

func TestByteSize(t *testing.T) {
	for n, want := range map[int]string{5 << 10: "5 KiB", 200 << 10: "200 KiB", 512 << 10: "512 KiB", 1 << 20: "1 MiB",
		40000: "40.0 KB", 1500000: "1.5 MB", 0: "0 B", 999: "999 B", 1536 << 10: "1536 KiB"} {
		if got := byteSize(n); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestJain(t *testing.T) {
	for _, tc := range []struct {
		x    []float64
		want float64
	}{
		{[]float64{1, 1, 1, 1}, 1},
		{[]float64{1, 0, 0, 0}, 0.25},
		{[]float64{3, 1}, 16.0 / 20},
		{[]float64{0, 0}, math.NaN()}, // undefined: nobody got anything
		{nil, math.NaN()},
	} {
		if got := jain(tc.x); math.IsNaN(got) != math.IsNaN(tc.want) || math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("jain(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
}
