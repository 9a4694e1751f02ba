package nvmf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestHostLogOnlyLosses: the host logs a queue going down when it is
// lost (the target deleted the controller), never when its own Close
// tore it down: every Close of `rocev2d nvmf-host` used to print "host
// queue N down: … Work Request Flushed Error" or "rdmacm: closed".
func TestHostLogOnlyLosses(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose bool
	}{
		{"clean close", false},
		{"controller deleted", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var logs []string
			logf := func(f string, a ...any) {
				mu.Lock()
				logs = append(logs, fmt.Sprintf(f, a...))
				mu.Unlock()
			}
			p := newPair(t, memnet.Faults{}, TargetConfig{})
			ctx := ctxT(t, 30*time.Second)
			h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 4, QueueSize: 8,
				ReconnectDelay: 50 * time.Millisecond, Log: logf})
			if err != nil {
				t.Fatal(err)
			}
			ns, err := h.Namespace(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ns.WriteAtContext(ctx, make([]byte, 4096), 0); err != nil {
				t.Fatal(err)
			}
			if tc.lose {
				p.t.mu.Lock()
				var c *tctrl
				for _, x := range p.t.ctrls {
					c = x
				}
				p.t.mu.Unlock()
				c.delete()
				waitFor(t, func() bool { return h.Stats().Reconnects == 1 }, "host reconnected")
			}
			mu.Lock()
			before := len(logs)
			mu.Unlock()
			h.Close()
			mu.Lock()
			defer mu.Unlock()
			down := 0
			for _, l := range logs[:before] {
				if strings.Contains(l, "host queue") && strings.Contains(l, "down") {
					down++
				}
			}
			if tc.lose && down == 0 {
				t.Errorf("the controller's loss logged no queue going down: %q", logs)
			}
			for _, l := range logs[before:] {
				t.Errorf("logged at Close: %s", l)
			}
		})
	}
}
