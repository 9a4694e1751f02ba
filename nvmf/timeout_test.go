package nvmf

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// loseResponses installs a hook that loses the completions of the
// commands (on any queue) for which lose says so.
func loseResponses(t *testing.T, lose func(q *hqueue, sqe nvme.SQE) bool) {
	setHooks(t, &hostHooks{response: func(q *hqueue, c *nvme.CQEFields) bool {
		idx := int(c.CID & (1<<cidIdxBits - 1))
		if idx >= len(q.slots) {
			return false
		}
		q.mu.Lock()
		sqe := nvme.SQE(append([]byte(nil), q.slots[idx].cmd[:nvme.SQESize]...))
		q.mu.Unlock()
		return lose(q, sqe)
	}})
}

// pending counts q's commands that wait for their completion.
func pending(q *hqueue) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for i := range q.slots {
		if q.slots[i].busy && q.slots[i].resp == nil {
			n++
		}
	}
	return n
}

func isDead(q *hqueue) bool {
	select {
	case <-q.dead:
		return true
	default:
		return false
	}
}

// TestTimeoutPerQueue: each queue's commands are held to their own
// queue's timeout — AdminTimeout on the admin queue (Linux's
// admin_timeout, 60 s), IOTimeout on the I/O queues (io_timeout, 30 s).
// The host applied IOTimeout to the admin queue too: an admin command
// unanswered for 45 s ended the association. The watchdog's check runs
// here with a clock moved forward (expire's now), not in real time.
func TestTimeoutPerQueue(t *testing.T) {
	connect := func(t *testing.T, cfg HostConfig) (*Controller, *association, context.Context) {
		p := newPair(t, memnet.Faults{}, TargetConfig{})
		ctx := ctxT(t, 30*time.Second)
		cfg.IOQueues, cfg.QueueSize, cfg.ReconnectDelay, cfg.Log = 1, 8, 20*time.Millisecond, t.Logf
		h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		h.mu.Lock()
		a := h.cur
		h.mu.Unlock()
		return h, a, ctx
	}
	t.Run("admin queue: AdminTimeout", func(t *testing.T) {
		h, a, ctx := connect(t, HostConfig{}) // the defaults: admin 60 s, I/O 30 s
		if h.cfg.AdminTimeout != 60*time.Second || h.cfg.IOTimeout != 30*time.Second {
			t.Fatalf("defaults: admin %v, I/O %v", h.cfg.AdminTimeout, h.cfg.IOTimeout)
		}
		loseResponses(t, func(q *hqueue, s nvme.SQE) bool { return q.qid == 0 && s.Opcode() == nvme.AdminGetLogPage })
		errc := make(chan error, 1)
		go func() { errc <- h.logPage(ctx, nvme.LogError, make([]byte, 64)) }()
		waitFor(t, func() bool { return pending(a.admin) == 1 }, "Get Log Page sent")
		a.expire(time.Now().Add(45 * time.Second)) // past IOTimeout, not AdminTimeout
		if isDead(a.admin) || h.Stats().Reconnects != 0 {
			t.Fatal("an admin command 45 s unanswered ended the association (IOTimeout applied to the admin queue)")
		}
		a.expire(time.Now().Add(61 * time.Second))
		err := <-errc
		t.Logf("Get Log Page: %v", err)
		if !errors.Is(err, ErrAdminTimeout) || !errors.Is(err, ErrDisconnected) || errors.Is(err, ErrIOTimeout) {
			t.Errorf("Get Log Page unanswered for 61 s: %v, want ErrAdminTimeout", err)
		}
		waitFor(t, func() bool { return h.Stats().Reconnects == 1 }, "reconnect")
	})
	t.Run("I/O queue: IOTimeout", func(t *testing.T) {
		h, a, ctx := connect(t, HostConfig{AdminTimeout: 10 * time.Second, IOTimeout: 30 * time.Second})
		ns, err := h.Namespace(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		var armed atomic.Bool
		armed.Store(true)
		loseResponses(t, func(q *hqueue, s nvme.SQE) bool { return q.qid != 0 && s.Opcode() == nvme.IORead && armed.Load() })
		errc := make(chan error, 1)
		go func() {
			_, err := ns.ReadAtContext(ctx, make([]byte, 512), 0)
			errc <- err
		}()
		waitFor(t, func() bool { return pending(a.io[0]) == 1 }, "read sent")
		a.expire(time.Now().Add(20 * time.Second)) // past AdminTimeout, not IOTimeout
		if isDead(a.io[0]) || h.Stats().Reconnects != 0 {
			t.Fatal("a read 20 s unanswered ended the association (AdminTimeout applied to the I/O queue)")
		}
		armed.Store(false) // the read sent again is answered
		a.expire(time.Now().Add(31 * time.Second))
		if !isDead(a.io[0]) || a.io[0].err == nil || !errors.Is(a.io[0].err, ErrIOTimeout) {
			t.Fatalf("a read 31 s unanswered: queue dead %v (%v), want ErrIOTimeout", isDead(a.io[0]), a.io[0].err)
		}
		if err := <-errc; err != nil {
			t.Errorf("the read, sent again after the reconnect: %v", err)
		}
		if st := h.Stats(); st.Reconnects != 1 || st.Requeued != 1 {
			t.Errorf("host %+v", st)
		}
	})
}

// TestKeepAliveTimeout: a Keep Alive is held to KATO, not AdminTimeout
// (Linux sets the keep-alive request's timeout to KATO): with an admin
// timeout shorter than KATO, a keep-alive whose answer is lost ends the
// association when KATO has passed, as a failed keep-alive, not as an
// admin command timeout.
func TestKeepAliveTimeout(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	var lost atomic.Int32
	loseResponses(t, func(q *hqueue, s nvme.SQE) bool {
		return q.qid == 0 && s.Opcode() == nvme.AdminKeepAlive && lost.Add(1) == 1
	})
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8, KATO: time.Second,
		AdminTimeout: 50 * time.Millisecond, ReconnectDelay: 20 * time.Millisecond, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.mu.Lock()
	a := h.cur
	h.mu.Unlock()
	waitFor(t, func() bool { return isDead(a.admin) }, "the association lost")
	t.Logf("admin queue: %v", a.admin.err)
	if errors.Is(a.admin.err, ErrAdminTimeout) {
		t.Errorf("the keep-alive was held to AdminTimeout: %v", a.admin.err)
	}
	waitFor(t, func() bool { return h.Stats().Reconnects == 1 }, "reconnect")
}

// TestTimeoutsLive: the same with short timeouts in real time, the
// connect commands included. An admin command whose answer is lost with
// IOTimeout off waited for ever (the host had no admin timeout); with
// AdminTimeout it ends the association, which reconnects. The admin
// Connect is held to AdminTimeout, an I/O queue's Connect to IOTimeout
// (they were bounded by ConnectTimeout alone).
func TestTimeoutsLive(t *testing.T) {
	const short = 300 * time.Millisecond
	t.Run("admin command", func(t *testing.T) {
		p := newPair(t, memnet.Faults{}, TargetConfig{})
		ctx := ctxT(t, 30*time.Second)
		h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8, AdminTimeout: short, IOTimeout: -1,
			ReconnectDelay: 20 * time.Millisecond, Log: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		var lost atomic.Int32
		loseResponses(t, func(q *hqueue, s nvme.SQE) bool {
			return q.qid == 0 && s.Opcode() == nvme.AdminIdentify && nvme.IdentifyOf(s).CNS == nvme.CNSActiveNSList && lost.Add(1) == 1
		})
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = h.ActiveNamespaces(c)
		cancel()
		t.Logf("ActiveNamespaces, its answer lost: %v", err)
		if !errors.Is(err, ErrAdminTimeout) || !errors.Is(err, ErrDisconnected) {
			t.Fatalf("ActiveNamespaces with its answer lost: %v, want ErrAdminTimeout", err)
		}
		waitFor(t, func() bool { return h.Stats().Reconnects == 1 }, "reconnect")
		ids, err := h.ActiveNamespaces(ctx)
		if err != nil || len(ids) != 1 || h.Stats().Reconnects != 1 {
			t.Errorf("after: %v %v, %d reconnects", ids, err, h.Stats().Reconnects)
		}
	})
	for _, tc := range []struct {
		name        string
		qid         uint16
		admin, io   time.Duration
		want, other error
	}{
		{"admin Connect", 0, short, -1, ErrAdminTimeout, ErrIOTimeout},
		{"I/O queue Connect", 1, -1, short, ErrIOTimeout, ErrAdminTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, memnet.Faults{}, TargetConfig{})
			ctx := ctxT(t, 30*time.Second)
			loseResponses(t, func(q *hqueue, s nvme.SQE) bool {
				return q.qid == tc.qid && s.Opcode() == nvme.OpcodeFabrics && s.FCType() == nvme.FCConnect
			})
			h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8, AdminTimeout: tc.admin,
				IOTimeout: tc.io, ConnectTimeout: 5 * time.Second, Log: t.Logf})
			if err == nil {
				h.Close()
				t.Fatal("connected")
			}
			t.Logf("Connect: %v", err)
			if !errors.Is(err, tc.want) || errors.Is(err, tc.other) {
				t.Errorf("Connect with the queue %d Connect's answer lost: %v, want %v", tc.qid, err, tc.want)
			}
		})
	}
}
