package transport

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// lossRates collects the MiB/s of each loss-matrix case run in this
// process, by name and mode, for the side-by-side report.
var lossRates = struct {
	sync.Mutex
	m map[string]float64
}{m: map[string]float64{}}

func lossRate(t testing.TB, c lossCase, sr bool, mibs float64) {
	mode := "gbn"
	if sr {
		mode = "sr"
	}
	lossRates.Lock()
	lossRates.m[mode+"/"+c.name] = mibs
	lossRates.Unlock()
}

// TestLossMatrixSR is TestLossMatrix with selective repeat on both QPs:
// the same cases and seeds, every byte and completion checked, the
// atomics exactly once, no deadlock (the time bound).
func TestLossMatrixSR(t *testing.T) {
	total := lossBytes()
	for i, c := range lossCases {
		t.Run(c.name, func(t *testing.T) {
			c.f.Seed = int64(1000 + i)
			runLossCaseMode(t, c, true, total, 60*time.Second, 14)
		})
	}
}

// TestSRCompare is the side-by-side benchmark: every loss-matrix case run
// with go-back-N and then with selective repeat, with the same seed, each
// byte-checked, and a table of MiB/s and the ratios to the clean case.
// It runs only with ROCEV2_SR_COMPARE=1 (ROCEV2_LOSS_MIB sets the size,
// default 64 MiB per case); with ROCEV2_SR_GOALS=1 it also checks the
// goals (selective repeat at >= 0.9 of clean at 0.1 % loss, >= 0.8 at
// 1 %, >= 0.5 at 5 %), which need an unloaded machine.
func TestSRCompare(t *testing.T) {
	if os.Getenv("ROCEV2_SR_COMPARE") == "" {
		t.Skip("ROCEV2_SR_COMPARE=1 runs the go-back-N / selective repeat comparison")
	}
	total := int64(64 << 20)
	if s := os.Getenv("ROCEV2_LOSS_MIB"); s != "" {
		total = lossBytes()
	}
	for i, c := range lossCases {
		c.f.Seed = int64(3000 + i)
		for _, sr := range []bool{false, true} {
			name := "gbn/" + c.name
			if sr {
				name = "sr/" + c.name
			}
			t.Run(name, func(t *testing.T) {
				runLossCaseMode(t, c, sr, total, 10*time.Minute, 14)
			})
		}
	}
	lossRates.Lock()
	defer lossRates.Unlock()
	m := lossRates.m
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-16s %10s %10s %8s %8s %8s\n", "case", "GBN MiB/s", "SR MiB/s", "GBN/cl", "SR/cl", "SR/GBN")
	gc, sc := m["gbn/clean"], m["sr/clean"]
	for _, c := range lossCases {
		g, s := m["gbn/"+c.name], m["sr/"+c.name]
		fmt.Fprintf(&b, "%-16s %10.0f %10.0f %8.2f %8.2f %8.2f\n", c.name, g, s, g/gc, s/sc, s/g)
	}
	t.Log(b.String())
	if os.Getenv("ROCEV2_SR_GOALS") != "" {
		for _, g := range []struct {
			name string
			min  float64
		}{{"loss0.1%", 0.9}, {"loss1%", 0.8}, {"loss5%", 0.5}} {
			if r := m["sr/"+g.name] / sc; r < g.min {
				t.Errorf("selective repeat at %s: %.2f of clean, goal %.2f", g.name, r, g.min)
			}
		}
	}
}
