package transport

import (
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
