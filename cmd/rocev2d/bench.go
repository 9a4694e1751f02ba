package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

func init() {
	register("bench", "raw UDP vs the RoCEv2 stack over loopback: goodput and ping-pong latency, side by side", benchUsage, runBench)
}

const benchUsage = `usage: rocev2d bench [options]

One run, side by side, over loopback: a raw UDP baseline (two plain UDP
sockets moving the same datagram sizes with sendmmsg/recvmmsg batches of 64)
against the RoCEv2 stack (two devices, one RC QP each, UDP sockets on port
4791) for WRITE, READ and SEND goodput with 64 B, 4 KiB and 64 KiB messages
and for an 8-byte SEND ping-pong. The ratio column is stack / raw UDP.

Goodput counts message bytes delivered; the baseline sends each message
as the stack does, in datagrams of at most one path MTU of payload (plus 16
bytes for BTH and ICRC). Latency is the round-trip time of one message each
way, averaged over the run.

options:
  -t, --time=DUR  duration of each row (default 1s)
  -m, --mtu=MTU   path MTU of the stack and datagram payload size (default 4096)
  --a=IP          first address (default 127.0.0.1)
  --b=IP          second address (default 127.0.0.2)
  -v              print the stack's counters at the end
` + socketUsage

// benchConfig holds the parsed flags of `rocev2d bench`.
type benchConfig struct {
	pairOptions
	dur time.Duration
}

func parseBenchFlags(args []string) (*benchConfig, error) {
	c := &benchConfig{}
	fs := newFlagSet("rocev2d bench")
	fs.DurationVar(&c.dur, "t", time.Second, "")
	fs.DurationVar(&c.dur, "time", time.Second, "")
	if err := parsePairFlags(fs, args, &c.pairOptions, 4096); err != nil {
		return nil, err
	}
	if c.a == c.b || c.a.Is4() != c.b.Is4() {
		return nil, errors.New("--a and --b must be two different addresses of one IP version")
	}
	if c.dur < 10*time.Millisecond || c.dur > time.Hour {
		return nil, fmt.Errorf("-t %v: duration must be between 10ms and 1h", c.dur)
	}
	return c, nil
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseBenchFlags(args)
	if code, done := flagsResult("bench", benchUsage, err, stdout, stderr); done {
		return code
	}
	if err := bench(ctx, c, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "rocev2d bench: %v\n", err)
		return exitFail
	}
	return exitOK
}

// benchRow is one line of the table.
type benchRow struct {
	name     string
	size     int
	raw, roc float64 // MB/s, or µs for latency rows
	rawPPS   float64 // raw datagrams per second
	rawLoss  float64 // fraction of raw datagrams dropped by the receiver
	rocPPS   float64 // stack packets per second (both directions)
	latency  bool
}

func bench(ctx context.Context, c *benchConfig, stdout, stderr io.Writer) error {
	usr1 := watchSIGUSR1(stderr)
	defer usr1.Stop()
	sizes := []int{64, 4096, 65536}
	fmt.Fprintf(stdout, "rocev2d bench: %v <-> %v over loopback, path MTU %v, per row %v of raw UDP and %v of rocev2 in %d alternating runs\n\n",
		c.a, c.b, c.mtu, c.dur, c.dur, benchRounds)
	// Every row alternates benchRounds short runs of the raw UDP baseline
	// (plain UDP sockets on ephemeral ports) and of the stack, each
	// c.dur/benchRounds long, so that both see the same moments of a noisy
	// machine.
	rc := *c
	rc.dur = max(c.dur/benchRounds, 10*time.Millisecond)
	la, lb, err := listenSocketPair(c.a, c.b, c.sock.options(true, 0), "pick other addresses with --a/--b")
	if err != nil {
		return err
	}
	a, b, err := newEndpointPair(la, lb, c.a, c.b, c.mtu)
	if err != nil {
		return err
	}
	// One registration per buffer for the whole run, released after the
	// devices are closed.
	defer a.close()
	defer b.close()
	_, srcMR, err := a.alloc(1<<16, memreg.AccessLocalWrite)
	if err != nil {
		return err
	}
	_, dstMR, err := b.alloc(1<<16, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
	if err != nil {
		return err
	}
	// B's receive buffer for the SEND rows: one registration, big enough
	// for every size, with receives kept posted across rows.
	_, rmr, err := b.alloc(1<<16, memreg.AccessLocalWrite)
	if err != nil {
		return err
	}
	recv := transport.RecvWR{SGEs: []memreg.SGE{{Addr: rmr.IOVA(), Length: uint32(rmr.Len()), LKey: rmr.LKey()}}}
	for i := 0; i < 200; i++ {
		if err := b.qp.PostRecv(recv); err != nil {
			return err
		}
	}
	usr1.Add("A "+c.a.String(), a.dev)
	usr1.Add("B "+c.b.String(), b.dev)
	var rows []benchRow
	for _, op := range []transport.WROpcode{transport.WRWrite, transport.WRRead, transport.WRSend} {
		for _, size := range sizes {
			row := benchRow{name: demoName(op) + " goodput", size: size}
			for r := range benchRounds {
				raw := func() error {
					mbs, pps, loss, err := rawGoodput(ctx, &rc, size)
					if err != nil {
						return fmt.Errorf("raw UDP baseline, %d B messages: %w", size, err)
					}
					row.raw, row.rawPPS, row.rawLoss = row.raw+mbs/benchRounds, row.rawPPS+pps/benchRounds, row.rawLoss+loss/benchRounds
					return nil
				}
				stack := func() error {
					mbs, pps, err := stackGoodput(ctx, &rc, a, b, op, size, srcMR, dstMR, recv)
					if err != nil {
						return fmt.Errorf("%s %d B: %w", demoName(op), size, err)
					}
					row.roc, row.rocPPS = row.roc+mbs/benchRounds, row.rocPPS+pps/benchRounds
					return nil
				}
				if err := benchPair(r, raw, stack); err != nil {
					return err
				}
			}
			rows = append(rows, row)
		}
	}
	row := benchRow{name: "SEND ping-pong RTT", size: 8, latency: true}
	for r := range benchRounds {
		raw := func() error {
			rtt, err := rawPingPong(ctx, &rc, 8+16)
			if err != nil {
				return fmt.Errorf("raw UDP ping-pong: %w", err)
			}
			row.raw += rtt / benchRounds
			return nil
		}
		stack := func() error {
			rtt, err := stackPingPong(ctx, &rc, a, b, 8, srcMR, rmr)
			if err != nil {
				return fmt.Errorf("SEND ping-pong: %w", err)
			}
			row.roc += rtt / benchRounds
			return nil
		}
		if err := benchPair(r, raw, stack); err != nil {
			return err
		}
	}
	rows = append(rows, row)

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "test\tmessage\traw UDP\trocev2\tratio\traw pkt/s\traw loss\trocev2 pkt/s\t")
	for _, r := range rows {
		if r.latency {
			fmt.Fprintf(tw, "%s\t%d B\t%.1f µs\t%.1f µs\t%.2f\t\t\t\t\n", r.name, r.size, r.raw, r.roc, r.roc/r.raw)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f MB/s\t%.1f MB/s\t%.3f\t%.0f\t%.1f%%\t%.0f\t\n", r.name, benchSize(r.size), r.raw, r.roc, r.roc/r.raw, r.rawPPS, 100*r.rawLoss, r.rocPPS)
	}
	tw.Flush()
	fmt.Fprintln(stdout, "\nratio = rocev2 / raw UDP (goodput: higher is better; RTT: lower is better).")
	fmt.Fprintln(stdout, "raw UDP has no flow control: raw loss is what the receiving socket dropped (goodput counts delivered bytes).")
	fmt.Fprintln(stdout, "rocev2 pkt/s counts the packets of both directions (data, ACKs, READ responses).")
	if c.verbose {
		fmt.Fprintln(stdout)
		printCounters(stdout, "A "+c.a.String(), a.dev)
		printCounters(stdout, "B "+c.b.String(), b.dev)
	}
	return nil
}

// benchRounds is how many alternating raw / stack runs make one row.
const benchRounds = 3

// benchPair runs raw and stack, raw first in even rounds and stack first in
// odd ones.
func benchPair(round int, raw, stack func() error) error {
	first, second := raw, stack
	if round%2 == 1 {
		first, second = stack, raw
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

func benchSize(n int) string {
	switch {
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// benchBatch is the sendmmsg/recvmmsg batch of the raw baseline.
const benchBatch = 64

// batchConn is the ReadBatch/WriteBatch side of x/net's ipv4/ipv6
// PacketConn (recvmmsg/sendmmsg on Linux).
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

func newBatchConn(c *net.UDPConn, v4 bool) batchConn {
	if v4 {
		return ipv4.NewPacketConn(c)
	}
	return ipv6.NewPacketConn(c)
}

// rawPair opens two UDP sockets on ephemeral ports of the two addresses.
func rawPair(c *benchConfig) (sa, sb *net.UDPConn, err error) {
	sa, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.a, 0)))
	if err != nil {
		return nil, nil, err
	}
	sb, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.b, 0)))
	if err != nil {
		sa.Close()
		return nil, nil, err
	}
	for _, s := range []*net.UDPConn{sa, sb} {
		s.SetReadBuffer(8 << 20)
		s.SetWriteBuffer(8 << 20)
	}
	return sa, sb, nil
}

// rawGoodput sends messages of size bytes, cut into datagrams of at most
// one MTU of payload plus 16 bytes (BTH + ICRC), from a to b for c.dur with
// sendmmsg batches, receives them with recvmmsg batches, and returns the
// delivered message bytes per second (MB/s, 10^6) and datagrams per second.
// The third result is the fraction of datagrams lost at the receiver (the
// baseline has no flow control; the kernel drops what the receiving socket
// cannot take).
func rawGoodput(ctx context.Context, c *benchConfig, size int) (float64, float64, float64, error) {
	sa, sb, err := rawPair(c)
	if err != nil {
		return 0, 0, 0, err
	}
	defer sa.Close()
	defer sb.Close()
	mtu := c.mtu.Bytes()
	// The datagrams of one message: full MTU chunks and the remainder.
	var chunks []int
	for left := size; left > 0; left -= mtu {
		chunks = append(chunks, min(left, mtu))
	}
	bufs := make([][]byte, len(chunks))
	for i, n := range chunks {
		bufs[i] = make([]byte, n+16)
	}
	dst := sb.LocalAddr()
	wb := newBatchConn(sa, c.a.Is4())
	rb := newBatchConn(sb, c.a.Is4())
	msgs := make([]ipv4.Message, benchBatch)
	for i := range msgs {
		msgs[i] = ipv4.Message{Buffers: [][]byte{bufs[i%len(bufs)]}, Addr: dst}
	}
	var rcvdBytes, rcvdPkts atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rm := make([]ipv4.Message, benchBatch)
		for i := range rm {
			rm[i] = ipv4.Message{Buffers: [][]byte{make([]byte, 65536)}}
		}
		for {
			sb.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			n, err := rb.ReadBatch(rm, 0)
			for _, m := range rm[:max(n, 0)] {
				rcvdBytes.Add(int64(m.N - 16))
				rcvdPkts.Add(1)
			}
			if err != nil {
				select {
				case <-stop:
					return
				default:
				}
			}
		}
	}()
	var sent int64
	start := time.Now()
	deadline := start.Add(c.dur)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		// Keep message boundaries: batches are whole multiples of a message.
		n := benchBatch - benchBatch%len(bufs)
		if n == 0 {
			n = len(bufs)
		}
		k, err := wb.WriteBatch(msgs[:n], 0)
		sent += int64(max(k, 0))
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.EAGAIN) {
				continue
			}
			close(stop)
			wg.Wait()
			return 0, 0, 0, err
		}
	}
	el := time.Since(start)
	time.Sleep(20 * time.Millisecond) // let the receiver drain
	close(stop)
	wg.Wait()
	loss := 0.0
	if sent > 0 {
		loss = max(0, 1-float64(rcvdPkts.Load())/float64(sent))
	}
	return float64(rcvdBytes.Load()) / el.Seconds() / 1e6, float64(rcvdPkts.Load()) / el.Seconds(), loss, ctx.Err()
}

// rawPingPong bounces one datagram of n bytes between two sockets for
// c.dur and returns the mean round-trip time in µs.
func rawPingPong(ctx context.Context, c *benchConfig, n int) (float64, error) {
	sa, sb, err := rawPair(c)
	if err != nil {
		return 0, err
	}
	defer sa.Close()
	defer sb.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			sb.SetReadDeadline(time.Now().Add(time.Second))
			k, from, err := sb.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := sb.WriteToUDPAddrPort(buf[:k], from); err != nil {
				return
			}
		}
	}()
	msg := make([]byte, n)
	buf := make([]byte, 2048)
	dst := sb.LocalAddr().(*net.UDPAddr).AddrPort()
	iters := 0
	start := time.Now()
	deadline := start.Add(c.dur)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := sa.WriteToUDPAddrPort(msg, dst); err != nil {
			return 0, err
		}
		sa.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := sa.ReadFromUDPAddrPort(buf); err != nil {
			return 0, fmt.Errorf("no echo after %d round trips: %w", iters, err)
		}
		iters++
	}
	el := time.Since(start)
	sa.Close()
	sb.Close()
	<-done
	if iters == 0 {
		return 0, errors.New("no round trip completed")
	}
	return float64(el.Nanoseconds()) / 1e3 / float64(iters), ctx.Err()
}

// stackGoodput runs op from A to B (READ: B's memory to A) with messages of
// size bytes and a window of outstanding work requests for c.dur, and
// returns the delivered message bytes per second (MB/s) and the packets per
// second both links sent.
// srcMR (on A) and dstMR (on B) hold at least size bytes. For SEND, B has
// receives of recv posted and reposts each one consumed.
func stackGoodput(ctx context.Context, c *benchConfig, a, b *endpoint, op transport.WROpcode, size int, srcMR, dstMR *memreg.MR, recv transport.RecvWR) (float64, float64, error) {
	window := 64
	if size >= 65536 {
		window = 8
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var recvErr error
	var received atomic.Int64
	var wg sync.WaitGroup
	if op == transport.WRSend {
		// B keeps its receive queue full.
		wg.Add(1)
		go func() {
			defer wg.Done()
			wcs := make([]transport.WC, 64)
			for {
				n, err := b.rcq.Wait(rctx, wcs)
				if err != nil {
					if rctx.Err() == nil {
						recvErr = err
					}
					return
				}
				for _, wc := range wcs[:n] {
					if wc.Status != transport.WCSuccess {
						recvErr = wcError(wc, "receive")
						return
					}
					if err := b.qp.PostRecv(recv); err != nil {
						recvErr = err
						return
					}
					received.Add(1)
				}
			}
		}()
	}
	wr := transport.SendWR{Opcode: op, Flags: transport.SendSignaled,
		SGEs:       []memreg.SGE{{Addr: srcMR.IOVA(), Length: uint32(size), LKey: srcMR.LKey()}},
		RemoteAddr: dstMR.IOVA(), RKey: dstMR.RKey()}
	wrs := make([]transport.SendWR, window)
	for i := range wrs {
		wrs[i] = wr
	}
	wcs := make([]transport.WC, 64)
	pkts0 := a.link.Stats().SentPkts + b.link.Stats().SentPkts
	var posted, done int
	start := time.Now()
	deadline := start.Add(c.dur)
	for {
		if time.Now().Before(deadline) && posted-done < window {
			k := window - (posted - done)
			if err := a.qp.PostSend(wrs[:k]...); err != nil {
				return 0, 0, err
			}
			posted += k
		}
		if posted == done {
			break
		}
		n, err := a.scq.Wait(ctx, wcs)
		if err != nil {
			return 0, 0, err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return 0, 0, wcError(wc, "send")
			}
		}
		done += n
	}
	el := time.Since(start)
	pkts := a.link.Stats().SentPkts + b.link.Stats().SentPkts - pkts0
	if op == transport.WRSend {
		// Wait until B has consumed (and reposted) every message.
		for time.Since(start) < c.dur+5*time.Second && received.Load() < int64(done) {
			time.Sleep(time.Millisecond)
		}
		cancel()
		wg.Wait()
		if recvErr != nil {
			return 0, 0, recvErr
		}
	}
	return float64(done) * float64(size) / el.Seconds() / 1e6, float64(pkts) / el.Seconds(), ctx.Err()
}

// stackPingPong bounces a SEND of n bytes between A and B for c.dur and
// returns the mean round-trip time in µs.
// mrA is A's source/receive memory, mrB B's.
func stackPingPong(ctx context.Context, c *benchConfig, a, b *endpoint, n int, mrA, mrB *memreg.MR) (float64, error) {
	sgeA := []memreg.SGE{{Addr: mrA.IOVA(), Length: uint32(n), LKey: mrA.LKey()}}
	sgeB := []memreg.SGE{{Addr: mrB.IOVA(), Length: uint32(n), LKey: mrB.LKey()}}
	for i := 0; i < 4; i++ {
		if err := a.qp.PostRecv(transport.RecvWR{SGEs: sgeA}); err != nil {
			return 0, err
		}
		if err := b.qp.PostRecv(transport.RecvWR{SGEs: sgeB}); err != nil {
			return 0, err
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	echoErr := make(chan error, 1)
	go func() {
		wcs := make([]transport.WC, 8)
		for {
			k, err := b.rcq.Wait(rctx, wcs)
			if err != nil {
				echoErr <- nil
				return
			}
			for _, wc := range wcs[:k] {
				if wc.Status != transport.WCSuccess {
					echoErr <- wcError(wc, "receive")
					return
				}
				if err := b.qp.PostRecv(transport.RecvWR{SGEs: sgeB}); err != nil {
					echoErr <- err
					return
				}
				if err := b.qp.PostSend(transport.SendWR{Opcode: transport.WRSend, SGEs: sgeB}); err != nil {
					echoErr <- err
					return
				}
			}
			// Reap B's (unsignaled: none) send completions.
			b.scq.Poll(wcs)
		}
	}()
	wcs := make([]transport.WC, 8)
	iters := 0
	start := time.Now()
	deadline := start.Add(c.dur)
	for time.Now().Before(deadline) {
		if err := a.qp.PostSend(transport.SendWR{Opcode: transport.WRSend, SGEs: sgeA}); err != nil {
			return 0, err
		}
		k, err := a.rcq.Wait(ctx, wcs[:1])
		if err != nil {
			return 0, fmt.Errorf("waiting for echo %d: %w", iters+1, err)
		}
		if k == 1 && wcs[0].Status != transport.WCSuccess {
			return 0, wcError(wcs[0], "receive")
		}
		if err := a.qp.PostRecv(transport.RecvWR{SGEs: sgeA}); err != nil {
			return 0, err
		}
		a.scq.Poll(wcs)
		iters++
	}
	el := time.Since(start)
	cancel()
	if err := <-echoErr; err != nil {
		return 0, err
	}
	return float64(el.Nanoseconds()) / 1e3 / float64(iters), ctx.Err()
}
