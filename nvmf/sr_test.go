package nvmf

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// queuesSR reports, per queue of the host's association, whether it runs
// selective repeat.
func queuesSR(h *Controller) []bool {
	h.mu.Lock()
	a := h.cur
	h.mu.Unlock()
	out := []bool{a.admin.conn.SelectiveRepeat()}
	for _, q := range a.io {
		out = append(out, q.conn.SelectiveRepeat())
	}
	return out
}

// HostConfig.SelectiveRepeat makes every queue run selective repeat with a
// rocev2 target (which accepts by default), and I/O under 5 % loss moves
// every byte; without it, or with TargetConfig.NoSelectiveRepeat, the
// queues run go-back-N as before.
func TestHostSelectiveRepeat(t *testing.T) {
	for _, tc := range []struct {
		name         string
		host, refuse bool
		want         bool
	}{
		{"default", false, false, false},
		{"offered", true, false, true},
		{"refused", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, memnet.Faults{Loss: 0.05, Seed: 7}, TargetConfig{NoSelectiveRepeat: tc.refuse})
			ctx := ctxT(t, 120*time.Second)
			var h *Controller
			var err error
			var mu sync.Mutex
			var logged []string
			logf := func(f string, a ...any) {
				mu.Lock()
				logged = append(logged, fmt.Sprintf(f, a...))
				mu.Unlock()
			}
			for try := 0; try < 5; try++ { // a lost CM exchange can time a step out
				if h, err = Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, SelectiveRepeat: tc.host,
					ConnectTimeout: 10 * time.Second, Log: logf}); err == nil {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			mu.Lock()
			declined := strings.Contains(strings.Join(logged, "\n"), "declined selective repeat")
			mu.Unlock()
			if declined != (tc.host && !tc.want) {
				t.Errorf("logged %q; want a line about the declined offer: %v", logged, tc.host && !tc.want)
			}
			for i, sr := range queuesSR(h) {
				if sr != tc.want {
					t.Errorf("queue %d: selective repeat %v, want %v", i, sr, tc.want)
				}
			}
			if got := h.SelectiveRepeat(); got != tc.want {
				t.Errorf("Controller.SelectiveRepeat() = %v, want %v", got, tc.want)
			}
			if !tc.want {
				return
			}
			ns, err := h.Namespace(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 4; i++ {
				w := make([]byte, 1<<20)
				for k := range w {
					w[k] = byte(rng.Uint32())
				}
				off := int64(i) * (1 << 20)
				if _, err := ns.WriteAtContext(ctx, w, off); err != nil {
					t.Fatal(err)
				}
				r := make([]byte, len(w))
				if _, err := ns.ReadAtContext(ctx, r, off); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(r, w) {
					t.Fatalf("1 MiB at %d read back different", off)
				}
			}
		})
	}
}
