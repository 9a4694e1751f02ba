//go:build linux

package transport

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
)

// TestACKNotHeldByBusyApp: a responder whose application takes a SEND's
// completion and then does not call into the device for a long while (a
// slow backend: an NVMe-oF target's file I/O) must still acknowledge the
// SEND at once, as an RNIC does in hardware: the ACK the batch queued
// must not wait for the application's next PostSend, Poll or Wait. The
// application here blocks until the requester's send completion has
// arrived (a channel, no durations), so a held ACK would show as the
// requester's ACK timer (exponent 14, 67 ms) resending the SEND — counted
// in its retransmission counters, which must stay 0 — or as the test
// hanging until the requester's safety timeout. Each mode takes the
// completion its own way: CQ.Wait driving the link (also right after a
// long wait put the receive goroutine in quiet mode, rx.deep), a
// CQ.Poll loop on a busy-polling link and on a plain one (Progress
// drives the link after spinAfter polls), and a completion channel.
func TestACKNotHeldByBusyApp(t *testing.T) {
	for _, mode := range []string{"wait", "wait-deep", "poll-busypoll", "poll-loop", "channel"} {
		t.Run(mode, func(t *testing.T) {
			o := &udp.SocketOptions{GSOAuto: true}
			if mode == "poll-busypoll" {
				o.BusyPoll = latSpin
			}
			a, r := newLatSocketPair(t, o)
			_, amr := a.buffer(t, 64, 0)
			_, rmr := r.buffer(t, 64, 0)
			rcq := r.rcq
			var ch *CompChannel
			rqp := r.qp
			aqp, ascq := a.qp, a.scq
			if mode == "channel" {
				var err error
				if ch, err = r.dev.CreateCompChannel(1); err != nil {
					t.Fatal(err)
				}
				if rcq, err = r.dev.CreateCQWith(CQAttr{Depth: 64, Channel: ch}); err != nil {
					t.Fatal(err)
				}
				if rqp, err = r.dev.CreateQP(r.pd, QPInitAttr{Type: QPTypeRC, SendCQ: rcq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16, MaxSGE: 1}); err != nil {
					t.Fatal(err)
				}
				if aqp, err = a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: ascq, RecvCQ: a.rcq, MaxSendWR: 16, MaxRecvWR: 16, MaxSGE: 1}); err != nil {
					t.Fatal(err)
				}
				po := pairOpts{mtu: MTU4096, retry: 7, rnrRetry: 7, minRNR: 12}
				po.defaults()
				connect(t, &side{qp: aqp}, &side{qp: rqp}, latAddrB, 0x30, 0x40, &po)
				connect(t, &side{qp: rqp}, &side{qp: aqp}, latAddrA, 0x40, 0x30, &po)
			}
			const rounds = 10
			st := r.dev.rx.stats
			waited0, polls0 := st.waited.Load(), st.polls.Load()
			for range rounds {
				if err := rqp.PostRecv(RecvWR{SGEs: sge(rmr, 8, 8)}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i := range rounds {
				got := make(chan error, 1)
				release := make(chan struct{})
				app := make(chan struct{})
				entered := make(chan struct{})
				go func() {
					defer close(app)
					wc := make([]WC, 1)
					close(entered)
					var err error
					switch mode {
					case "wait", "wait-deep":
						_, err = rcq.Wait(ctx, wc)
					case "poll-busypoll", "poll-loop":
						for rcq.Poll(wc) == 0 && ctx.Err() == nil {
							runtime.Gosched()
						}
						err = ctx.Err()
					case "channel":
						for rcq.Poll(wc) == 0 && err == nil {
							if err = rcq.ReqNotify(false); err != nil {
								break
							}
							if rcq.Poll(wc) != 0 {
								break
							}
							select {
							case <-ch.C():
							case <-ctx.Done():
								err = ctx.Err()
							}
						}
					}
					if err == nil && wc[0].Status != WCSuccess {
						err = wc[0].Err()
					}
					got <- err
					// The slow backend: the device is not touched
					// until the requester has its completion.
					<-release
				}()
				<-entered
				if mode == "wait-deep" {
					// Let the waiter hold the link until the receive
					// goroutine sleeps without its timer.
					for !r.dev.rx.deep.Load() && ctx.Err() == nil {
						time.Sleep(100 * time.Microsecond)
					}
				}
				if err := aqp.PostSend(SendWR{Opcode: WRSend, Flags: SendSignaled, SGEs: sge(amr, 0, 8)}); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatalf("round %d: the responder's receive: %v", i, err)
				}
				wc := make([]WC, 1)
				_, err := ascq.Wait(ctx, wc)
				close(release)
				<-app
				if err != nil || wc[0].Status != WCSuccess {
					t.Fatalf("round %d: the requester's send completion (the responder's application still busy): %v %+v", i, err, wc[0])
				}
				if c := a.dev.Counters(); c.LocalAckTimeout != 0 || c.RetransmittedPkts != 0 {
					t.Fatalf("round %d: the requester timed out waiting for the ACK while the responder's application was busy: local_ack_timeout_err %d, retransmitted_pkts %d",
						i, c.LocalAckTimeout, c.RetransmittedPkts)
				}
			}
			// The modes took the path they are for: the application's
			// own goroutine handled the SEND's batch, leaving its ACK
			// queued, in some rounds at least.
			switch mode {
			case "wait", "wait-deep":
				if st.waited.Load() == waited0 {
					t.Errorf("no batch was handled by the waiter")
				}
			case "poll-busypoll", "poll-loop":
				if st.polls.Load() == polls0 {
					t.Errorf("no batch was handled by the poller")
				}
			}
		})
	}
}
