package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// The latency rows of `rocev2d bench`: an 8-byte SEND and an 8-byte WRITE
// with immediate bounced between A and B, against raw UDP bouncing one
// datagram, both with the same wait technique — both block (the raw
// sockets in Go's poller, the stack's waiters in CQ.Wait, which receive in
// their own goroutine), or, with --busy-poll=DUR, both poll without
// blocking for up to DUR before they block (the raw sockets with
// MSG_DONTWAIT, the stack's CQ.Wait driving the link itself).

// latencyRows measures the SEND and WRITE ping-pong rows, rounds runs of
// each side alternating.
func (s *benchStack) latencyRows(ctx context.Context, rc *benchConfig, rounds int) ([]benchRow, error) {
	spin := time.Duration(0)
	if rc.Sock.BusyPollSet {
		spin = rc.Sock.BusyPoll
	}
	// Each side's WRITE target (the peer's WRITEs carry an immediate, so
	// the receiver waits in its CQ as for a SEND).
	_, wa, err := s.a.Alloc(64, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		return nil, err
	}
	_, wb, err := s.b.Alloc(64, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		return nil, err
	}
	var rows []benchRow
	for _, op := range []transport.WROpcode{transport.WRSend, transport.WRWriteImm} {
		name := "SEND ping-pong RTT"
		if op == transport.WRWriteImm {
			name = "WRITE ping-pong RTT"
		}
		row := benchRow{name: name, size: 8, latency: true}
		for r := range rounds {
			raw := func() error {
				run, err := rawPingPongSpin(ctx, rc, 8+16, spin)
				if err != nil {
					return fmt.Errorf("raw UDP ping-pong: %w", err)
				}
				row.raw.add(run)
				return nil
			}
			stack := func() error {
				run, err := stackPingPongOp(ctx, rc, s.a, s.b, op, wa, wb)
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				row.roc.add(run)
				return nil
			}
			if err := benchPair(r, &row.core, raw, stack); err != nil {
				return nil, err
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// rawPingPongSpin bounces one datagram of n bytes between two sockets for
// c.dur and returns the round trips, the time and the CPU time they took.
// Each receive polls its socket for up to spin (MSG_DONTWAIT, yielding
// the processor between tries), then blocks in Go's poller.
func rawPingPongSpin(ctx context.Context, c *benchConfig, n int, spin time.Duration) (benchRun, error) {
	sa, sb, err := rawPair(c)
	if err != nil {
		return benchRun{}, err
	}
	defer sa.Close()
	defer sb.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			k, err := rawRecvSpin(sb, buf, spin)
			if err != nil {
				return
			}
			if _, err := sb.WriteToUDPAddrPort(buf[:k], sa.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
				return
			}
		}
	}()
	msg := make([]byte, n)
	buf := make([]byte, 2048)
	dst := sb.LocalAddr().(*net.UDPAddr).AddrPort()
	iters := 0
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(c.dur)
	// A lost datagram (loopback does not lose them, but the machine may
	// be starved) ends the run instead of hanging it.
	sa.SetReadDeadline(deadline.Add(5 * time.Second))
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := sa.WriteToUDPAddrPort(msg, dst); err != nil {
			return benchRun{}, err
		}
		if _, err := rawRecvSpin(sa, buf, spin); err != nil {
			return benchRun{}, fmt.Errorf("no echo after %d round trips: %w", iters, err)
		}
		iters++
	}
	el := time.Since(start)
	run := benchRun{iters: float64(iters), el: el}
	run.cpu, run.cpuSeen = cpu.stop()
	sa.Close()
	sb.Close()
	<-done
	if iters == 0 {
		return benchRun{}, errors.New("no round trip completed")
	}
	return run, ctx.Err()
}

// stackPingPongOp bounces an 8-byte SEND, or an 8-byte WRITE with
// immediate into the peer's wa/wb, between A and B for c.dur and returns
// the round trips, the time and the CPU time they took. Both sides wait
// in CQ.Wait for the receive completion of the peer's message.
func stackPingPongOp(ctx context.Context, c *benchConfig, a, b *cli.Endpoint, op transport.WROpcode, wa, wb *memreg.MR) (benchRun, error) {
	const n = 8
	// Each side sends from bytes 0..7 of its buffer; a SEND lands in bytes
	// 8..15, a WRITE goes to bytes 8..15 of the peer's buffer.
	src := func(mr *memreg.MR) []memreg.SGE {
		return []memreg.SGE{{Addr: mr.IOVA(), Length: n, LKey: mr.LKey()}}
	}
	dst := func(mr *memreg.MR) []memreg.SGE {
		return []memreg.SGE{{Addr: mr.IOVA() + 8, Length: n, LKey: mr.LKey()}}
	}
	wr := func(own, peer *memreg.MR) transport.SendWR {
		w := transport.SendWR{Opcode: op, SGEs: src(own)}
		if op == transport.WRWriteImm {
			w.RemoteAddr, w.RKey = peer.IOVA()+8, peer.RKey()
		}
		return w
	}
	wrA, wrB := wr(wa, wb), wr(wb, wa)
	return pingPongWRs(ctx, c, a, b, wrA, wrB, transport.RecvWR{SGEs: dst(wa)}, transport.RecvWR{SGEs: dst(wb)})
}

// pingPongWRs bounces wrA from A and wrB from B (answering each receive
// completion) for c.dur, with recvA/recvB reposted after every receive,
// and returns the round trips, the time and the CPU time they took. Both
// sides wait in CQ.Wait for the receive completion of the peer's message.
func pingPongWRs(ctx context.Context, c *benchConfig, a, b *cli.Endpoint, wrA, wrB transport.SendWR, recvA, recvB transport.RecvWR) (benchRun, error) {
	for range 4 {
		if err := a.QP.PostRecv(recvA); err != nil {
			return benchRun{}, err
		}
		if err := b.QP.PostRecv(recvB); err != nil {
			return benchRun{}, err
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	echoErr := make(chan error, 1)
	go func() {
		wcs := make([]transport.WC, 8)
		for {
			k, err := b.RCQ.Wait(rctx, wcs)
			if err != nil {
				echoErr <- nil
				return
			}
			for _, wc := range wcs[:k] {
				if wc.Status != transport.WCSuccess {
					echoErr <- cli.WCError(wc, "receive")
					return
				}
				if err := b.QP.PostRecv(recvB); err != nil {
					echoErr <- err
					return
				}
				if err := b.QP.PostSend(wrB); err != nil {
					echoErr <- err
					return
				}
			}
			b.SCQ.Poll(wcs) // unsignaled: none
		}
	}()
	wcs := make([]transport.WC, 8)
	iters := 0
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(c.dur)
	for time.Now().Before(deadline) {
		if err := a.QP.PostSend(wrA); err != nil {
			return benchRun{}, err
		}
		k, err := a.RCQ.Wait(ctx, wcs[:1])
		if err != nil {
			return benchRun{}, fmt.Errorf("waiting for echo %d: %w", iters+1, err)
		}
		if k == 1 && wcs[0].Status != transport.WCSuccess {
			return benchRun{}, cli.WCError(wcs[0], "receive")
		}
		if err := a.QP.PostRecv(recvA); err != nil {
			return benchRun{}, err
		}
		a.SCQ.Poll(wcs)
		iters++
	}
	el := time.Since(start)
	run := benchRun{iters: float64(iters), el: el}
	run.cpu, run.cpuSeen = cpu.stop()
	cancel()
	if err := <-echoErr; err != nil {
		return benchRun{}, err
	}
	return run, ctx.Err()
}
