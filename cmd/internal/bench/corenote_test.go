package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cpudist"
)

func TestPrintCoreNote(t *testing.T) {
	row := func(name string, size int, w cpudist.Watch) benchRow {
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
		{name: "no samples", rows: []benchRow{row("WRITE goodput", 64, cpudist.Watch{})}, wantNone: true},
		{
			name: "close all along",
			rows: []benchRow{
				row("WRITE goodput", 64, cpudist.Watch{N: 6, Min: ns(51), Max: ns(83)}),
				row("READ goodput", 65536, cpudist.Watch{N: 6, Min: ns(55), Max: ns(97)}),
			},
			want:    []string{"in 51-97 ns"},
			wantNot: []string{"compare with care"},
		},
		{
			name: "one row apart",
			rows: []benchRow{
				row("WRITE goodput", 64, cpudist.Watch{N: 6, Min: ns(51), Max: ns(83)}),
				row("READ goodput", 65536, cpudist.Watch{N: 6, Min: ns(60), Max: ns(310)}),
				row("SEND ping-pong RTT", 8, cpudist.Watch{N: 6, Min: ns(52), Max: ns(101)}),
			},
			want:    []string{"in 51-310 ns", "compare with care", "READ goodput 64 KiB (310 ns)"},
			wantNot: []string{"WRITE goodput 64 B (", "SEND ping-pong RTT 8 B ("},
		},
		{
			name: "unsampled rows are not named",
			rows: []benchRow{
				row("WRITE goodput", 64, cpudist.Watch{}),
				row("READ goodput", 64, cpudist.Watch{N: 3, Min: ns(300), Max: ns(320)}),
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
