package congestion

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/svgplot"
)

// ccSample is what rocev2d congestion records every sample interval.
// Rates are bits per second over the interval that ends at T; the event
// counts are those of the interval.
type ccSample struct {
	T       time.Duration // since the start of the run
	Goodput []float64     // per flow: payload bits completed / interval
	Rate    []float64     // per flow: the DCQCN rate at T (QP.Congestion().Rate), NaN before the flow starts
	Queue   float64       // bottleneck queue depth at T, bytes
	// MeanQueue is the time-averaged depth over the interval, bytes.
	MeanQueue  float64
	CNPSent    uint64 // np_cnp_sent of the receiver
	CNPHandled uint64 // rp_cnp_handled of the senders
	Marked     uint64 // packets the bottleneck marked CE
	Dropped    uint64 // packets the bottleneck dropped
}

// ccRun is a congestion run's parameters and samples: the input of the
// CSV, the plot and the summary.
type ccRun struct {
	Flows      int
	Bottleneck float64       // bits/s of IP datagrams
	Buffer     int           // bytes
	Kmin, Kmax int           // bytes
	Pmax       float64       // marking probability at Kmax
	DCQCN      bool          // the senders' reaction points are on
	Interval   time.Duration // sample interval
	Starts     []time.Duration
	Samples    []ccSample
	Failed     []string // flows whose QP failed: which, when, why
}

// aggregate returns the sum of a sample's per-flow goodputs.
func (s *ccSample) aggregate() float64 {
	var sum float64
	for _, g := range s.Goodput {
		sum += g
	}
	return sum
}

// ccHeader returns the CSV header: time, then each flow's goodput and
// DCQCN rate, then the aggregate, the queue and the interval's events.
func ccHeader(flows int) []string {
	h := []string{"time_s"}
	for i := 1; i <= flows; i++ {
		h = append(h, fmt.Sprintf("flow%d_goodput_gbps", i), fmt.Sprintf("flow%d_rate_gbps", i))
	}
	return append(h, "aggregate_gbps", "queue_bytes", "mean_queue_bytes", "cnp_sent", "cnp_handled", "ce_marked", "dropped")
}

// gbps formats bits/s as Gb/s with 6 decimals (1 kb/s resolution); NaN
// (no value) is an empty field.
func gbps(v float64) string {
	if math.IsNaN(v) {
		return ""
	}
	return strconv.FormatFloat(v/1e9, 'f', 6, 64)
}

// WriteCSV writes the run's samples as CSV with a header row.
func (r *ccRun) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(ccHeader(r.Flows)); err != nil {
		return err
	}
	row := make([]string, 0, 2*r.Flows+8)
	for i := range r.Samples {
		s := &r.Samples[i]
		row = append(row[:0], strconv.FormatFloat(s.T.Seconds(), 'f', -1, 64))
		for f := range r.Flows {
			row = append(row, gbps(at(s.Goodput, f)), gbps(at(s.Rate, f)))
		}
		row = append(row, gbps(s.aggregate()),
			strconv.FormatFloat(s.Queue, 'f', 0, 64), strconv.FormatFloat(s.MeanQueue, 'f', 0, 64),
			strconv.FormatUint(s.CNPSent, 10), strconv.FormatUint(s.CNPHandled, 10),
			strconv.FormatUint(s.Marked, 10), strconv.FormatUint(s.Dropped, 10))
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// at returns v[i], or NaN past its end.
func at(v []float64, i int) float64 {
	if i < len(v) {
		return v[i]
	}
	return math.NaN()
}

// Plot returns the run drawn as stacked panels: per-flow goodput, per-flow
// DCQCN rate, aggregate goodput against the bottleneck, the queue with
// its marking thresholds, and the events of each interval.
func (r *ccRun) Plot() *svgplot.Plot {
	n := len(r.Samples)
	x := make([]float64, n)
	good := make([][]float64, r.Flows)
	rate := make([][]float64, r.Flows)
	for f := range r.Flows {
		good[f] = make([]float64, n)
		rate[f] = make([]float64, n)
	}
	agg := make([]float64, n)
	queue := make([]float64, n)
	cnpS, cnpH, marks, drops := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range r.Samples {
		s := &r.Samples[i]
		x[i] = s.T.Seconds() * 1e3
		for f := range r.Flows {
			good[f][i] = at(s.Goodput, f) / 1e9
			rate[f][i] = at(s.Rate, f) / 1e9
		}
		agg[i] = s.aggregate() / 1e9
		queue[i] = s.Queue / 1e3
		cnpS[i], cnpH[i] = float64(s.CNPSent), float64(s.CNPHandled)
		marks[i], drops[i] = float64(s.Marked), float64(s.Dropped)
	}
	bn := r.Bottleneck / 1e9
	var gs, rs []svgplot.Series
	for f := range r.Flows {
		name := fmt.Sprintf("flow %d", f+1)
		gs = append(gs, svgplot.Series{Name: name, Y: good[f]})
		rs = append(rs, svgplot.Series{Name: name, Y: rate[f]})
	}
	ratePanel := svgplot.Panel{Title: "DCQCN rate per flow (reaction point)", YLabel: "Gb/s", Series: rs}
	if !r.DCQCN {
		ratePanel.Title = "DCQCN rate per flow (off: line rate)"
	}
	onOff := map[bool]string{true: "on", false: "off"}[r.DCQCN]
	return &svgplot.Plot{
		Title: fmt.Sprintf("%d flows into a %s Gb/s bottleneck, DCQCN %s (Kmin %s, Kmax %s, Pmax %g, buffer %s)",
			r.Flows, strconv.FormatFloat(bn, 'g', 4, 64), onOff, byteSize(r.Kmin), byteSize(r.Kmax), r.Pmax, byteSize(r.Buffer)),
		XLabel: "time (ms)",
		X:      x,
		Panels: []svgplot.Panel{
			{Title: "goodput per flow (completions)", YLabel: "Gb/s", Series: gs,
				Lines: []svgplot.HLine{{Y: bn / float64(max(1, r.Flows)), Label: "fair share"}}},
			ratePanel,
			{Title: "aggregate goodput", YLabel: "Gb/s", Series: []svgplot.Series{{Name: "aggregate", Y: agg, Color: "#222"}},
				Lines: []svgplot.HLine{{Y: bn, Label: "bottleneck", Color: "#d62728"}}},
			{Title: "bottleneck queue", YLabel: "KB", Series: []svgplot.Series{{Name: "depth", Y: queue, Color: "#1f77b4"}},
				Lines: []svgplot.HLine{{Y: float64(r.Kmin) / 1e3, Label: "Kmin", Color: "#2ca02c"},
					{Y: float64(r.Kmax) / 1e3, Label: "Kmax", Color: "#ff7f0e"}}},
			{Title: fmt.Sprintf("events per %v interval", r.Interval), YLabel: "count", Series: []svgplot.Series{
				{Name: "CNPs sent", Y: cnpS, Color: "#9467bd"}, {Name: "CNPs handled", Y: cnpH, Color: "#17becf", Dashed: true},
				{Name: "CE marks", Y: marks, Color: "#ff7f0e"}, {Name: "drops", Y: drops, Color: "#d62728"}}},
		},
	}
}

// byteSize formats a byte count: in KiB or MiB when it is a whole number
// of them (as the defaults are), else in KB or MB with one decimal.
func byteSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + " MB"
	case n >= 1e3:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + " KB"
	}
	return fmt.Sprintf("%d B", n)
}

// ccSummary is the end-of-run digest.
type ccSummary struct {
	Goodput     float64 // aggregate goodput over the run after the last flow started, bits/s
	LastHalf    float64 // aggregate goodput over the last half, bits/s
	Utilization float64 // LastHalf / Bottleneck
	Jain        float64 // Jain's fairness index of the per-flow goodputs over the last half; NaN when all are zero
	Drops       uint64  // all drops
	LateDrops   uint64  // drops in the last half
	MeanQueue   float64 // time-averaged queue over the last half, bytes
	CNPSent     uint64
	CNPHandled  uint64
	Marked      uint64
}

// Summary computes the run's digest. The "last half" is the samples whose
// interval ends after half the run.
func (r *ccRun) Summary() ccSummary {
	var s ccSummary
	n := len(r.Samples)
	if n == 0 {
		return s
	}
	end := r.Samples[n-1].T
	var lastStart time.Duration
	for _, st := range r.Starts {
		lastStart = max(lastStart, st)
	}
	per := make([]float64, r.Flows)
	var all, allN, half, halfN float64
	for i := range r.Samples {
		sm := &r.Samples[i]
		s.Drops += sm.Dropped
		s.CNPSent += sm.CNPSent
		s.CNPHandled += sm.CNPHandled
		s.Marked += sm.Marked
		if sm.T > lastStart {
			all += sm.aggregate()
			allN++
		}
		if sm.T > end/2 {
			s.LateDrops += sm.Dropped
			half += sm.aggregate()
			s.MeanQueue += sm.MeanQueue
			halfN++
			for f := range r.Flows {
				if g := at(sm.Goodput, f); !math.IsNaN(g) {
					per[f] += g
				}
			}
		}
	}
	if allN > 0 {
		s.Goodput = all / allN
	}
	if halfN > 0 {
		s.LastHalf = half / halfN
		s.MeanQueue /= halfN
	}
	if r.Bottleneck > 0 {
		s.Utilization = s.LastHalf / r.Bottleneck
	}
	s.Jain = jain(per)
	return s
}

// jain returns Jain's fairness index (Σx)²/(n·Σx²) of x: 1 when all are
// equal, 1/n when one takes everything; NaN when it is undefined, for no
// data or all zeros (no flow got anything: neither fair nor unfair).
func jain(x []float64) float64 {
	var sum, sq float64
	for _, v := range x {
		sum += v
		sq += v * v
	}
	if sq == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(x)) * sq)
}

// formatJain formats Jain's index with three decimals, "n/a" when it is
// undefined.
func formatJain(j float64) string {
	if math.IsNaN(j) {
		return "n/a"
	}
	return strconv.FormatFloat(j, 'f', 3, 64)
}

// format is the summary line rocev2d congestion prints for run r.
func (s ccSummary) format(r *ccRun) string {
	return fmt.Sprintf("last half: aggregate goodput %.3f Gb/s = %.1f %% of the %.3f Gb/s bottleneck, "+
		"Jain fairness %s, drops %d, mean queue %.1f KB (Kmax %s); "+
		"whole run: goodput %.3f Gb/s after the last start, drops %d, CE marks %d, CNPs sent %d, handled %d",
		s.LastHalf/1e9, 100*s.Utilization, r.Bottleneck/1e9, formatJain(s.Jain), s.LateDrops, s.MeanQueue/1e3, byteSize(r.Kmax),
		s.Goodput/1e9, s.Drops, s.Marked, s.CNPSent, s.CNPHandled) + failedNote(len(r.Failed))
}

// failedNote is the summary's mention of failed flows, if any.
func failedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d flows FAILED", n)
}
