package svgplot

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
)

// element is a decoded SVG element: its name and attributes.
type element struct {
	name  string
	attrs map[string]string
	text  string // character data directly inside it (text elements)
}

// decode parses an SVG with encoding/xml (failing the test on malformed
// XML) and returns its elements in document order.
func decode(t *testing.T, svg []byte) []element {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	var out []element
	var stack []int
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("malformed SVG: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := element{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
			stack = append(stack, len(out)-1)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				out[stack[len(stack)-1]].text += string(tok)
			}
		}
	}
	if len(stack) != 0 {
		t.Fatalf("unclosed elements")
	}
	return out
}

// points parses a polyline's points attribute.
func points(t *testing.T, s string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(s) {
		x, y, ok := strings.Cut(p, ",")
		if !ok {
			t.Fatalf("point %q", p)
		}
		fx, err1 := strconv.ParseFloat(x, 64)
		fy, err2 := strconv.ParseFloat(y, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("point %q", p)
		}
		out = append(out, [2]float64{fx, fy})
	}
	return out
}

// synthetic is a plot of known data: x 0..10 s; two flows, one rising
// linearly 0..10, one constant 5 with a NaN at x=3; a second panel with a
// reference line at 40 and a series peaking at 30.
func synthetic() *Plot {
	p := &Plot{Title: "test <run> & co", XLabel: "time (s)"}
	var a, b, q []float64
	for i := 0; i <= 10; i++ {
		p.X = append(p.X, float64(i))
		a = append(a, float64(i))
		b = append(b, 5)
		q = append(q, 30*math.Sin(float64(i)/10*math.Pi))
	}
	b[3] = math.NaN()
	p.Panels = []Panel{
		{Title: "rate", YLabel: "Gb/s", Series: []Series{{Name: "flow 1", Y: a}, {Name: "flow 2", Y: b, Dashed: true}}},
		{Title: "queue", YLabel: "KB", Series: []Series{{Name: "depth", Y: q}}, Lines: []HLine{{Y: 40, Label: "Kmax"}}},
	}
	return p
}

func TestEncodeWellFormed(t *testing.T) {
	var buf bytes.Buffer
	if err := synthetic().Encode(&buf); err != nil {
		t.Fatal(err)
	}
	els := decode(t, buf.Bytes())
	if els[0].name != "svg" || els[0].attrs["width"] != "960" {
		t.Fatalf("root %v", els[0])
	}
	var polylines, panels, scripts int
	var texts []string
	for _, e := range els {
		switch e.name {
		case "polyline":
			polylines++
		case "g":
			panels++
		case "script", "image", "style", "foreignObject":
			scripts++
		case "text":
			texts = append(texts, e.text)
		}
		for k, v := range e.attrs {
			if strings.Contains(v, "url(") || k == "href" {
				t.Errorf("external reference %s=%q in <%s>", k, v, e.name)
			}
		}
	}
	if polylines != 3 || panels != 2 || scripts != 0 {
		t.Errorf("%d polylines, %d panels, %d script/style/image elements; want 3, 2, 0", polylines, panels, scripts)
	}
	all := strings.Join(texts, "|")
	for _, want := range []string{"test <run> & co", "time (s)", "Gb/s", "KB", "flow 1", "flow 2", "depth", "Kmax", "rate", "queue"} {
		if !strings.Contains(all, want) {
			t.Errorf("text %q missing from %q", want, all)
		}
	}
}

func TestEncodeScales(t *testing.T) {
	p := synthetic()
	geo, w, h, err := p.Layout()
	if err != nil {
		t.Fatal(err)
	}
	// rate: data 0..10 rounds to a 0..10 axis; queue: the line at 40 is
	// the top, with ticks of 10.
	if geo[0].YMin != 0 || geo[0].YMax != 10 || geo[1].YMin != 0 || geo[1].YMax != 40 {
		t.Errorf("y ranges [%v %v] [%v %v], want [0 10] [0 40]", geo[0].YMin, geo[0].YMax, geo[1].YMin, geo[1].YMax)
	}
	if geo[0].Left != marginLeft || geo[0].Width != float64(w-marginLeft-marginRight) || geo[0].Height != defaultHeight {
		t.Errorf("panel 0 geometry %+v", geo[0])
	}
	if geo[1].Top != geo[0].Top+geo[0].Height+panelGap || h != int(geo[1].Top+geo[1].Height)+marginBottom {
		t.Errorf("stacking: %+v %+v, height %d", geo[0], geo[1], h)
	}
	var buf bytes.Buffer
	if err := p.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	lines := map[string][][2]float64{}
	var refs []element
	for _, e := range decode(t, buf.Bytes()) {
		if e.name == "polyline" {
			lines[e.attrs["data-series"]] = points(t, e.attrs["points"])
		}
		if e.name == "line" && e.attrs["class"] == "ref" {
			refs = append(refs, e)
		}
	}
	g := geo[0]
	f1 := lines["flow 1"]
	if len(f1) != 11 {
		t.Fatalf("flow 1 has %d points, want 11", len(f1))
	}
	// flow 1 runs corner to corner: (0,0) at the bottom left, (10,10) at
	// the top right; the middle point is the centre.
	for i, want := range map[int][2]float64{0: {g.Left, g.Top + g.Height}, 10: {g.Left + g.Width, g.Top}, 5: {g.Left + g.Width/2, g.Top + g.Height/2}} {
		if math.Abs(f1[i][0]-want[0]) > 0.01 || math.Abs(f1[i][1]-want[1]) > 0.01 {
			t.Errorf("flow 1 point %d at %v, want %v", i, f1[i], want)
		}
	}
	f2 := lines["flow 2"]
	if len(f2) != 10 {
		t.Errorf("flow 2 has %d points, want 10 (the NaN is left out)", len(f2))
	}
	for _, pt := range f2 {
		if math.Abs(pt[1]-(g.Top+g.Height/2)) > 0.01 {
			t.Errorf("flow 2 point %v is not at half height %v", pt, g.Top+g.Height/2)
		}
	}
	// The queue peaks at 30 of 40: a quarter of the panel below its top.
	q := lines["depth"]
	g1 := geo[1]
	if math.Abs(q[5][1]-(g1.Top+g1.Height/4)) > 0.01 {
		t.Errorf("queue peak at y %v, want %v", q[5][1], g1.Top+g1.Height/4)
	}
	if len(refs) != 1 || refs[0].attrs["y1"] != coord(g1.Top) || refs[0].attrs["data-label"] != "Kmax" {
		t.Errorf("reference lines %v, want Kmax at the top of panel 2 (y %v)", refs, g1.Top)
	}
}

func TestEncodeDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if err := synthetic().Encode(&a); err != nil {
		t.Fatal(err)
	}
	if err := synthetic().Encode(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("the same plot encoded to different bytes")
	}
}

func TestEncodeFixedRangeClamps(t *testing.T) {
	p := &Plot{X: []float64{0, 1, 2}, Panels: []Panel{{YMin: 0, YMax: 1, Series: []Series{{Y: []float64{-5, 0.5, 7}}}}}}
	geo, _, _, err := p.Layout()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := p.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	for _, e := range decode(t, buf.Bytes()) {
		if e.name != "polyline" {
			continue
		}
		pts := points(t, e.attrs["points"])
		g := geo[0]
		if pts[0][1] != g.Top+g.Height || pts[2][1] != g.Top || math.Abs(pts[1][1]-(g.Top+g.Height/2)) > 0.01 {
			t.Errorf("points %v: want clamped to [%v, %v]", pts, g.Top, g.Top+g.Height)
		}
	}
}

func TestLayoutErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Plot
	}{
		{"no x", Plot{Panels: []Panel{{}}}},
		{"no panels", Plot{X: []float64{0, 1}}},
		{"x not increasing", Plot{X: []float64{0, 2, 1}, Panels: []Panel{{}}}},
		{"x NaN", Plot{X: []float64{0, math.NaN()}, Panels: []Panel{{}}}},
		{"narrow", Plot{X: []float64{0, 1}, Panels: []Panel{{}}, Width: 100}},
		{"infinite range", Plot{X: []float64{0, 1}, Panels: []Panel{{YMin: 0, YMax: math.Inf(1)}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.p.Encode(io.Discard); err == nil {
				t.Error("Encode succeeded")
			}
		})
	}
}

func TestEdgeCasesStayWellFormed(t *testing.T) {
	many := make([]Series, 40)
	for i := range many {
		many[i] = Series{Name: "s" + strconv.Itoa(i), Y: []float64{float64(i)}}
	}
	for _, tc := range []struct {
		name string
		p    Plot
	}{
		{"one point", Plot{X: []float64{3}, Panels: []Panel{{Series: []Series{{Name: "a", Y: []float64{1}}}}}}},
		{"all NaN", Plot{X: []float64{0, 1}, Panels: []Panel{{Series: []Series{{Name: "a", Y: []float64{math.NaN(), math.NaN()}}}}}}},
		{"short Y", Plot{X: []float64{0, 1, 2}, Panels: []Panel{{Series: []Series{{Name: "a", Y: []float64{1}}}}}}},
		{"negative", Plot{X: []float64{0, 1}, Panels: []Panel{{Series: []Series{{Y: []float64{-3, 2}}}}}}},
		{"tiny", Plot{X: []float64{0, 1e-6}, Panels: []Panel{{Series: []Series{{Y: []float64{1e-9, 2e-9}}}}}}},
		{"huge", Plot{X: []float64{0, 1}, Panels: []Panel{{Series: []Series{{Y: []float64{0, 4e10}}}}}}},
		{"control chars", Plot{Title: "a\x01b\"'", X: []float64{0, 1}, Panels: []Panel{{Title: "\x00", Series: []Series{{Name: "<&>", Y: []float64{0, 1}}}}}}},
		{"many series", Plot{X: []float64{0}, Panels: []Panel{{Series: many}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := tc.p.Encode(&buf); err != nil {
				t.Fatal(err)
			}
			var n int
			for _, e := range decode(t, buf.Bytes()) {
				if e.name == "polyline" {
					n++
				}
			}
			want := 0
			for _, pn := range tc.p.Panels {
				want += len(pn.Series)
			}
			if n != want {
				t.Errorf("%d polylines, want %d", n, want)
			}
		})
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		n      int
		want   string
	}{
		{0, 10, 5, "0 2 4 6 8 10"},
		{0, 1, 4, "0 0.5 1"},
		{0, 1, 10, "0 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 1"},
		{0, 0.001, 2, "0 0.0005 0.001"},
		{0, 40000, 4, "0 10k 20k 30k 40k"},
		{0, 2.5e9, 5, "0 0.5G 1G 1.5G 2G 2.5G"},
		{-1, 1, 4, "-1 -0.5 0 0.5 1"},
	} {
		vals, got := ticks(tc.lo, tc.hi, tc.n)
		if len(vals) != len(got) {
			t.Errorf("%d values, %d labels", len(vals), len(got))
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("ticks(%v, %v, %d) = %q, want %q", tc.lo, tc.hi, tc.n, g, tc.want)
		}
	}
}
