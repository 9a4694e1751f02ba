package congestion

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"

	"github.com/gorocev2/rocev2/transport"
)

// congestionRun runs rocev2d congestion with args plus --csv and --svg in
// a temporary directory and returns its exit status, output and files.
func congestionRun(t *testing.T, args ...string) (code int, out, errOut string, csvRows [][]string, svg []byte) {
	t.Helper()
	dir := t.TempDir()
	cp, sp := filepath.Join(dir, "run.csv"), filepath.Join(dir, "run.svg")
	var o, e bytes.Buffer
	code = runCongestion(context.Background(), append([]string{"--csv", cp, "--svg", sp}, args...), &o, &e)
	if code == cli.ExitUsage {
		return code, o.String(), e.String(), nil, nil
	}
	f, err := os.Open(cp)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if csvRows, err = csv.NewReader(f).ReadAll(); err != nil {
		t.Fatalf("CSV: %v", err)
	}
	if svg, err = os.ReadFile(sp); err != nil {
		t.Fatal(err)
	}
	return code, o.String(), e.String(), csvRows, svg
}

// column returns a CSV column's values as numbers (NaN for empty).
func column(t *testing.T, rows [][]string, name string) []float64 {
	t.Helper()
	c := -1
	for i, h := range rows[0] {
		if h == name {
			c = i
		}
	}
	if c < 0 {
		t.Fatalf("no column %q in %v", name, rows[0])
	}
	var out []float64
	for _, r := range rows[1:] {
		if r[c] == "" {
			out = append(out, -1)
			continue
		}
		v, err := strconv.ParseFloat(r[c], 64)
		if err != nil {
			t.Fatalf("%s = %q", name, r[c])
		}
		out = append(out, v)
	}
	return out
}

func sum(v []float64) (s float64) {
	for _, x := range v {
		s += x
	}
	return s
}

// TestCongestionCommand runs 2 flows for 10 ms of virtual time with
// DCQCN on (the default scenario otherwise): both files are written, the CSV has a row per sample interval
// and the summary's fields, the SVG decodes with one line per series, the
// bottleneck marked, the receiver sent CNPs, the senders handled them and
// cut their rates, nothing was dropped, and the second flow got traffic
// through once started.
func TestCongestionCommand(t *testing.T) {
	code, out, errOut, rows, svg := congestionRun(t, "-n", "2", "--duration", "10ms", "--interval", "250us",
		"--stagger", "3ms", "--depth", "16", "-v")
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if len(rows) != 41 || len(rows[0]) != 2*2+8 {
		t.Fatalf("CSV %d rows of %d columns, want 41 (header + 40 samples) of 12", len(rows), len(rows[0]))
	}
	if marks, cnps, handled := sum(column(t, rows, "ce_marked")), sum(column(t, rows, "cnp_sent")), sum(column(t, rows, "cnp_handled")); marks == 0 || cnps == 0 || handled == 0 || handled > cnps {
		t.Errorf("CE marks %v, CNPs sent %v, handled %v: want all > 0, handled <= sent", marks, cnps, handled)
	}
	if d := sum(column(t, rows, "dropped")); d != 0 {
		t.Errorf("%v drops with DCQCN on and a 512 KiB buffer", d)
	}
	cut := false
	for _, r := range column(t, rows, "flow1_rate_gbps") {
		cut = cut || (r >= 0 && r < 25)
	}
	if !cut {
		t.Error("flow 1's DCQCN rate never dropped below the 25 Gb/s line rate")
	}
	f2 := column(t, rows, "flow2_goodput_gbps")
	if f2[0] != 0 || sum(f2[len(f2)/2:]) == 0 {
		t.Errorf("flow 2 goodput %v: want 0 before its start at 3 ms, > 0 later", f2)
	}
	for _, w := range []string{"summary: last half: aggregate goodput ", "Jain fairness ", "drops 0,", "mean queue ", "rp_cnp_handled", "np_cnp_sent", "np_ecn_marked_roce_packets"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	d := xml.NewDecoder(bytes.NewReader(svg))
	polylines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 2*2+1+1+4 {
		t.Errorf("%d polylines, want 10 (goodput and rate per flow, aggregate, queue, 4 event series)", polylines)
	}
}

// TestCongestionDCQCNOff: with --dcqcn=off the senders ignore the CNPs
// the receiver still sends, so their rates stay at line rate, and with a
// small buffer the bottleneck drops.
func TestCongestionDCQCNOff(t *testing.T) {
	code, out, errOut, rows, _ := congestionRun(t, "-n", "2", "--duration", "5ms", "--interval", "250us",
		"--stagger", "1ms", "--depth", "16", "--buffer", "64KB", "--kmin", "8KB", "--kmax", "32KB", "--line-rate", "10G", "--dcqcn=off")
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if h := sum(column(t, rows, "cnp_handled")); h != 0 {
		t.Errorf("%v CNPs handled with DCQCN off", h)
	}
	if s := sum(column(t, rows, "cnp_sent")); s == 0 {
		t.Error("the receiver sent no CNPs")
	}
	if d := sum(column(t, rows, "dropped")); d == 0 {
		t.Error("no drops without DCQCN into a 64 KB buffer")
	}
	for _, f := range []string{"flow1_rate_gbps", "flow2_rate_gbps"} {
		for _, r := range column(t, rows, f) {
			if r >= 0 && r != 10 {
				t.Fatalf("%s %v with DCQCN off, want the 10 Gb/s line rate", f, r)
			}
		}
	}
}

// TestCongestionFlowFails: flows whose retries run out (an 8 µs ACK
// timeout behind a deep queue without DCQCN) stop, the run goes on, the
// files are written, and the command names the flows and exits 1.
func TestCongestionFlowFails(t *testing.T) {
	code, out, errOut, rows, svg := congestionRun(t, "-n", "2", "--dcqcn=off", "--buffer", "64KB", "--kmin", "8KB", "--kmax", "32KB",
		"--timeout", "1", "--duration", "5ms", "--stagger", "1ms")
	if code != cli.ExitFail || !strings.Contains(out, "failed: flow 1 at ") || !strings.Contains(out, "retry counter exceeded") ||
		!strings.Contains(out, "2 flows FAILED") {
		t.Fatalf("exit %d, want %d naming the failed flows\n%s%s", code, cli.ExitFail, out, errOut)
	}
	if len(rows) != 6 || len(svg) == 0 {
		t.Errorf("%d CSV rows, %d SVG bytes: want the 5 samples and a plot", len(rows), len(svg))
	}
}

// TestCongestionReproducible: the same flags give the same bytes.
func TestCongestionReproducible(t *testing.T) {
	args := []string{"-n", "2", "--duration", "4ms", "--stagger", "1ms", "--interval", "200us", "--seed", "7"}
	_, _, _, a, sa := congestionRun(t, args...)
	_, _, _, b, sb := congestionRun(t, args...)
	if a == nil || b == nil {
		t.Fatal("a run failed")
	}
	var ca, cb bytes.Buffer
	csv.NewWriter(&ca).WriteAll(a)
	csv.NewWriter(&cb).WriteAll(b)
	if !bytes.Equal(ca.Bytes(), cb.Bytes()) || !bytes.Equal(sa, sb) {
		t.Error("two runs with the same flags differ")
	}
}

func TestCongestionFlags(t *testing.T) {
	c, err := parseCongestionFlags([]string{"-n", "8", "--rate", "25G", "--buffer", "2MiB", "--kmin", "5KB", "--kmax", "200k",
		"--pmax", "0.01", "--ecn", "ect1", "--cnp-interval", "4us", "--dcqcn-param", "rpg_ai_rate=20,rpg_time_reset=100"})
	if err != nil {
		t.Fatal(err)
	}
	cc := c.cc.Config()
	if c.flows != 8 || c.rate != 25e9 || c.lineRate != 25e9 || c.buffer != 2<<20 || c.kmin != 5000 || c.kmax != 200000 || c.pmax != 0.01 ||
		cc.ECN != transport.ECNECT1 || cc.CNPInterval != 4*time.Microsecond || cc.DCQCN.LineRate != 25e9 ||
		cc.DCQCN.AIRate != 20e6 || cc.DCQCN.TimeReset != 100*time.Microsecond || cc.DCQCN.Disable {
		t.Errorf("parsed %+v, congestion %+v", c, cc)
	}
	for _, bad := range [][]string{
		{"-n", "0"}, {"-n", "65"}, {"--kmin", "300KB", "--kmax", "200KB"}, {"--pmax", "2"}, {"--rate", "fast"},
		{"--buffer", "0"}, {"--duration", "0s"}, {"--interval", "1s", "--duration", "10ms"},
		{"--stagger", "50ms", "--duration", "100ms"}, {"--mtu", "1500"}, {"--depth", "0"}, {"--timeout", "0"},
		{"--ecn", "ce"}, {"--dcqcn", "maybe"}, {"--dcqcn-param", "rpg_gd=5"}, {"extra"},
	} {
		if _, err := parseCongestionFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	var o, e bytes.Buffer
	if code := runCongestion(context.Background(), []string{"--csv", filepath.Join(t.TempDir(), "no", "such", "dir.csv")}, &o, &e); code != cli.ExitUsage ||
		!strings.HasPrefix(e.String(), "rocev2d congestion: --csv: open ") {
		t.Errorf("unwritable --csv: exit %d, want %d; stderr %q (naming --csv)", code, cli.ExitUsage, e.String())
	}
	e.Reset()
	if code := runCongestion(context.Background(), []string{"--svg", t.TempDir()}, &o, &e); code != cli.ExitUsage || !strings.HasPrefix(e.String(), "rocev2d congestion: --svg: open ") {
		t.Errorf("--svg a directory: exit %d, stderr %q (naming --svg)", code, e.String())
	}
	// A negative stagger is no start after --duration.
	if _, err := parseCongestionFlags([]string{"--stagger", "-1ms"}); err == nil || err.Error() != "--stagger -1ms: want 0 (all at once) or more" {
		t.Errorf("--stagger -1ms: %v", err)
	}
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int{"40000": 40000, "40KB": 40000, "40k": 40000, "1MiB": 1 << 20, "1.5MB": 1500000, "64KiB": 65536, "10B": 10} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "1GB", "1e20", "NaN", "-NaN", "Inf"} {
		if _, err := parseByteSize(bad); err == nil {
			t.Errorf("parseByteSize(%q) accepted", bad)
		}
	}
}

// FuzzSizes: the rate and size parsers never panic and return what they
// accept in range.
func FuzzSizes(f *testing.F) {
	for _, s := range []string{"10G", "2.5Gb/s", "500M", "1e9", "40KB", "1MiB", "-1", "NaN", "Inf", "1e400", "k", "", "0.0001", "0.1ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if r, err := cli.ParseBitRate(s, 1e6); err == nil && !(r > 0 && r <= 1e15) {
			t.Fatalf("parseBitRate(%q) = %v", s, r)
		}
		if n, err := parseByteSize(s); err == nil && (n < 0 || n > 1<<34) {
			t.Fatalf("parseByteSize(%q) = %v", s, n)
		}
		if d, err := cli.ParseMicros(s); err == nil && d <= 0 {
			t.Fatalf("parseMicros(%q) = %v", s, d)
		}
	})
}
