package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/transport"
)

// bwClient is the active side of a bandwidth test: keep tx-depth work
// requests outstanding until iters (or the duration) are done.
func (s *perfSide) bwClient(ctx context.Context, size int, stdout, stderr io.Writer) (oob.Report, error) {
	c := s.c
	iters := c.iters
	var deadline time.Time
	if c.duration > 0 {
		iters = math.MaxInt
		deadline = time.Now().Add(time.Duration(c.duration) * time.Second)
	}
	res := perfResult{size: size}
	if c.duration == 0 {
		res.tposted = make([]time.Time, 0, iters)
		res.tcomplete = make([]time.Time, 0, iters)
	}
	tx := s.txDepth()
	var scnt, ccnt uint64
	wcs := make([]transport.WC, 64)
	wrs := make([]transport.SendWR, 0, tx)
	res.start = time.Now()
	lastProgress := res.start
	stopPosting := false
	for {
		// Post as many as the window allows.
		if !stopPosting {
			wrs = wrs[:0]
			for int(scnt-ccnt)+len(wrs) < tx && int(scnt)+len(wrs) < iters {
				wrs = append(wrs, s.sendWR(size, scnt+uint64(len(wrs))))
			}
			if len(wrs) > 0 {
				now := time.Now()
				if err := s.qp.PostSend(wrs...); err != nil {
					return oob.Report{}, fmt.Errorf("couldn't post send after %d: %w", scnt, err)
				}
				if res.tposted != nil {
					for range wrs {
						res.tposted = append(res.tposted, now)
					}
				}
				scnt += uint64(len(wrs))
			}
		}
		if ccnt == scnt && (stopPosting || int(scnt) >= iters) {
			break
		}
		n, err := s.scq.Wait(ctx, wcs)
		if err != nil {
			return oob.Report{}, fmt.Errorf("waiting for completions (%d of %d done): %w", ccnt, scnt, err)
		}
		now := time.Now()
		if c.bidi {
			s.lastWC.Store(now.UnixNano())
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return oob.Report{}, wcError(wc, "send")
			}
			ccnt++
			if res.tcomplete != nil {
				res.tcomplete = append(res.tcomplete, now)
			}
		}
		if c.duration > 0 && !stopPosting && now.After(deadline) {
			stopPosting = true
		}
		if now.Sub(lastProgress) >= perfProgressEvery {
			lastProgress = now
			el := now.Sub(res.start).Seconds()
			fmt.Fprintf(stderr, " ... %d bytes x %d iterations in %.1fs, %.2f MB/sec\n", size, ccnt, el, float64(ccnt)*float64(size)/el/(1<<20))
		}
	}
	res.end = time.Now()
	res.iters = int(ccnt)
	s.results = append(s.results, res)
	rep := bwReport(res, tx)
	if !c.bidi { // -b prints the sum of both directions after the report exchange
		writeBWLine(stdout, rep)
	}
	return rep, nil
}

// sendBWServer receives the client's SENDs, reposting receives.
func (s *perfSide) sendBWServer(ctx context.Context, size int) error {
	c := s.c
	wcs := make([]transport.WC, 64)
	res := perfResult{size: size}
	var deadline time.Time
	if c.duration > 0 {
		// The client stops after the duration and drains; keep receiving
		// a little longer.
		deadline = time.Now().Add(time.Duration(c.duration)*time.Second + 2*time.Second)
	}
	var rcnt int
	for c.duration > 0 || rcnt < c.iters {
		wctx := ctx
		var cancel context.CancelFunc = func() {}
		if c.duration > 0 {
			if time.Now().After(deadline) {
				break
			}
			wctx, cancel = context.WithDeadline(ctx, deadline)
		}
		n, err := s.rcq.Wait(wctx, wcs)
		cancel()
		if err != nil {
			if c.duration > 0 && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				break
			}
			return fmt.Errorf("waiting for receive %d of %d: %w", rcnt+1, c.iters, err)
		}
		now := time.Now()
		if c.bidi {
			s.lastWC.Store(now.UnixNano())
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return wcError(wc, "receive")
			}
			if wc.ByteLen != uint32(size) {
				return fmt.Errorf("receive %d: %d bytes, want %d", rcnt, wc.ByteLen, size)
			}
			if rcnt == 0 {
				res.start = now
			}
			rcnt++
			s.posted--
			res.end = now
		}
		for s.posted < c.rxDepth && (c.duration > 0 || rcnt+s.posted < c.iters) {
			if err := s.postRecv(); err != nil {
				return err
			}
		}
	}
	res.iters = rcnt
	if s.c.check {
		// Every receive landed at the start of the receive region; the
		// last one is still there.
		if err := checkPattern(s.mem[s.half:s.half+size], 0); err != nil && rcnt > 0 {
			return fmt.Errorf("--check: received data: %w", err)
		}
	}
	s.srvRecv = res
	return nil
}
