//go:build unix

package bench

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/transport"
)

// TestBench runs a short bench and checks the tables: two sections
// (sendmmsg and GSO+GRO) of eleven rows each (WRITE, READ, SEND goodput
// at three sizes and the SEND and WRITE ping-pongs), every value and ratio positive and
// consistent with its columns, goodput and CPU alike. With --gso=false
// only the sendmmsg section runs, with --gso=true only the GSO one.
func TestBench(t *testing.T) {
	if testing.Short() {
		t.Skip("runs loopback traffic for a few seconds")
	}
	for _, c := range []struct {
		args     []string
		rows     int
		sections []string
	}{
		{nil, 22, []string{"sendmmsg/recvmmsg:", "GSO+GRO:"}},
		{[]string{"--gso=false"}, 11, []string{"sendmmsg/recvmmsg:"}},
		{[]string{"--gso=false", "--busy-poll=50us"}, 11, []string{"sendmmsg/recvmmsg:"}},
		// At path MTU 1024 a batch of the GSO baseline once held more
		// datagrams than its window, and the raw rows sent nothing.
		{[]string{"--gso=true", "-m", "1024"}, 11, []string{"GSO+GRO:"}},
	} {
		start := time.Now()
		code, out, errOut := runInRetry(t, append([]string{"bench", "-t", "60ms", "-v"}, c.args...)...)
		if code != cli.ExitOK {
			t.Fatalf("%v: exit %d\n%s%s", c.args, code, out, errOut)
		}
		if el := time.Since(start); el > 60*time.Second {
			t.Errorf("bench -t 60ms %v took %v", c.args, el)
		}
		if rows := checkBenchTable(t, out); rows != c.rows {
			t.Errorf("%v: %d rows, want %d:\n%s", c.args, rows, c.rows, out)
		}
		sections := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "sendmmsg/recvmmsg:") || strings.HasPrefix(l, "GSO+GRO:") {
				if sections >= len(c.sections) || !strings.HasPrefix(l, c.sections[sections]) {
					t.Errorf("%v: section %q, want %q", c.args, l, c.sections)
				}
				sections++
			}
		}
		if sections != len(c.sections) {
			t.Errorf("%v: %d sections, want %d:\n%s", c.args, sections, len(c.sections), out)
		}
		if !strings.Contains(out, "GSO default of the rocev2d commands on 127.0.0.1: on, lo (virtual") {
			t.Errorf("%v: no GSO default line for lo:\n%s", c.args, out)
		}
		// Each section's READ rows name their one-way ratio below the table.
		for _, size := range []string{"64 B", "4 KiB", "64 KiB"} {
			if n := strings.Count(out, "  READ "+size+": one-way raw UDP "); n != len(c.sections) {
				t.Errorf("%v: %d one-way lines for READ %s, want %d:\n%s", c.args, n, size, len(c.sections), out)
			}
		}
		if !strings.Contains(out, "counters A 127.0.0.1") {
			t.Errorf("%v: -v printed no counters", c.args)
		}
	}
}

// TestBenchRows: --rows runs only the rows it names (here READ 64 KiB and
// the two ping-pongs), each checked as TestBench checks every row.
func TestBenchRows(t *testing.T) {
	if testing.Short() {
		t.Skip("runs loopback traffic for a second")
	}
	code, out, errOut := runInRetry(t, "bench", "-t", "60ms", "--gso=true", "--rows", "read:64k,latency")
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if rows := checkBenchTable(t, out); rows != 3 {
		t.Errorf("%d rows, want 3:\n%s", rows, out)
	}
	for _, want := range []string{" READ goodput   64 KiB ", "SEND ping-pong RTT", "WRITE ping-pong RTT", "  READ 64 KiB: one-way raw UDP "} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	for _, not := range []string{"WRITE goodput", "SEND goodput", "READ goodput     64 B", "READ 4 KiB: one-way"} {
		if strings.Contains(out, not) {
			t.Errorf("%q ran, not asked for:\n%s", not, out)
		}
	}
}

// checkBenchTable checks every row of the bench output and returns how
// many there are.
func checkBenchTable(t *testing.T, out string) int {
	t.Helper()
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || (f[1] != "goodput" && f[1] != "ping-pong") {
			continue
		}
		rows++
		// WRITE goodput 64 B 10.1 MB/s 3.3 MB/s 0.326 53.3 ms/MB 53.4 ms/MB 1.00 pkts loss pkts
		// SEND ping-pong RTT 8 B 17.7 µs 52.0 µs 2.93 30.6 µs/rtt 69.1 µs/rtt 2.26
		i, unit, cpuUnit := 4, "MB/s", "ms/MB"
		if f[1] == "ping-pong" {
			i, unit, cpuUnit = 5, "µs", "µs/rtt"
		}
		if len(f) < i+10 || f[i+1] != unit || f[i+3] != unit || f[i+6] != cpuUnit || f[i+8] != cpuUnit {
			t.Errorf("bad row %q", line)
			continue
		}
		for _, cols := range [][3]string{{f[i], f[i+2], f[i+4]}, {f[i+5], f[i+7], f[i+9]}} {
			raw, roc, ratio, ok := parsePrinted(cols[0], cols[1], cols[2])
			if !ok || raw.v <= 0 || roc.v <= 0 || ratio.v <= 0 {
				t.Errorf("bad row %q", line)
				continue
			}
			// The table prints rounded values; the ratio is computed
			// from the unrounded columns. So it must be within its own
			// rounding of some quotient of values that round to the
			// printed columns.
			if lo, hi, ok := ratioConsistent(raw, roc, ratio); !ok {
				t.Errorf("row %q: ratio %s (±%g) is not roc/raw for any columns that print as %s and %s (%.6g .. %.6g)",
					line, ratio.s, ratio.half, roc.s, raw.s, lo, hi)
			}
		}
	}
	return rows
}

// printed is a number as the table printed it: its value and half a unit in
// its last printed digit (the most rounding can have moved it).
type printed struct {
	s       string
	v, half float64
}

func (p printed) lo() float64 { return p.v - p.half*(1+1e-9) }
func (p printed) hi() float64 { return p.v + p.half*(1+1e-9) }

// ratioConsistent reports whether a printed ratio can be roc/raw for some
// true columns that print as roc and raw: the interval of such quotients,
// [lo, hi], meets the values that print as ratio.
func ratioConsistent(raw, roc, ratio printed) (lo, hi float64, ok bool) {
	lo, hi = roc.lo()/raw.hi(), roc.hi()/raw.lo()
	return lo, hi, ratio.hi() >= lo && ratio.lo() <= hi
}

// parsePrinted parses decimal numbers with their printed precision.
func parsePrinted(ss ...string) (raw, roc, ratio printed, ok bool) {
	var ps [3]printed
	for i, s := range ss {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return raw, roc, ratio, false
		}
		decimals := 0
		if dot := strings.IndexByte(s, '.'); dot >= 0 {
			decimals = len(s) - dot - 1
		}
		ps[i] = printed{s: s, v: v, half: 0.5 * math.Pow10(-decimals)}
	}
	return ps[0], ps[1], ps[2], true
}

func TestParsePrintedInterval(t *testing.T) {
	// The flaky case of issue 8: ratio 1.503 printed beside columns whose
	// rounded quotient is 1.53125 — consistent once rounding is counted.
	raw, roc, ratio, ok := parsePrinted("3.2", "4.9", "1.503")
	if !ok || raw.half != 0.05 || ratio.half != 0.0005 {
		t.Fatalf("%+v %+v %+v %v", raw, roc, ratio, ok)
	}
	for _, c := range []struct {
		raw, roc, ratio string
		consistent      bool
	}{
		{"3.2", "4.9", "1.503", true},
		{"3.2", "4.9", "1.571", true},  // 4.95/3.15 = 1.5714
		{"3.2", "4.9", "1.573", false}, // beyond any rounding
		{"3.2", "4.9", "1.491", false}, // 4.85/3.25 = 1.4923
		{"100.0", "50.0", "0.500", true},
		{"100.0", "50.0", "0.502", false}, // 50.05/99.95 = 0.50075
		{"17.7", "52.0", "2.94", true},
		{"17.7", "52.0", "2.96", false},
	} {
		raw, roc, ratio, _ := parsePrinted(c.raw, c.roc, c.ratio)
		if _, _, got := ratioConsistent(raw, roc, ratio); got != c.consistent {
			t.Errorf("%s / %s vs %s: consistent %v, want %v", c.roc, c.raw, c.ratio, got, c.consistent)
		}
	}
}

func TestBenchFlags(t *testing.T) {
	for _, b := range []struct {
		args []string
		msg  string
	}{
		{[]string{"bench", "-t", "1ms"}, "-t 1ms"},
		{[]string{"bench", "-m", "100"}, "-m 100"},
		{[]string{"bench", "--a", "127.0.0.1", "--b", "::1"}, "--a 127.0.0.1 and --b ::1: the two endpoints talk to each other"},
		{[]string{"bench", "x"}, `unexpected argument "x"`},
	} {
		code, _, errOut := runIn(t, b.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, b.msg) {
			t.Errorf("%v: exit %d %q", b.args, code, errOut)
		}
	}
}

func TestParseRows(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[transport.WROpcode][3]bool // 64 B, 4 KiB, 64 KiB
		latency bool
		err     string
	}{
		{in: "write", want: map[transport.WROpcode][3]bool{transport.WRWrite: {true, true, true}}},
		{in: "read:64k,write:64k", want: map[transport.WROpcode][3]bool{transport.WRRead: {false, false, true}, transport.WRWrite: {false, false, true}}},
		{in: " SEND:64b , latency", want: map[transport.WROpcode][3]bool{transport.WRSend: {true, false, false}}, latency: true},
		{in: "send:4k,send:4096", want: map[transport.WROpcode][3]bool{transport.WRSend: {false, true, false}}},
		{in: "pingpong", latency: true},
		{in: "read:32k", err: `message size "32k"`},
		{in: "atomic", err: `"atomic": want write, read, send`},
		{in: "write,", err: `"": want write`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			c, err := parseBenchFlags([]string{"--rows", tc.in})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range benchOps {
				for i, size := range benchSizes {
					if got, want := c.goodputRow(op, size), tc.want[op][i]; got != want {
						t.Errorf("%v %d B: runs %v, want %v", op, size, got, want)
					}
				}
			}
			if c.latencyRows() != tc.latency {
				t.Errorf("latency rows %v, want %v", c.latencyRows(), tc.latency)
			}
		})
	}
	c, err := parseBenchFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.goodputRow(transport.WRRead, 64) || !c.latencyRows() {
		t.Error("without --rows every row must run")
	}
}
