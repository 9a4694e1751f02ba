package nvmf

import (
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestHostKATOBelowUnit: a host KATO shorter than the millisecond KATO
// is counted in is refused by Connect, naming the field. It went out as
// a KATO of 0 (the target kept no keep-alive timer), while the host sent
// a keep-alive every KATO/2 — and a KATO of 1 ns made that
// time.NewTicker(0), a panic in the supervisor's goroutine that killed
// the program once the controller had connected.
func TestHostKATOBelowUnit(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	for _, d := range []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond - 1} {
		ctx := ctxT(t, 10*time.Second)
		h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{KATO: d})
		if err == nil {
			// Give the supervisor its first tick.
			time.Sleep(10 * time.Millisecond)
			h.Close()
			t.Errorf("KATO %v accepted", d)
			continue
		}
		if !strings.Contains(err.Error(), "HostConfig.KATO") {
			t.Errorf("KATO %v: %v (not naming the field)", d, err)
		}
	}
	if c := p.t.Stats().Connections; c != 0 {
		t.Errorf("the target saw %d connections: the KATO was not refused before connecting", c)
	}
}
