package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/transport"
)

// errRunEnded ends a --run_infinitely data phase: the run was interrupted
// (SIGINT, SIGTERM, --timeout) or the peer went away. perftest prints
// nothing more then (it dies of the signal); rocev2d exits 0.
var errRunEnded = errors.New("--run_infinitely: run ended")

// infReport is perftest's --run_infinitely report of one period
// (print_report_bw in RUN_INFINITELY mode): the n messages completed in
// the period el, their bandwidth and message rate over it, and no peak
// (perftest sets noPeak for run_infinitely).
func infReport(size int, n uint64, el time.Duration, gbits bool) oob.Report {
	rep := oob.Report{Size: uint64(size), Iters: n}
	if el <= 0 {
		return rep
	}
	unit := float64(1 << 20)
	if gbits {
		unit = 125e6
	}
	usec := float64(el.Nanoseconds()) / 1e3
	rep.BWAvg = float64(size) * float64(n) / (usec / 1e6) / unit
	rep.MsgRate = float64(n) / usec
	return rep
}

// startInfReporter prints a report line to w every period, as perftest's
// print thread (handle_signal_print_thread): what count grew by since the
// last line, over the time since it. stop ends it.
func startInfReporter(period time.Duration, size int, c *perfConfig, count *atomic.Uint64, w io.Writer) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		last, lastT := count.Load(), time.Now()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				n := count.Load()
				c.bwRow(w, infReport(size, n-last, now.Sub(lastT), c.gbits))
				last, lastT = n, now
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}

// runEnded is the end of a --run_infinitely data phase whose ctx ended;
// the Traffic hook adds why when the out-of-band watch ended it.
func runEnded(context.Context) error { return errRunEnded }

// bwClientInfinite is --run_infinitely's active side (perftest's
// run_iter_bw_infinitely): keep tx-depth work requests outstanding on
// every QP until ctx ends, reporting every -D seconds.
func (s *perfSide) bwClientInfinite(ctx context.Context, size int, stdout io.Writer) error {
	c := s.c
	nq := len(s.qps)
	tx := s.txDepth()
	pl := max(c.postList, 1)
	scnt := make([]uint64, nq)
	ccnt := make([]uint64, nq)
	var done atomic.Uint64
	stop := startInfReporter(time.Duration(c.duration)*time.Second, size, c, &done, stdout)
	defer stop()
	wcs := make([]transport.WC, 64)
	wrs := make([]transport.SendWR, 0, tx)
	for {
		for i, q := range s.qps {
			wrs = wrs[:0]
			for int(scnt[i]-ccnt[i])+len(wrs)+pl <= tx {
				for range pl {
					wrs = append(wrs, s.signalWR(s.sendWRQP(i, size, scnt[i]+uint64(len(wrs))), math.MaxInt))
				}
			}
			for rest := wrs; len(rest) > 0; {
				list := rest
				if pl > 1 {
					list = rest[:pl] // -l: one call per list
				}
				rest = rest[len(list):]
				if err := q.qp.PostSend(list...); err != nil {
					return fmt.Errorf("couldn't post send on QP %d after %d: %w", i, scnt[i], err)
				}
				scnt[i] += uint64(len(list))
			}
		}
		n, err := s.SCQ.Wait(ctx, wcs)
		if err != nil {
			if ctx.Err() != nil {
				return runEnded(ctx)
			}
			return fmt.Errorf("waiting for completions: %w", err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return cli.WCError(wc, "send")
			}
			i := int(wc.WRID >> perfWRIDShift)
			if i >= nq {
				return fmt.Errorf("send completion with wr_id %#x names no QP of %d", wc.WRID, nq)
			}
			end := wc.WRID&(1<<perfWRIDShift-1) + 1 // -Q: it ends the WRs before it
			if end <= ccnt[i] || end > scnt[i] {
				return fmt.Errorf("send completion for WR %d on QP %d, where %d of %d completed", end-1, i, ccnt[i], scnt[i])
			}
			done.Add(end - ccnt[i])
			ccnt[i] = end
		}
	}
}

// sendBWServerInfinite is --run_infinitely's send-bw server (perftest's
// run_iter_bw_infinitely_server): receive and repost until ctx ends,
// reporting the receives every -D seconds.
func (s *perfSide) sendBWServerInfinite(ctx context.Context, size int, stdout io.Writer) error {
	c := s.c
	nq := len(s.qps)
	var done atomic.Uint64
	stop := startInfReporter(time.Duration(c.duration)*time.Second, size, c, &done, stdout)
	defer stop()
	wcs := make([]transport.WC, 64)
	for {
		n, err := s.RCQ.Wait(ctx, wcs)
		if err != nil {
			if ctx.Err() != nil {
				return runEnded(ctx)
			}
			return fmt.Errorf("waiting for receives: %w", err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return cli.WCError(wc, "receive")
			}
			if wc.ByteLen != uint32(size) {
				return recvSizeError(int(done.Load())+1, wc.ByteLen, size)
			}
			i := int(wc.WRID)
			if i >= nq {
				return fmt.Errorf("receive completion with wr_id %d names no QP of %d", wc.WRID, nq)
			}
			done.Add(1)
			s.qps[i].posted--
			for s.qps[i].posted < s.recvDepth() {
				if err := s.postRecv(i); err != nil {
					return err
				}
			}
		}
	}
}
