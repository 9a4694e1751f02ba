//go:build unix

package perftest

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// TestLatUnsortedHistogram: -U prints the latencies as measured, -H the
// sorted ones without perftest's two-value tail, each under "#, usec" as
// "N, %g"; then the column header again and the row, as perftest's
// print_report_lat.
func TestLatUnsortedHistogram(t *testing.T) {
	t0 := time.Unix(0, 0)
	var ts []time.Time
	for _, us := range []int{0, 2, 6, 8, 18, 20, 25} {
		ts = append(ts, t0.Add(time.Duration(us)*time.Microsecond))
	}
	var b bytes.Buffer
	printLat(&b, 64, 6, ts, 2, true, true, "")
	var row bytes.Buffer
	writeLatLine(&row, 64, 6, []float64{1, 2, 1, 5, 1, 2.5})
	want := "#, usec\n1, 1\n2, 2\n3, 1\n4, 5\n5, 1\n6, 2.5\n" +
		"#, usec\n1, 1\n2, 1\n3, 1\n4, 2\n" +
		perfLine + latColumns + "\n" + row.String() + perfLine
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	printLat(&b, 64, 6, ts, 2, false, false, "")
	if b.String() != row.String()+perfLine {
		t.Errorf("without -U/-H:\n%s", b.String())
	}
	if got := cG(1.0 / 3); got != "0.333333" {
		t.Errorf("cG(1/3) = %q, want C's %%g 0.333333", got)
	}
	if got := cG(1234567); got != "1.23457e+06" {
		t.Errorf("cG(1234567) = %q, want C's %%g 1.23457e+06", got)
	}
}

// TestPerfLatHistogramRun: write-lat -H on both sides prints the sorted
// latencies before its row.
func TestPerfLatHistogramRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	srv, cli := runPerfPair(t, "write-lat", "-H", "-n", "50", "-s", "64")
	mustPass(t, srv, cli)
	for who, out := range map[string]string{"client": cli.out, "server": srv.out} {
		_, list, ok := strings.Cut(out, "#, usec\n")
		n := 0
		for _, l := range strings.Split(list, "\n") {
			if !strings.Contains(l, ", ") {
				break
			}
			n++
		}
		if !ok || n < 40 || strings.Count(out, latColumns) != 2 || len(resultRows(out)) != 1 {
			t.Errorf("%s: %d histogram lines, want the iterations' latencies, then the header again and one row:\n%s", who, n, out)
		}
	}
}

// TestLatListFlagsBWRefused: -U and -H are refused in the bandwidth
// tests, naming the flag, as perftest 4.5 refuses them there
// ("Available only on Latency tests"); they used to be taken and ignored.
func TestLatListFlagsBWRefused(t *testing.T) {
	for _, test := range []oob.PerfTest{oob.WriteBW, oob.SendBW, oob.ReadBW, oob.AtomicBW} {
		for _, f := range []string{"-U", "--report-unsorted", "-H", "--report-histogram"} {
			_, err := parsePerfFlags(test, []string{f})
			if err == nil || !strings.Contains(err.Error(), f) || !strings.Contains(err.Error(), "latency tests") {
				t.Errorf("%v %s: %v, want an error naming %s (latency tests only)", test, f, err, f)
			}
		}
	}
	for _, f := range []string{"-U", "-H"} {
		if _, err := parsePerfFlags(oob.WriteLat, []string{f}); err != nil {
			t.Errorf("write-lat %s: %v", f, err)
		}
	}
}
