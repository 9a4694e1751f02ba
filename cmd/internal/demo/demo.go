package demo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

func init() {
	commands.Register("demo", "two endpoints in one process on loopback run every RC operation, checked byte for byte", demoUsage, runDemo)
}

const demoUsage = `usage: rocev2d demo [options]

Runs two RoCEv2 devices in one process — by default on 127.0.0.1 and
127.0.0.2, each a kernel UDP socket on port 4791 — connects one RC queue
pair on each and runs every RC operation (SEND, SEND with immediate, RDMA
WRITE, WRITE with immediate, RDMA READ, compare-and-swap, fetch-and-add) at
several sizes, including multi-packet messages. Every result is checked
byte for byte (atomics: the returned original values and the target memory),
and a table shows what ran. Exit status 0 only if every check passed.

options:
  --mem          run over the in-memory network instead of UDP sockets
  --loss=P, --dup=P, --reorder=P
                 with --mem: drop, duplicate or reorder each packet with
                 probability P (seeded by --seed), to watch recovery
  --ce=P         with --mem: mark each ECN-capable packet CE with
                 probability P, to watch the CNPs and DCQCN (-v counts
                 them: np_ecn_marked_roce_packets, np_cnp_sent,
                 rp_cnp_handled; rp_cnp_ignored with --dcqcn=off)
  --seed=N       fault seed (default 1)
  --a=IP         address of the first device (default 127.0.0.1)
  --b=IP         address of the second device (default 127.0.0.2)
  -m, --mtu=MTU  path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)
  --pcap=FILE    write every packet that went over the wire to FILE (pcap,
                 Ethernet framing, ICRCs as sent; check it with
                 ` + "`rocev2d pcap check FILE`" + `)
  --snaplen=N    with --pcap, keep at most N bytes of each frame, as tcpdump -s
                 (128 keeps every header; default 0 = whole frames)
  --timeout=DUR  give up after DUR (default 60s)
  -v             print both devices' counters at the end
` + cli.SocketUsage

// demoConfig holds the parsed flags of `rocev2d demo`.
type demoConfig struct {
	cli.PairOptions
	mem     bool
	faults  memnet.Faults
	pcap    string
	snaplen int
	timeout time.Duration
}

func parseDemoFlags(args []string) (*demoConfig, error) {
	c := &demoConfig{}
	fs := cli.NewFlagSet("rocev2d demo")
	fs.BoolVar(&c.mem, "mem", false, "")
	fs.Float64Var(&c.faults.Loss, "loss", 0, "")
	fs.Float64Var(&c.faults.Dup, "dup", 0, "")
	fs.Float64Var(&c.faults.Reorder, "reorder", 0, "")
	fs.Float64Var(&c.faults.CEMark, "ce", 0, "")
	fs.Int64Var(&c.faults.Seed, "seed", 1, "")
	fs.StringVar(&c.pcap, "pcap", "", "")
	fs.IntVar(&c.snaplen, "snaplen", 0, "")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "")
	if err := cli.ParsePairFlags(fs, args, &c.PairOptions, 1024); err != nil {
		return nil, err
	}
	if c.A == c.B {
		return nil, fmt.Errorf("--a and --b are both %v; the two devices need different addresses", c.A)
	}
	if c.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %v: must be positive", c.timeout)
	}
	if c.snaplen < 0 || c.snaplen > 0 && c.pcap == "" {
		return nil, fmt.Errorf("--snaplen %d: must be 0 (whole frames) or more, with --pcap", c.snaplen)
	}
	for _, f := range []struct {
		name string
		p    float64
	}{{"--loss", c.faults.Loss}, {"--dup", c.faults.Dup}, {"--reorder", c.faults.Reorder}, {"--ce", c.faults.CEMark}} {
		if !(f.p >= 0 && f.p < 1) {
			return nil, fmt.Errorf("%s %v: probability must be in [0, 1)", f.name, f.p)
		}
		if f.p > 0 && !c.mem {
			return nil, fmt.Errorf("%s needs --mem (faults are simulated by the in-memory network)", f.name)
		}
	}
	return c, nil
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseDemoFlags(args)
	if code, done := cli.FlagsResult("demo", demoUsage, err, stdout, stderr); done {
		return code
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("--timeout %v reached", c.timeout))
	defer cancel()
	return demo(ctx, c, stdout, stderr)
}

// demoLinks opens the two links, over sockets or a MemNetwork.
func demoLinks(c *demoConfig) (a, b udp.Link, kind string, err error) {
	if c.mem {
		n := memnet.NewMemNetwork(c.faults)
		la, err := n.Link(c.A)
		if err != nil {
			return nil, nil, "", err
		}
		lb, err := n.Link(c.B)
		if err != nil {
			la.Close()
			return nil, nil, "", err
		}
		kind := "in-memory network"
		if f := c.faults; f.Loss > 0 || f.Dup > 0 || f.Reorder > 0 {
			kind += fmt.Sprintf(" (loss %g, dup %g, reorder %g, seed %d)", f.Loss, f.Dup, f.Reorder, f.Seed)
		}
		return la, lb, kind, nil
	}
	la, lb, err := cli.ListenSocketPair(c.A, c.B, c.Sock.Options(true, 0), "pick other addresses with --a/--b, or use --mem")
	if err != nil {
		return nil, nil, "", err
	}
	return la, lb, "UDP sockets", nil
}

// demoCase is one row of the demo: count messages of one operation and size.
type demoCase struct {
	op    transport.WROpcode
	size  int
	count int
}

// demoCases is the demo's program.
func demoCases() []demoCase {
	var cs []demoCase
	count := func(size int) int {
		switch {
		case size >= 1<<20:
			return 2
		case size >= 1<<16:
			return 4
		}
		return 8
	}
	for _, op := range []transport.WROpcode{transport.WRSend, transport.WRSendImm, transport.WRWrite, transport.WRWriteImm, transport.WRRead} {
		for _, size := range []int{0, 64, 4096, 65536, 1 << 20} {
			cs = append(cs, demoCase{op, size, count(size)})
		}
	}
	cs = append(cs, demoCase{transport.WRCompareSwap, 8, 8}, demoCase{transport.WRFetchAdd, 8, 8})
	return cs
}

// demoCreateCapture is cli.CreateCapture (a variable for tests).
var demoCreateCapture = cli.CreateCapture

// demoResult is the outcome of one case.
type demoResult struct {
	demoCase
	bytes   int64
	packets uint64
	elapsed time.Duration
	err     error
}

func demo(ctx context.Context, c *demoConfig, stdout, stderr io.Writer) int {
	usr1 := cli.WatchSIGUSR1(stderr)
	defer usr1.Stop()
	la, lb, kind, err := demoLinks(c)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d demo: %v\n", err)
		return cli.ExitFail
	}
	var pw *pcaptap.Writer
	if c.pcap != "" {
		if pw, err = demoCreateCapture(c.pcap, c.snaplen); err != nil {
			la.Close()
			lb.Close()
			fmt.Fprintf(stderr, "rocev2d demo: %v\n", err)
			if pe := (*os.PathError)(nil); errors.As(err, &pe) && pe.Op == "open" {
				return cli.ExitUsage
			}
			return cli.ExitFail
		}
		// Each device records what it sends: every packet once, as a
		// capture on the loopback interface shows it.
		la = pcaptap.New(la, pw, pcaptap.Sent)
		lb = pcaptap.New(lb, pw, pcaptap.Sent)
	}
	a, b, err := cli.NewEndpointPair(la, lb, c.A, c.B, c.MTU, c.Sock.CC.Config())
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d demo: %v\n", err)
		return cli.ExitFail
	}
	defer a.Close()
	defer b.Close()
	usr1.Add("A "+c.A.String(), a.Dev)
	usr1.Add("B "+c.B.String(), b.Dev)
	fmt.Fprintf(stdout, "rocev2d demo over %s, path MTU %v\n", kind, c.MTU)
	fmt.Fprintf(stdout, "  A: %v QPN 0x%06x PSN 0x%06x\n", c.A, a.QP.QPN(), a.PSN)
	fmt.Fprintf(stdout, "  B: %v QPN 0x%06x PSN 0x%06x\n\n", c.B, b.QP.QPN(), b.PSN)

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tsize\tcount\tbytes\tpackets\ttime\tMB/s\tcheck\t")
	failed := 0
	var results []demoResult
	for _, dc := range demoCases() {
		if ctx.Err() != nil {
			break
		}
		r := runDemoCase(ctx, a, b, dc)
		results = append(results, r)
		check := "ok"
		if r.err != nil {
			check = "FAIL"
			failed++
		}
		mbs := "-"
		if r.bytes > 0 && r.elapsed > 0 {
			mbs = fmt.Sprintf("%.1f", float64(r.bytes)/r.elapsed.Seconds()/1e6)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", cli.OpName(dc.op), dc.size, dc.count, r.bytes, r.packets,
			fmtDuration(r.elapsed), mbs, check)
	}
	tw.Flush()
	for _, r := range results {
		if r.err != nil {
			fmt.Fprintf(stdout, "FAIL %s %d bytes: %v\n", cli.OpName(r.op), r.size, r.err)
		}
	}
	if c.Verbose {
		fmt.Fprintln(stdout)
		cli.PrintCounters(stdout, "A "+c.A.String(), a.Dev)
		cli.PrintCounters(stdout, "B "+c.B.String(), b.Dev)
	}
	ran := len(results)
	// Close the devices before the capture so that every packet is in it.
	a.Close()
	b.Close()
	var captureErr error
	if pw != nil {
		if captureErr = pw.Close(); captureErr != nil {
			fmt.Fprintf(stderr, "rocev2d demo: --pcap %s: %v\n", c.pcap, captureErr)
		} else {
			fmt.Fprintf(stdout, "\nwrote %d packets to %s\n", pw.Packets(), c.pcap)
		}
	}
	switch {
	case ctx.Err() != nil && ran < len(demoCases()):
		fmt.Fprintf(stdout, "\nFAIL: stopped after %d of %d cases: %v\n", ran, len(demoCases()), context.Cause(ctx))
		return cli.ExitFail
	case failed > 0:
		fmt.Fprintf(stdout, "\nFAIL: %d of %d cases failed\n", failed, ran)
		return cli.ExitFail
	case captureErr != nil:
		// Not a case that failed: the capture is incomplete.
		fmt.Fprintf(stdout, "\nFAIL: all %d cases passed, but the capture %s is incomplete: %v\n", ran, c.pcap, captureErr)
		return cli.ExitFail
	}
	fmt.Fprintf(stdout, "\nPASS: all %d cases checked byte for byte\n", ran)
	return cli.ExitOK
}

// fmtDuration prints a duration with three significant digits.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.3fs", d.Seconds())
}

// sentPkts is the number of packets both links sent.
func sentPkts(a, b *cli.Endpoint) uint64 { return a.Link.Stats().SentPkts + b.Link.Stats().SentPkts }

// settlePkts waits (up to 50 ms) until every packet either link sent has been
// received by the other — a link counts a packet as sent only when its send
// call returns, which can be after the peer already used it — and returns
// the number of packets sent.
func settlePkts(a, b *cli.Endpoint) uint64 {
	deadline := time.Now().Add(50 * time.Millisecond)
	for {
		sa, sb := a.Link.Stats(), b.Link.Stats()
		if (sa.SentPkts == sb.RcvdPkts+sb.DropBadICRC+sb.DropMalformed+sb.DropOther &&
			sb.SentPkts == sa.RcvdPkts+sa.DropBadICRC+sa.DropMalformed+sa.DropOther) || time.Now().After(deadline) {
			return sa.SentPkts + sb.SentPkts
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// runDemoCase posts count work requests of one operation from A to B (all
// outstanding at once), waits for every completion and checks the result.
// Its memory stays registered until the endpoints are closed.
func runDemoCase(ctx context.Context, a, b *cli.Endpoint, dc demoCase) demoResult {
	r := demoResult{demoCase: dc}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	atomic := dc.op == transport.WRCompareSwap || dc.op == transport.WRFetchAdd
	span := max(dc.size, 1)
	if atomic {
		span = 8
	}
	total := span * dc.count
	src, srcMR, err := a.Alloc(total, memreg.AccessLocalWrite)
	if err != nil {
		r.err = err
		return r
	}
	dst, dstMR, err := b.Alloc(total, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
	if err != nil {
		r.err = err
		return r
	}
	rng := rand.New(rand.NewPCG(uint64(dc.op)<<32|uint64(dc.size), 0x6465))
	// READ moves B's memory to A; everything else A's to B.
	from, to := src, dst
	if dc.op == transport.WRRead {
		from, to = dst, src
	}
	for i := range from {
		from[i] = byte(rng.Uint32())
	}
	for i := range to {
		to[i] = 0xee
	}
	needRecv := dc.op == transport.WRSend || dc.op == transport.WRSendImm || dc.op == transport.WRWriteImm
	if needRecv {
		for i := 0; i < dc.count; i++ {
			wr := transport.RecvWR{WRID: uint64(i)}
			if dc.op != transport.WRWriteImm && dc.size > 0 {
				wr.SGEs = []memreg.SGE{{Addr: dstMR.IOVA() + uint64(i*span), Length: uint32(dc.size), LKey: dstMR.LKey()}}
			}
			if err := b.QP.PostRecv(wr); err != nil {
				r.err = fmt.Errorf("post receive %d: %w", i, err)
				return r
			}
		}
	}
	// Atomics: a chain on one 8-byte word whose every step is predictable.
	var word uint64
	var wantOrig []uint64
	if atomic {
		word = rng.Uint64()
		binary.NativeEndian.PutUint64(dst[0:8], word)
	}
	wrs := make([]transport.SendWR, dc.count)
	cur := word
	for i := range wrs {
		wr := transport.SendWR{WRID: uint64(i), Opcode: dc.op, Flags: transport.SendSignaled,
			RemoteAddr: dstMR.IOVA() + uint64(i*span), RKey: dstMR.RKey(), Imm: 0x1000 + uint32(i)}
		if dc.size > 0 || atomic {
			wr.SGEs = []memreg.SGE{{Addr: srcMR.IOVA() + uint64(i*span), Length: uint32(dc.size), LKey: srcMR.LKey()}}
		}
		switch dc.op {
		case transport.WRCompareSwap:
			wr.RemoteAddr = dstMR.IOVA()
			next := rng.Uint64()
			wr.Swap = next
			wantOrig = append(wantOrig, cur)
			if i%4 == 3 {
				// A compare that fails: memory stays, the original comes back.
				wr.CompareAdd = cur ^ 1
			} else {
				wr.CompareAdd = cur
				cur = next
			}
		case transport.WRFetchAdd:
			wr.RemoteAddr = dstMR.IOVA()
			add := rng.Uint64() >> 8
			wr.CompareAdd = add
			wantOrig = append(wantOrig, cur)
			cur += add
		}
		wrs[i] = wr
	}
	pkts0 := sentPkts(a, b)
	start := time.Now()
	if err := a.QP.PostSend(wrs...); err != nil {
		r.err = fmt.Errorf("post send: %w", err)
		return r
	}
	sendWCs, err := demoWait(ctx, a.SCQ, dc.count)
	if err == nil && needRecv {
		var recvWCs []transport.WC
		recvWCs, err = demoWait(ctx, b.RCQ, dc.count)
		if err == nil {
			err = checkRecvWCs(recvWCs, dc, a.QP.QPN(), b.QP.QPN())
		}
	}
	r.elapsed = time.Since(start)
	r.packets = settlePkts(a, b) - pkts0
	if err != nil {
		r.err = err
		return r
	}
	wantOp := map[transport.WROpcode]transport.WCOpcode{transport.WRSend: transport.WCSend, transport.WRSendImm: transport.WCSend,
		transport.WRWrite: transport.WCRDMAWrite, transport.WRWriteImm: transport.WCRDMAWrite, transport.WRRead: transport.WCRDMARead,
		transport.WRCompareSwap: transport.WCCompSwap, transport.WRFetchAdd: transport.WCFetchAdd}[dc.op]
	for i, wc := range sendWCs {
		if wc.Status != transport.WCSuccess {
			r.err = fmt.Errorf("completion %d: status %q (%d)", i, wc.Status, uint8(wc.Status))
			return r
		}
		if wc.WRID != uint64(i) || wc.Opcode != wantOp {
			r.err = fmt.Errorf("completion %d: wr_id %d opcode %v, want wr_id %d opcode %v", i, wc.WRID, wc.Opcode, i, wantOp)
			return r
		}
	}
	if atomic {
		for i, want := range wantOrig {
			if got := binary.NativeEndian.Uint64(src[i*8:]); got != want {
				r.err = fmt.Errorf("atomic %d returned 0x%016x, want 0x%016x", i, got, want)
				return r
			}
		}
		if got := binary.NativeEndian.Uint64(dst[0:8]); got != cur {
			r.err = fmt.Errorf("target memory 0x%016x after %d atomics, want 0x%016x", got, dc.count, cur)
			return r
		}
		r.bytes = int64(8 * dc.count)
		return r
	}
	if dc.op == transport.WRWriteImm || dc.op == transport.WRWrite || dc.op == transport.WRRead || dc.op == transport.WRSend || dc.op == transport.WRSendImm {
		for i := 0; i < dc.count; i++ {
			lo, hi := i*span, i*span+dc.size
			if !bytes.Equal(from[lo:hi], to[lo:hi]) {
				r.err = fmt.Errorf("message %d: data differs at byte %d", i, firstDiff(from[lo:hi], to[lo:hi]))
				return r
			}
			// Nothing may be written past the message.
			for j := hi; j < (i+1)*span; j++ {
				if to[j] != 0xee {
					r.err = fmt.Errorf("message %d: byte %d past the end was written", i, j-lo)
					return r
				}
			}
		}
	}
	r.bytes = int64(dc.size * dc.count)
	return r
}

// checkRecvWCs checks the receive completions of SENDs and WRITEs with
// immediate.
func checkRecvWCs(wcs []transport.WC, dc demoCase, srcQP, qpn uint32) error {
	for i, wc := range wcs {
		if wc.Status != transport.WCSuccess {
			return fmt.Errorf("receive completion %d: status %q (%d)", i, wc.Status, uint8(wc.Status))
		}
		var problems []string
		if wc.WRID != uint64(i) {
			problems = append(problems, fmt.Sprintf("wr_id %d", wc.WRID))
		}
		if wc.ByteLen != uint32(dc.size) {
			problems = append(problems, fmt.Sprintf("byte_len %d", wc.ByteLen))
		}
		if wc.SrcQP != srcQP || wc.QPN != qpn {
			problems = append(problems, fmt.Sprintf("qp 0x%x src_qp 0x%x", wc.QPN, wc.SrcQP))
		}
		switch dc.op {
		case transport.WRSend:
			if wc.Opcode != transport.WCRecv || wc.Flags&transport.WCWithImm != 0 {
				problems = append(problems, fmt.Sprintf("opcode %v flags %#x", wc.Opcode, wc.Flags))
			}
		case transport.WRSendImm, transport.WRWriteImm:
			want := transport.WCRecv
			if dc.op == transport.WRWriteImm {
				want = transport.WCRecvRDMAImm
			}
			if wc.Opcode != want || wc.Flags&transport.WCWithImm == 0 || wc.Imm != 0x1000+uint32(i) {
				problems = append(problems, fmt.Sprintf("opcode %v flags %#x imm %#x", wc.Opcode, wc.Flags, wc.Imm))
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("receive completion %d: %s", i, strings.Join(problems, ", "))
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// demoWait collects n completions from cq.
func demoWait(ctx context.Context, cq *transport.CQ, n int) ([]transport.WC, error) {
	out := make([]transport.WC, 0, n)
	buf := make([]transport.WC, 64)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf)
		if err != nil {
			return out, fmt.Errorf("waiting for completion %d of %d: %w", len(out)+1, n, err)
		}
		out = append(out, buf[:k]...)
	}
	return out, nil
}
