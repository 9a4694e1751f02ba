package nvmf

import (
	"bytes"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestHostRemoteInvalidate: a host with RemoteInvalidate gives each data
// command a key of its own and asks for its invalidation. A target that
// honours it answers every such command with SEND with Invalidate of
// exactly that key (the host counts them, the target too, and both counts
// agree); one that does not (testNoInvalidate) leaves the host to
// invalidate each key itself. Either way, after the commands no window is
// still bound, the data regions grant no remote access of their own, and
// every byte written reads back — also under 1 % loss, where SENDs with
// Invalidate are retransmitted and acknowledged twice.
func TestHostRemoteInvalidate(t *testing.T) {
	tests := []struct {
		name    string
		faults  memnet.Faults
		noInval bool
	}{
		{"honoured", memnet.Faults{}, false},
		{"ignored", memnet.Faults{}, true},
		{"honoured-loss1pct", memnet.Faults{Loss: 0.01, Seed: 11}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPair(t, tt.faults, TargetConfig{testNoInvalidate: tt.noInval})
			ctx := ctxT(t, 90*time.Second)
			h, ns := connectNS(t, ctx, p.hdev, p.targetAddr, &HostConfig{IOQueues: 2, QueueSize: 16, RemoteInvalidate: true})
			defer h.Close()
			var wg sync.WaitGroup
			for g := 0; g < 6; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewSource(int64(g)))
					for i, size := range []int{4096, 8192, 64 << 10, 1 << 20, 4096, 300 << 10} {
						off := int64(g)<<20 + int64(i%2)*(512<<10)
						if size > 512<<10 {
							off = int64(g) << 20
						}
						w := make([]byte, size)
						rng.Read(w)
						if _, err := ns.WriteAtContext(ctx, w, off); err != nil {
							t.Errorf("goroutine %d write %d: %v", g, size, err)
							return
						}
						r := make([]byte, size)
						if _, err := ns.ReadAtContext(ctx, r, off); err != nil || !bytes.Equal(r, w) {
							t.Errorf("goroutine %d read %d at %d: %v (equal %v)", g, size, off, err, bytes.Equal(r, w))
							return
						}
					}
				}()
			}
			wg.Wait()
			if tt.faults.Loss > 0 && p.net.Counters().Lost == 0 {
				t.Error("the network lost nothing")
			}
			hs, ts := h.Stats(), p.t.Stats()
			t.Logf("host %+v; target invalidates %d", hs, ts.Invalidates)
			// Data commands with a key: 6 reads and 4 keyed writes (8 KiB
			// and up; 4 KiB ones travel in the capsule) per goroutine.
			if tt.noInval {
				if hs.RemoteInvalidations != 0 || ts.Invalidates != 0 || hs.LocalInvalidations < 6*10 {
					t.Errorf("ignored: remote %d (target %d), local %d; want 0, 0, >= %d", hs.RemoteInvalidations, ts.Invalidates, hs.LocalInvalidations, 6*10)
				}
			} else {
				if hs.LocalInvalidations != 0 || hs.RemoteInvalidations < 6*10 || hs.RemoteInvalidations != ts.Invalidates {
					t.Errorf("honoured: remote %d, target %d, local %d", hs.RemoteInvalidations, ts.Invalidates, hs.LocalInvalidations)
				}
			}
			a, err := h.assoc(ctx)
			if err != nil {
				t.Fatal(err)
			}
			windows := 0
			for _, q := range append([]*hqueue{a.admin}, a.io...) {
				q.mu.Lock()
				for i := range q.slots {
					s := &q.slots[i]
					if s.busy {
						continue
					}
					if s.mw != nil {
						windows++
						if s.mw.Bound() {
							t.Errorf("queue %d slot %d: window %#x still bound after its command", q.qid, i, s.mw.RKey())
						}
					}
					if s.dataMR != nil && s.dataMR.Access()&(memreg.AccessRemoteRead|memreg.AccessRemoteWrite) != 0 {
						t.Errorf("queue %d slot %d: the data region grants %v itself", q.qid, i, s.dataMR.Access())
					}
				}
				q.mu.Unlock()
			}
			if windows == 0 {
				t.Error("no command used a window")
			}
		})
	}
}

// TestKeepAliveTrafficBased: the target's keep-alive timer is nvmet's
// traffic-based one — a firing that finds a command since the last one
// re-arms it; only a firing after a silent period deletes the controller
// (the timer is driven by hand here: KATO is an hour).
func TestKeepAliveTrafficBased(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8, KATO: time.Hour, CtrlLossTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p.t.mu.Lock()
	var c *tctrl
	for _, x := range p.t.ctrls {
		c = x
	}
	p.t.mu.Unlock()
	if c == nil {
		t.Fatal("no controller on the target")
	}
	fire := func() {
		c.mu.Lock()
		gen := c.kaGen
		c.mu.Unlock()
		c.kaFire(gen)
	}
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	fire() // the connect's commands count
	if _, err := ns.ReadAtContext(ctx, make([]byte, 512), 0); err != nil {
		t.Fatal(err)
	}
	fire() // so does the read
	if s := p.t.Stats(); s.KATOExpired != 0 || s.LiveCtrls != 1 {
		t.Fatalf("expired with commands between the firings: %+v", s)
	}
	// A stale timer (an earlier generation) does nothing.
	c.mu.Lock()
	stale := c.kaGen - 1
	c.mu.Unlock()
	c.kaFire(stale)
	fire() // silence since the last firing
	waitFor(t, func() bool { s := p.t.Stats(); return s.KATOExpired == 1 && s.LiveCtrls == 0 }, "expiry after a silent period")
}
