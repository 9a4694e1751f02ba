// Package svgplot draws time series as a self-contained SVG image: stacked
// panels that share one x axis, each with its own y axis, any number of
// polylines with a legend, and horizontal reference lines (a bottleneck
// rate, a marking threshold). rocev2d congestion draws a congestion-control
// run with it: per-flow rates, the queue and the CNPs over time.
//
// The output uses no script, no external font or style sheet and no
// image: any browser or image viewer shows it as it is. It is a function of
// the input only — the same Plot gives the same bytes — so a drawing can
// be kept as a golden file and compared.
//
// It imports only the standard library (test/layering checks it);
// cmd/rocev2d is its only user.
package svgplot

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a panel.
type Series struct {
	// Name is the series' label in the legend (and its data-series
	// attribute); empty leaves it out of the legend.
	Name string
	// Y holds one value per Plot.X. A NaN value (or a missing one, when Y
	// is shorter than X) leaves that point out.
	Y []float64
	// Color is an SVG colour (e.g. "#1f77b4"); empty picks the panel's next
	// palette colour.
	Color string
	// Dashed draws the line dashed.
	Dashed bool
}

// HLine is a horizontal reference line across a panel, dashed; its label
// goes into the panel's legend.
type HLine struct {
	Y     float64
	Label string
	Color string // empty: grey
}

// Panel is one chart of the stack.
type Panel struct {
	// Title is written at the panel's top left.
	Title string
	// YLabel names the y axis and its unit, written vertically at its left.
	YLabel string
	// Series are drawn in order, each as one polyline.
	Series []Series
	// Lines are reference lines, drawn under the series.
	Lines []HLine
	// YMin and YMax fix the y range when YMax > YMin; otherwise it runs
	// from min(0, smallest value) to the largest value or line, rounded up
	// to a tick. Values outside the range are drawn at its edge.
	YMin, YMax float64
	// Height is the panel's plot area height in pixels; 0 means 160.
	Height int
}

// Plot is a stack of panels over a shared x axis.
type Plot struct {
	// Title is written above the first panel.
	Title string
	// XLabel names the x axis (under the last panel).
	XLabel string
	// X holds the x value of each point, in increasing order.
	X []float64
	// Panels are stacked top to bottom.
	Panels []Panel
	// Width is the image width in pixels; 0 means 960.
	Width int
}

// Layout constants, in pixels.
const (
	defaultWidth  = 960
	defaultHeight = 160
	marginLeft    = 76  // y tick labels and the y axis label
	marginRight   = 180 // the legends
	marginTop     = 54  // the plot title
	panelGap      = 34  // between panels: the next panel's title
	marginBottom  = 52  // x tick labels and the x axis label
	legendRow     = 15
	fontFamily    = "sans-serif"
)

// palette are the series colours (Tableau 10), used in order per panel.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
	"#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Geometry is where a panel's plot area lies in the image and the data
// ranges it maps; Layout returns it so that a caller (or a test) can map a
// value to its pixel.
type Geometry struct {
	Left, Top, Width, Height float64 // plot area, pixels
	XMin, XMax               float64 // x range
	YMin, YMax               float64 // y range
}

// PX maps an x value to its pixel column.
func (g Geometry) PX(x float64) float64 {
	return g.Left + (x-g.XMin)/(g.XMax-g.XMin)*g.Width
}

// PY maps a y value to its pixel row, clamped to the plot area.
func (g Geometry) PY(y float64) float64 {
	y = math.Max(g.YMin, math.Min(g.YMax, y))
	return g.Top + g.Height - (y-g.YMin)/(g.YMax-g.YMin)*g.Height
}

// Layout returns the geometry of every panel of p and the image size, or
// an error for a plot that cannot be drawn (no x values, x not increasing,
// a non-finite value in X, a panel range with YMax > YMin not finite).
func (p *Plot) Layout() (panels []Geometry, width, height int, err error) {
	if len(p.X) == 0 {
		return nil, 0, 0, errors.New("svgplot: no x values")
	}
	for i, x := range p.X {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, 0, 0, fmt.Errorf("svgplot: X[%d] is %v", i, x)
		}
		if i > 0 && x <= p.X[i-1] {
			return nil, 0, 0, fmt.Errorf("svgplot: X[%d] = %v does not follow X[%d] = %v", i, x, i-1, p.X[i-1])
		}
	}
	if len(p.Panels) == 0 {
		return nil, 0, 0, errors.New("svgplot: no panels")
	}
	width = p.Width
	if width <= 0 {
		width = defaultWidth
	}
	if width < marginLeft+marginRight+100 {
		return nil, 0, 0, fmt.Errorf("svgplot: width %d is too small", width)
	}
	xmin, xmax := p.X[0], p.X[len(p.X)-1]
	if xmax == xmin {
		xmin, xmax = xmin-0.5, xmax+0.5
	}
	top := float64(marginTop)
	for i := range p.Panels {
		pn := &p.Panels[i]
		h := pn.Height
		if h <= 0 {
			h = defaultHeight
		}
		lo, hi, err := pn.yRange()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("svgplot: panel %d (%s): %w", i, pn.Title, err)
		}
		if i > 0 {
			top += panelGap
		}
		panels = append(panels, Geometry{Left: marginLeft, Top: top, Width: float64(width - marginLeft - marginRight),
			Height: float64(h), XMin: xmin, XMax: xmax, YMin: lo, YMax: hi})
		top += float64(h)
	}
	return panels, width, int(top) + marginBottom, nil
}

// yRange is the panel's y range: fixed, or from the data rounded to ticks.
func (pn *Panel) yRange() (lo, hi float64, err error) {
	if pn.YMax > pn.YMin {
		if math.IsInf(pn.YMin, 0) || math.IsInf(pn.YMax, 0) {
			return 0, 0, fmt.Errorf("y range [%v, %v] is not finite", pn.YMin, pn.YMax)
		}
		return pn.YMin, pn.YMax, nil
	}
	lo, hi = 0, math.Inf(-1)
	see := func(v float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		lo = math.Min(lo, v)
		hi = math.Max(hi, v)
	}
	for _, s := range pn.Series {
		for _, v := range s.Y {
			see(v)
		}
	}
	for _, l := range pn.Lines {
		see(l.Y)
	}
	if math.IsInf(hi, -1) || hi <= lo {
		hi = lo + 1
	}
	step := niceStep(hi-lo, 5)
	lo = math.Floor(lo/step) * step
	hi = math.Ceil(hi/step) * step
	return lo, hi, nil
}

// niceStep returns a tick step of 1, 2 or 5 times a power of ten that cuts
// span into about n intervals.
func niceStep(span float64, n int) float64 {
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f <= 1:
		return p
	case f <= 2:
		return 2 * p
	case f <= 5:
		return 5 * p
	}
	return 10 * p
}

// ticks returns the multiples of a nice step within [lo, hi] (about n of
// them) and their labels: with one k, M or G suffix for all when the
// largest is at least a thousand, with as many decimals as the step needs.
func ticks(lo, hi float64, n int) (vals []float64, labels []string) {
	step := niceStep(hi-lo, n)
	first := math.Ceil(lo/step - 1e-9)
	for k := first; k*step <= hi+step*1e-9 && len(vals) < 100; k++ {
		vals = append(vals, k*step)
	}
	div, sfx := 1.0, ""
	big := math.Max(math.Abs(lo), math.Abs(hi))
	for _, u := range []struct {
		div float64
		sfx string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if big >= u.div {
			div, sfx = u.div, u.sfx
			break
		}
	}
	decimals := 0
	if s := step / div; s < 1 {
		decimals = int(math.Ceil(-math.Log10(s) - 1e-9))
	}
	for _, v := range vals {
		l := num(v/div, decimals)
		if l != "0" {
			l += sfx
		}
		labels = append(labels, l)
	}
	return vals, labels
}

// num formats v with at most d decimals (trailing zeros trimmed), without
// "-0".
func num(v float64, d int) string {
	s := strconv.FormatFloat(v, 'f', d, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if strings.Trim(s, "-0.") == "" {
		s = strings.TrimPrefix(s, "-")
	}
	return s
}

// coord formats a pixel coordinate: two decimals are finer than any
// screen and keep the file deterministic and small.
func coord(v float64) string { return num(v, 2) }

// esc escapes text for an SVG text node or attribute value.
func esc(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&quot;")
		case '\'':
			b.WriteString("&apos;")
		default:
			if r < 0x20 && r != '\t' && r != '\n' || r == 0xfffd {
				b.WriteRune('?')
				continue
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Encode writes the plot as an SVG document to w.
func (p *Plot) Encode(w io.Writer) error {
	geo, width, height, err := p.Layout()
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	pf := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	pf(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	pf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="11">`+"\n",
		width, height, width, height, fontFamily)
	pf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	if p.Title != "" {
		pf(`<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginLeft, esc(p.Title))
	}
	xt, xl := ticks(geo[0].XMin, geo[0].XMax, 10)
	for i := range p.Panels {
		p.encodePanel(bw, &p.Panels[i], geo[i], xt, xl, i == len(p.Panels)-1)
	}
	if p.XLabel != "" {
		g := geo[len(geo)-1]
		pf(`<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n",
			coord(g.Left+g.Width/2), coord(g.Top+g.Height+40), esc(p.XLabel))
	}
	pf("</svg>\n")
	return bw.Flush()
}

// encodePanel writes one panel: frame, grid and ticks, reference lines,
// series and legend.
func (p *Plot) encodePanel(bw *bufio.Writer, pn *Panel, g Geometry, xt []float64, xl []string, last bool) {
	pf := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	pf(`<g class="panel" data-title="%s">`+"\n", esc(pn.Title))
	right, bottom := g.Left+g.Width, g.Top+g.Height
	if pn.Title != "" {
		pf(`<text x="%s" y="%s" font-size="12" font-weight="bold">%s</text>`+"\n", coord(g.Left), coord(g.Top-6), esc(pn.Title))
	}
	// Grid and ticks.
	for i, x := range xt {
		px := coord(g.PX(x))
		pf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e6e6e6"/>`+"\n", px, coord(g.Top), px, coord(bottom))
		if last {
			pf(`<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", px, coord(bottom+15), xl[i])
		}
	}
	yt, yl := ticks(g.YMin, g.YMax, 4)
	for i, y := range yt {
		py := coord(g.PY(y))
		pf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e6e6e6"/>`+"\n", coord(g.Left), py, coord(right), py)
		pf(`<text x="%s" y="%s" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", coord(g.Left-5), py, yl[i])
	}
	pf(`<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#555"/>`+"\n",
		coord(g.Left), coord(g.Top), coord(g.Width), coord(g.Height))
	if pn.YLabel != "" {
		cx, cy := coord(g.Left-58), coord(g.Top+g.Height/2)
		pf(`<text x="%s" y="%s" text-anchor="middle" transform="rotate(-90 %s %s)">%s</text>`+"\n", cx, cy, cx, cy, esc(pn.YLabel))
	}
	// Reference lines.
	for _, l := range pn.Lines {
		if math.IsNaN(l.Y) || math.IsInf(l.Y, 0) {
			continue
		}
		py := coord(g.PY(l.Y))
		pf(`<line class="ref" data-label="%s" x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-dasharray="6 3"/>`+"\n",
			esc(l.Label), coord(g.Left), py, coord(right), py, esc(lineColor(l)))
	}
	// Series.
	var b strings.Builder
	for i, s := range pn.Series {
		b.Reset()
		for k, x := range p.X {
			if k >= len(s.Y) || math.IsNaN(s.Y[k]) {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(coord(g.PX(x)))
			b.WriteByte(',')
			b.WriteString(coord(g.PY(s.Y[k])))
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="4 2"`
		}
		pf(`<polyline data-series="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round"%s points="%s"/>`+"\n",
			esc(s.Name), esc(seriesColor(s, i)), dash, b.String())
	}
	// Legend, right of the plot area: the named series, then the labelled
	// reference lines (dashed); rows that do not fit are summarised.
	type entry struct {
		label, color string
		dashed       bool
	}
	var legend []entry
	for i, s := range pn.Series {
		if s.Name != "" {
			legend = append(legend, entry{s.Name, seriesColor(s, i), s.Dashed})
		}
	}
	for _, l := range pn.Lines {
		if l.Label != "" && !math.IsNaN(l.Y) && !math.IsInf(l.Y, 0) {
			legend = append(legend, entry{l.Label, lineColor(l), true})
		}
	}
	rows := max(1, int(g.Height)/legendRow)
	lx := right + 12
	for k, e := range legend {
		y := coord(g.Top + 8 + float64(k*legendRow))
		if k == rows-1 && len(legend) > rows {
			pf(`<text x="%s" y="%s" dominant-baseline="middle">… %d more</text>`+"\n", coord(lx), y, len(legend)-k)
			break
		}
		dash := ""
		if e.dashed {
			dash = ` stroke-dasharray="4 2"`
		}
		pf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`+"\n",
			coord(lx), y, coord(lx+20), y, esc(e.color), dash)
		pf(`<text x="%s" y="%s" dominant-baseline="middle">%s</text>`+"\n", coord(lx+25), y, esc(e.label))
	}
	pf("</g>\n")
}

// seriesColor is the colour of the i-th series of a panel.
func seriesColor(s Series, i int) string {
	if s.Color != "" {
		return s.Color
	}
	return palette[i%len(palette)]
}

// lineColor is the colour of a reference line.
func lineColor(l HLine) string {
	if l.Color != "" {
		return l.Color
	}
	return "#666"
}
