package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/transport"
)

// bwClient is the active side of a bandwidth test: keep tx-depth work
// requests outstanding on each QP until iters (or the duration) are done on
// every QP, as perftest's run_iter_bw: each round posts on the QPs in turn,
// each up to its window, then polls the one send CQ. The post and
// completion times run over all QPs, so the report counts iters × QPs.
func (s *perfSide) bwClient(ctx context.Context, size int, stdout, stderr io.Writer) (oob.Report, error) {
	c := s.c
	nq := len(s.qps)
	iters := c.iters // per QP
	var deadline time.Time
	if c.duration > 0 {
		iters = math.MaxInt
		deadline = time.Now().Add(time.Duration(c.duration) * time.Second)
	}
	res := perfResult{size: size}
	if c.duration == 0 && !c.noPeak {
		res.tposted = make([]time.Time, 0, iters*nq)
		res.tcomplete = make([]time.Time, 0, iters*nq)
	}
	tx := s.txDepth()
	scnt := make([]uint64, nq) // per QP
	ccnt := make([]uint64, nq) // WRs completed: up to the last signaled one's
	// lastSig is one past the last signaled WR posted on each QP: with
	// -Q the WRs after it (a -D run that stopped posting) never complete
	// visibly, as in perftest, which stops waiting for them too.
	lastSig := make([]uint64, nq)
	pl := max(c.postList, 1)
	var totS, totC uint64
	wcs := make([]transport.WC, 64)
	wrs := make([]transport.SendWR, 0, tx)
	res.start = time.Now()
	lastProgress := res.start
	stopPosting := false
	for {
		// Post as many as each QP's window allows.
		allPosted := true
		for i, q := range s.qps {
			if stopPosting {
				break
			}
			wrs = wrs[:0]
			for int(scnt[i]-ccnt[i])+len(wrs)+pl <= tx && int(scnt[i])+len(wrs)+pl <= iters {
				for range pl {
					wrs = append(wrs, s.signalWR(s.sendWRQP(i, size, scnt[i]+uint64(len(wrs))), iters))
				}
			}
			// Without -l every WR that fits goes in one call (what the
			// wire carries is the same); with it, one call per list.
			for rest := wrs; len(rest) > 0; {
				list := rest
				if pl > 1 {
					list = rest[:pl]
				}
				rest = rest[len(list):]
				now := time.Now()
				if err := q.qp.PostSend(list...); err != nil {
					if nq > 1 {
						return oob.Report{}, fmt.Errorf("couldn't post send on QP %d after %d: %w", i, scnt[i], err)
					}
					return oob.Report{}, fmt.Errorf("couldn't post send after %d: %w", scnt[i], err)
				}
				if res.tposted != nil {
					for range list {
						res.tposted = append(res.tposted, now)
					}
				}
				for _, wr := range list {
					if wr.Flags&transport.SendSignaled != 0 {
						lastSig[i] = wr.WRID&(1<<perfWRIDShift-1) + 1
					}
				}
				scnt[i] += uint64(len(list))
				totS += uint64(len(list))
			}
			if int(scnt[i]) < iters {
				allPosted = false
			}
		}
		if totC == totS && allPosted {
			break
		}
		if stopPosting && slices.Equal(ccnt, lastSig) {
			break
		}
		n, err := s.SCQ.Wait(ctx, wcs)
		if err != nil {
			return oob.Report{}, fmt.Errorf("waiting for completions (%d of %d done): %w", totC, totS, err)
		}
		now := time.Now()
		if c.bidi {
			s.lastWC.Store(now.UnixNano())
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return oob.Report{}, cli.WCError(wc, "send")
			}
			i := int(wc.WRID >> perfWRIDShift)
			if i >= nq {
				return oob.Report{}, fmt.Errorf("send completion with wr_id %#x names no QP of %d", wc.WRID, nq)
			}
			// A signaled WR's completion ends the unsignaled ones
			// before it on its QP (in order, as RC completes them).
			end := wc.WRID&(1<<perfWRIDShift-1) + 1
			if end <= ccnt[i] || end > scnt[i] {
				return oob.Report{}, fmt.Errorf("send completion for WR %d on QP %d, where %d of %d completed", end-1, i, ccnt[i], scnt[i])
			}
			for range end - ccnt[i] {
				totC++
				if res.tcomplete != nil {
					res.tcomplete = append(res.tcomplete, now)
				}
			}
			ccnt[i] = end
			s.sendWCs.Add(1)
		}
		if c.duration > 0 && !stopPosting && now.After(deadline) {
			stopPosting = true
		}
		if now.Sub(lastProgress) >= perfProgressEvery {
			lastProgress = now
			el := now.Sub(res.start).Seconds()
			fmt.Fprintf(stderr, " ... %d bytes x %d iterations in %.1fs, %.2f MB/sec\n", size, totC, el, float64(totC)*float64(size)/el/(1<<20))
		}
	}
	res.end = time.Now()
	res.iters = int(totC)
	s.results = append(s.results, res)
	rep := bwReport(res, tx*nq, c.gbits)
	if c.noPeak {
		rep.BWPeak = 0 // perftest's noPeak: no peak, 0.00
	}
	if !c.bidi { // -b prints the sum of both directions after the report exchange
		c.bwRow(stdout, rep)
	}
	return rep, nil
}

// signalWR sets SendSignaled on the WR of iteration n (its wr_id's low
// bits) of a QP as perftest's run_iter_bw does with CQ moderation: every
// -Q-th WR, and the last of a run of iters (math.MaxInt: no last).
func (s *perfSide) signalWR(wr transport.SendWR, iters int) transport.SendWR {
	n := wr.WRID & (1<<perfWRIDShift - 1)
	wr.Flags &^= transport.SendSignaled
	if (n+1)%uint64(max(s.c.cqMod, 1)) == 0 || (iters != math.MaxInt && n == uint64(iters)-1) {
		wr.Flags |= transport.SendSignaled
	}
	return wr
}

// sendBWServer receives the client's SENDs on every QP (one receive CQ),
// reposting receives on the QP each came from, until iters arrived on each
// (perftest's run_iter_bw_server: iters × QPs in all).
func (s *perfSide) sendBWServer(ctx context.Context, size int) error {
	c := s.c
	nq := len(s.qps)
	wcs := make([]transport.WC, 64)
	res := perfResult{size: size}
	var deadline time.Time
	if c.duration > 0 {
		// The client stops after the duration and drains; keep receiving
		// a little longer.
		deadline = time.Now().Add(time.Duration(c.duration)*time.Second + 2*time.Second)
	}
	total := c.iters * nq
	rcntQ := make([]int, nq)
	var rcnt int
	for c.duration > 0 || rcnt < total {
		wctx := ctx
		var cancel context.CancelFunc = func() {}
		if c.duration > 0 {
			if time.Now().After(deadline) {
				break
			}
			wctx, cancel = context.WithDeadline(ctx, deadline)
		}
		n, err := s.RCQ.Wait(wctx, wcs)
		cancel()
		if err != nil {
			if c.duration > 0 && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				break
			}
			return fmt.Errorf("waiting for receive %d of %d: %w", rcnt+1, total, err)
		}
		now := time.Now()
		if c.bidi {
			s.lastWC.Store(now.UnixNano())
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return cli.WCError(wc, "receive")
			}
			if wc.ByteLen != uint32(size) {
				return recvSizeError(rcnt+1, wc.ByteLen, size)
			}
			i := int(wc.WRID)
			if i >= nq {
				return fmt.Errorf("receive completion with wr_id %d names no QP of %d", wc.WRID, nq)
			}
			if rcnt == 0 {
				res.start = now
			}
			rcnt++
			rcntQ[i]++
			s.qps[i].posted--
			res.end = now
			for s.qps[i].posted < s.recvDepth() && (c.duration > 0 || rcntQ[i]+s.qps[i].posted < c.iters) {
				if err := s.postRecv(i); err != nil {
					return err
				}
			}
		}
	}
	res.iters = rcnt
	if s.c.check {
		// Every receive landed at the start of its QP's receive region;
		// the last one is still there.
		for i := range s.qps {
			if rcntQ[i] == 0 {
				continue
			}
			if err := checkPattern(s.dst(i)[:size], 0); err != nil {
				if nq > 1 {
					return fmt.Errorf("--check: received data on QP %d: %w\n  (%s)", i, err, checkHint)
				}
				return fmt.Errorf("--check: received data: %w\n  (%s)", err, checkHint)
			}
		}
	}
	s.srvRecv = res
	return nil
}
