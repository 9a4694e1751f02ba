package main

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBench runs a short bench and checks the table: ten rows (WRITE,
// READ, SEND goodput at three sizes and the ping-pong), every value and
// ratio positive and consistent with its columns.
func TestBench(t *testing.T) {
	if testing.Short() {
		t.Skip("runs loopback traffic for about a second")
	}
	start := time.Now()
	code, out, errOut := runInRetry(t, "bench", "-t", "60ms", "-v")
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("bench -t 60ms took %v", el)
	}
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || (f[1] != "goodput" && f[1] != "ping-pong") {
			continue
		}
		rows++
		var raw, roc, ratio float64
		var err error
		if f[1] == "goodput" {
			// WRITE goodput 64 B 10.1 MB/s 3.3 MB/s 0.326 pkts pkts
			raw, _ = strconv.ParseFloat(f[4], 64)
			roc, _ = strconv.ParseFloat(f[6], 64)
			ratio, err = strconv.ParseFloat(f[8], 64)
		} else {
			// SEND ping-pong RTT 8 B 17.7 µs 52.0 µs 2.93
			raw, _ = strconv.ParseFloat(f[5], 64)
			roc, _ = strconv.ParseFloat(f[7], 64)
			ratio, err = strconv.ParseFloat(f[9], 64)
		}
		if err != nil || raw <= 0 || roc <= 0 || ratio <= 0 {
			t.Errorf("bad row %q", line)
			continue
		}
		if d := roc/raw - ratio; d > 0.01*ratio+0.01 || d < -(0.01*ratio+0.01) {
			t.Errorf("row %q: ratio %v, columns give %v", line, ratio, roc/raw)
		}
	}
	if rows != 10 {
		t.Errorf("%d rows, want 10:\n%s", rows, out)
	}
	if !strings.Contains(out, "counters A 127.0.0.1") {
		t.Errorf("-v printed no counters")
	}
}

func TestBenchFlags(t *testing.T) {
	for _, b := range []struct {
		args []string
		msg  string
	}{
		{[]string{"bench", "-t", "1ms"}, "-t 1ms"},
		{[]string{"bench", "-m", "100"}, "-m 100"},
		{[]string{"bench", "--a", "127.0.0.1", "--b", "::1"}, "--a and --b"},
		{[]string{"bench", "x"}, `unexpected argument "x"`},
	} {
		code, _, errOut := runIn(t, b.args...)
		if code != exitUsage || !strings.Contains(errOut, b.msg) {
			t.Errorf("%v: exit %d %q", b.args, code, errOut)
		}
	}
}
