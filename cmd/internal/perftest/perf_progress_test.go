//go:build unix

package perftest

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Progress lines on stderr (perf_bw.go: bwClient; perf_lat.go: perfProgress.tick).
var (
	perfBWProgress  = regexp.MustCompile(`^ \.\.\. (\d+) bytes x (\d+) iterations in (\d+\.\d)s, (\d+\.\d\d) MB/sec$`)
	perfLatProgress = regexp.MustCompile(`^ \.\.\. (\d+) bytes: (\d+) of (\d+) iterations in (\d+\.\d)s$`)
)

// progressLines returns the submatches of every line of s that re matches,
// and fails the test on any other line that starts like a progress line.
func progressLines(t *testing.T, side, s string, re *regexp.Regexp) [][]string {
	t.Helper()
	var out [][]string
	for _, line := range strings.Split(s, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			out = append(out, m)
		} else if strings.HasPrefix(line, " ... ") {
			t.Errorf("%s: malformed progress line %q", side, line)
		}
	}
	return out
}

// TestPerfProgressBWDuration runs write-bw for 3 s with the shipped
// interval: the client prints a progress line once two seconds have
// passed, with a count and rate that agree, and none earlier.
func TestPerfProgressBWDuration(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets for 3 s")
	}
	if perfProgressEvery != 2*time.Second {
		t.Fatalf("progress interval %v, documented as 2s", perfProgressEvery)
	}
	srv, cli := runPerfPair(t, "write-bw", "-D", "3", "-s", "1024")
	mustPass(t, srv, cli)
	lines := progressLines(t, "client", cli.errOut, perfBWProgress)
	if len(lines) < 1 || len(lines) > 2 { // at 2 s, and at 4 s if draining was slow
		t.Fatalf("%d progress lines in a 3 s run, want 1 or 2; stderr:\n%s", len(lines), cli.errOut)
	}
	total, _ := strconv.Atoi(resultRows(cli.out)[0][1])
	prev := 0
	for i, m := range lines {
		n, _ := strconv.Atoi(m[2])
		el, _ := strconv.ParseFloat(m[3], 64)
		mbs, _ := strconv.ParseFloat(m[4], 64)
		if m[1] != "1024" || n <= prev || n > total {
			t.Errorf("line %q: want 1024 bytes and %d < iterations <= %d", m[0], prev, total)
		}
		if min := 2.0 * float64(i+1); el < min || el > min+1.5 {
			t.Errorf("line %q: at %.1fs, want %.0fs (+1.5s slack)", m[0], el, min)
		}
		// The rate is the count over the elapsed time (MiB/s), up to the
		// rounding of the printed elapsed time.
		lo, hi := float64(n)*1024/(el+0.05)/(1<<20), float64(n)*1024/(el-0.05)/(1<<20)
		if mbs < lo-0.005 || mbs > hi+0.005 {
			t.Errorf("line %q: %.2f MB/sec, want %.3f..%.3f", m[0], mbs, lo, hi)
		}
		prev = n
	}
	if s := progressLines(t, "server", srv.errOut, perfBWProgress); len(s) != 0 {
		t.Errorf("passive server printed progress: %q", s)
	}
}

// TestPerfProgressShortInterval shortens the interval so that every
// progress check prints, and checks every test that reports progress: the
// bandwidth client, and both sides of the latency tests that run a loop
// (read-lat and atomic-lat have a passive server).
func TestPerfProgressShortInterval(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	saved := perfProgressEvery
	perfProgressEvery = time.Nanosecond
	t.Cleanup(func() { perfProgressEvery = saved })

	const iters = 640
	for _, tt := range []struct {
		test       string
		size       string
		srvReports bool
	}{
		{"read-lat", "64", false},
		{"atomic-lat", "8", false},
		{"write-lat", "32", true},
		{"send-lat", "100", true},
	} {
		t.Run(tt.test, func(t *testing.T) {
			srv, cli := runPerfPair(t, tt.test, "-n", strconv.Itoa(iters), "-s", tt.size)
			mustPass(t, srv, cli)
			if rows := resultRows(cli.out); len(rows) != 1 || rows[0][1] != strconv.Itoa(iters) {
				t.Errorf("client result rows %v", rows)
			}
			for _, side := range []struct {
				name    string
				o       perfOut
				reports bool
			}{{"client", cli, true}, {"server", srv, tt.srvReports}} {
				lines := progressLines(t, side.name, side.o.errOut, perfLatProgress)
				if !side.reports {
					if len(lines) != 0 {
						t.Errorf("passive %s printed progress: %q", side.name, side.o.errOut)
					}
					continue
				}
				// A check every 64 iterations, each one printing: at least
				// the ones past the first round trip.
				if len(lines) < iters/64-1 || len(lines) > iters/64 {
					t.Fatalf("%s: %d progress lines, want %d or %d; stderr:\n%s", side.name, len(lines), iters/64-1, iters/64, side.o.errOut)
				}
				prevN, prevEl := -1, 0.0
				for _, m := range lines {
					n, _ := strconv.Atoi(m[2])
					el, _ := strconv.ParseFloat(m[4], 64)
					if m[1] != tt.size || m[3] != strconv.Itoa(iters) || n%64 != 0 || n <= prevN || n >= iters || el < prevEl {
						t.Errorf("%s: line %q after %d iterations at %.1fs", side.name, m[0], prevN, prevEl)
					}
					prevN, prevEl = n, el
				}
			}
		})
	}

	t.Run("write-bw", func(t *testing.T) {
		srv, cli := runPerfPair(t, "write-bw", "-n", "400", "-s", "256")
		mustPass(t, srv, cli)
		lines := progressLines(t, "client", cli.errOut, perfBWProgress)
		if len(lines) == 0 {
			t.Fatalf("no progress lines; stderr:\n%s", cli.errOut)
		}
		prev := 0
		for _, m := range lines {
			n, _ := strconv.Atoi(m[2])
			if m[1] != "256" || n <= prev || n > 400 {
				t.Errorf("line %q after %d iterations", m[0], prev)
			}
			prev = n
		}
		if prev != 400 {
			t.Errorf("last progress line at %d iterations, want the last completion (400)", prev)
		}
	})
}
