package scale

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cpudist"
)

func TestPrintRoundCores(t *testing.T) {
	w := func(min, max int) cpudist.Watch {
		return cpudist.Watch{N: 3, Min: time.Duration(min), Max: time.Duration(max)}
	}
	for _, tc := range []struct {
		name string
		row  scaleResult
		want string // "" = nothing printed
	}{
		{name: "not sampled", row: scaleResult{roundRatios: []float64{0.9, 1.1}}},
		{name: "close all along", row: scaleResult{roundRatios: []float64{0.9, 1.1},
			roundCores: []cpudist.Watch{w(51, 83), w(55, 97)}}},
		{name: "one round apart", row: scaleResult{roundRatios: []float64{0.93, 0.61, 0.88},
			roundCores: []cpudist.Watch{w(51, 83), w(60, 310), w(52, 70)}},
			want: "  CPU distance 51-310 ns: 1 of 3 rounds ran with the CPUs apart (a sample at twice the fastest or more), ratios 0.61; lowest with them close 0.88\n"},
		{name: "every round apart", row: scaleResult{roundRatios: []float64{0.5, 0.7},
			roundCores: []cpudist.Watch{w(60, 300), w(290, 310)}},
			want: "  CPU distance 60-310 ns: 2 of 2 rounds ran with the CPUs apart (a sample at twice the fastest or more), ratios 0.50 0.70\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printRoundCores(&b, tc.row)
			if got := b.String(); got != tc.want {
				t.Errorf("printed %q, want %q", got, tc.want)
			}
			// The line never parses as a table row (the tests and
			// scripts that read the table skip it).
			if f := strings.Fields(b.String()); len(f) > 0 && (f[0] != "CPU") {
				t.Errorf("note starts with %q", f[0])
			}
		})
	}
}
