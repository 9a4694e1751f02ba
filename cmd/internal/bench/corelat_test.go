package bench

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestPrintCoreNote(t *testing.T) {
	row := func(name string, size int, w coreWatch) benchRow {
		return benchRow{name: name, size: size, core: w}
	}
	ns := func(n int) time.Duration { return time.Duration(n) }
	for _, tc := range []struct {
		name     string
		rows     []benchRow
		want     []string
		wantNot  []string
		wantNone bool
	}{
		{name: "no samples", rows: []benchRow{row("WRITE goodput", 64, coreWatch{})}, wantNone: true},
		{
			name: "close all along",
			rows: []benchRow{
				row("WRITE goodput", 64, coreWatch{n: 6, min: ns(51), max: ns(83)}),
				row("READ goodput", 65536, coreWatch{n: 6, min: ns(55), max: ns(97)}),
			},
			want:    []string{"in 51-97 ns"},
			wantNot: []string{"compare with care"},
		},
		{
			name: "one row apart",
			rows: []benchRow{
				row("WRITE goodput", 64, coreWatch{n: 6, min: ns(51), max: ns(83)}),
				row("READ goodput", 65536, coreWatch{n: 6, min: ns(60), max: ns(310)}),
				row("SEND ping-pong RTT", 8, coreWatch{n: 6, min: ns(52), max: ns(101)}),
			},
			want:    []string{"in 51-310 ns", "compare with care", "READ goodput 64 KiB (310 ns)"},
			wantNot: []string{"WRITE goodput 64 B (", "SEND ping-pong RTT 8 B ("},
		},
		{
			name: "unsampled rows are not named",
			rows: []benchRow{
				row("WRITE goodput", 64, coreWatch{}),
				row("READ goodput", 64, coreWatch{n: 3, min: ns(300), max: ns(320)}),
			},
			want:    []string{"in 300-320 ns"},
			wantNot: []string{"compare with care"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printCoreNote(&b, tc.rows)
			out := b.String()
			if tc.wantNone {
				if out != "" {
					t.Fatalf("printed %q, want nothing", out)
				}
				return
			}
			for _, s := range tc.want {
				if !strings.Contains(out, s) {
					t.Errorf("missing %q in:\n%s", s, out)
				}
			}
			for _, s := range tc.wantNot {
				if strings.Contains(out, s) {
					t.Errorf("unexpected %q in:\n%s", s, out)
				}
			}
		})
	}
}

func TestCoreWatch(t *testing.T) {
	var w coreWatch
	if runtime.GOOS != "linux" || runtime.GOMAXPROCS(0) < 2 || runtime.NumCPU() < 2 {
		w.sample()
		if w.n != 0 {
			t.Fatalf("sampled %d times without two CPUs to pin", w.n)
		}
		t.Skipf("coreRTT needs Linux and two CPUs (GOOS %s, GOMAXPROCS %d, NumCPU %d)", runtime.GOOS, runtime.GOMAXPROCS(0), runtime.NumCPU())
	}
	for range 3 {
		w.sample()
	}
	if w.n != 3 {
		t.Fatalf("%d samples of 3", w.n)
	}
	if w.min <= 0 || w.max < w.min || w.max > 100*time.Microsecond {
		t.Fatalf("cache-line round trip %v-%v: not a plausible measurement", w.min, w.max)
	}
}
