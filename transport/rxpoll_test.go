//go:build linux

package transport

import (
	"context"
	"testing"
	"time"
)

// TestBusyPollDrivesLink: on links that busy-poll, the goroutines polling
// their CQs (SEND) or their memory and Device.Progress (WRITE) receive and
// handle the packets themselves (rx.polls counts their batches), every
// message arrives, and once they stop polling the receive goroutine takes
// the link back (a message waited for with Wait after the lease lapsed
// completes). Without busy polling no caller drives the link.
func TestBusyPollDrivesLink(t *testing.T) {
	for _, tc := range []struct {
		op   string
		spin bool
	}{
		{"SEND", true}, {"WRITE", true}, {"SEND", false}, {"WRITE", false},
	} {
		name := tc.op + "/blocking"
		if tc.spin {
			name = tc.op + "/busypoll"
		}
		t.Run(name, func(t *testing.T) {
			s := newStackPingPong(t, tc.op, tc.spin)
			defer s.stop()
			if err := s.round(200); err != nil {
				t.Fatal(err)
			}
			pa, pr := s.a.dev.rx.polls.Load(), s.r.dev.rx.polls.Load()
			if tc.spin && (pa == 0 || pr == 0) {
				t.Fatalf("batches handled by pollers: A %d, B %d; want both > 0", pa, pr)
			}
			if !tc.spin && (pa != 0 || pr != 0 || s.a.dev.Progress() != 0) {
				t.Fatalf("batches handled by pollers without busy polling: A %d, B %d", pa, pr)
			}
			// Nobody polls now: after the leases lapse the receive
			// goroutines take the links back.
			time.Sleep(4 * rxLeaseMin)
			if err := s.r.qp.PostSend(SendWR{Opcode: WRSend, SGEs: s.rsge}); err != nil {
				t.Fatal(err)
			}
			wc := make([]WC, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			before := s.a.dev.rx.polls.Load()
			if _, err := s.a.rcq.Wait(ctx, wc); err != nil || wc[0].Status != WCSuccess || wc[0].ByteLen != 8 {
				t.Fatalf("SEND after the pollers stopped: %v %+v", err, wc[0])
			}
			if err := s.a.qp.PostRecv(RecvWR{SGEs: s.arecv}); err != nil {
				t.Fatal(err)
			}
			// And polling picks up again.
			if err := s.round(20); err != nil {
				t.Fatal(err)
			}
			if tc.spin && s.a.dev.rx.polls.Load() == before {
				t.Fatal("no batch handled by a poller after the receive goroutine had the link")
			}
		})
	}
}

// TestProgressMemLink: Progress on a link that cannot be polled (the
// in-memory network) does nothing; the receive goroutine does the work.
func TestProgressMemLink(t *testing.T) {
	a, r, _ := newPair(t, pairOpts{})
	_, amr := a.buffer(t, 64, 0)
	_, rmr := r.buffer(t, 64, 0)
	if err := r.qp.PostRecv(RecvWR{SGEs: sge(rmr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(SendWR{Opcode: WRSend, Flags: SendSignaled, SGEs: sge(amr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	if n := r.dev.Progress(); n != 0 {
		t.Fatalf("Progress on a MemLink device = %d", n)
	}
	waitWC(t, r.rcq, 1, 10*time.Second)
	waitWC(t, a.scq, 1, 10*time.Second)
	if r.dev.rx.polls.Load() != 0 {
		t.Fatal("a poller handled a batch of a MemLink")
	}
}
