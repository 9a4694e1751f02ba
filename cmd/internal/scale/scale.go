package scale

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/cpudist"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

func init() {
	commands.Register("scale", "many RC QP pairs between two devices: setup rate, memory per idle QP, goroutines, goodput against one QP", scaleUsage, runScale)
}

const scaleUsage = `usage: rocev2d scale [options]

For each QP count N, two fresh devices — by default on 127.0.0.1 and
127.0.0.2, kernel UDP sockets on port 4791 — get N connected RC QP pairs,
and one table row says:

  QPs         N
  B/idle QP   heap growth per QP while the N pairs were created and
              connected (both devices' QPs counted; GC'd before and after)
  goroutines  goroutines of the whole process once the pairs are up
  setup/s     pairs created and connected per second (CreateQP twice,
              Connect twice)
  MB/s        aggregate goodput of 64 KiB RDMA WRITEs posted round-robin
              over the N QPs, --window of them in flight in all
  1 QP MB/s   the goodput of the first QP alone, on the same devices
  ratio       N QPs against 1 QP: the median over --rounds pairs of
              alternating chunks (one QP, then N QPs, --chunk WRITEs
              each), so that load from elsewhere spoils a pair, not the
              figure; one pair before them warms up unmeasured. A median
              of a few rounds (--rounds 1 or 2) is as noisy as a pair:
              even 1 QP against itself may read 0.8 or 1.3
  min         the lowest of those pairs' ratios

With --active every one of the N QPs has WRITEs outstanding at once
(--depth each) for --duration, against one QP alone with --window
WRITEs outstanding for as long, in --rounds alternating phases (one QP,
N QPs, one QP, ..., one QP); the table then says, per N:

  QPs         N
  MB/s        aggregate goodput of the N QPs (all rounds)
  1 QP MB/s   goodput of the one QP (all rounds)
  ratio       median over the rounds of N QPs / 1 QP, a round's one QP
              being the mean of the one-QP phases before and after it
  min         the lowest round's ratio (the figure "in every run")
  jain        Jain's fairness index of the bytes each QP moved over
              the N-QP rounds, (sum x)^2 / (N sum x^2): 1 when every QP
              moved the same, 1/N when one moved everything
  min/max     the least bytes one QP moved over the most

and a line below it gives every round's ratio in order and the
process's CPU time per MB moved over the N-QP and the one-QP phases
(getrusage; both devices are in this process; "n/a" with the reason
where a side moved nothing or no CPU time was measured). Then one line
per round splits its ratio: each side's cores (CPU time over wall time:
the share of the machine it got) and CPU time per MB (what its bytes
cost), the one-QP side being the phases before and after it together,
so that the ratio is about (cores N / cores 1) x (ms per MB 1 / ms per
MB N): a round is low either because its N-QP phase got less of the
machine than the one-QP phases around it (load from elsewhere) or
because its bytes cost more CPU. Each side's context switches per MB
(voluntary: a thread waited; involuntary: it was preempted) and the
garbage collections and heap objects allocated during the round's three
phases follow.

Around every round the first two CPUs time a cache line passed back and
forth (before, between and after its two runs). When some rounds had a
sample at twice the fastest or more — the CPUs were apart, as a VM's
host may put them for seconds, and every copy between the two devices
cost more — a line below the row gives those rounds' ratios and the
lowest ratio of the others.

Before the measurement every QP sends one 64-byte WRITE (its first
traffic). The round-robin carries on from chunk to chunk, so every QP is
used when the chunks hold as many WRITEs as there are QPs.

options:
  --qps=LIST      QP counts (default 1,10,100,1000,10000)
  --rounds=N      alternating chunk pairs per QP count (default 16; fewer
                  than 5 make a noisy ratio)
  --chunk=N       WRITEs per chunk (default 512)
  --size=BYTES    WRITE size (default 65536)
  --window=N      WRITEs in flight over all QPs (default 8); with
                  --active, the one QP's
  --active        keep every QP busy at once (see above)
  --depth=N       with --active, WRITEs outstanding per QP (default 1)
  --workers=N     with --active, N goroutines each with its own CQ post
                  and complete the WRITEs, QP i on goroutine i mod N
                  (default 1), as a program serving its connections
                  from several goroutines does
  --own-mr        with --active, every QP pair has its own --size source
                  and destination regions (default: one of each per
                  device), so that N QPs move N regions' bytes through
                  the caches, not one's; N x 2 x --size bytes of memory
  --duration=DUR  with --active, the length of one side of a round
                  (default 300ms)
  --mem           run over the in-memory network instead of UDP sockets
  --a=IP          address of the first device (default 127.0.0.1)
  --b=IP          address of the second device (default 127.0.0.2)
  -m, --mtu=MTU   path MTU (default 4096)
  --timeout=DUR   give up after DUR (default 10m)
  -v              print both devices' counters after each row
` + cli.SocketUsage

// scaleConfig holds the parsed flags of rocev2d scale.
type scaleConfig struct {
	cli.PairOptions
	qps     []int
	rounds  int
	chunk   int
	size    int
	window  int
	mem     bool
	timeout time.Duration
	// --active: every QP busy at once
	active   bool
	depth    int
	duration time.Duration
	workers  int  // goroutines (and CQs) of the --active runs
	ownMR    bool // a source and a destination region per QP pair
}

func parseScaleFlags(args []string) (*scaleConfig, error) {
	c := &scaleConfig{}
	fs := cli.NewFlagSet("rocev2d scale")
	qps := "1,10,100,1000,10000"
	fs.StringVar(&qps, "qps", qps, "")
	fs.IntVar(&c.rounds, "rounds", 16, "")
	fs.IntVar(&c.chunk, "chunk", 512, "")
	fs.IntVar(&c.size, "size", 1<<16, "")
	fs.IntVar(&c.window, "window", 8, "")
	fs.BoolVar(&c.mem, "mem", false, "")
	fs.BoolVar(&c.active, "active", false, "")
	fs.IntVar(&c.depth, "depth", 1, "")
	fs.DurationVar(&c.duration, "duration", 300*time.Millisecond, "")
	fs.IntVar(&c.workers, "workers", 1, "")
	fs.BoolVar(&c.ownMR, "own-mr", false, "")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "")
	if err := cli.ParsePairFlags(fs, args, &c.PairOptions, 4096); err != nil {
		return nil, err
	}
	if c.A == c.B {
		return nil, fmt.Errorf("--a and --b are both %v; the two devices need different addresses", c.A)
	}
	for _, f := range strings.Split(qps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1<<20 {
			return nil, fmt.Errorf("--qps %q: want a comma-separated list of counts 1..%d", qps, 1<<20)
		}
		c.qps = append(c.qps, n)
	}
	switch {
	case c.rounds < 1 || c.rounds > 1<<16:
		return nil, fmt.Errorf("--rounds %d: want 1..%d", c.rounds, 1<<16)
	case c.chunk < 1 || c.chunk > 1<<24:
		return nil, fmt.Errorf("--chunk %d: want 1..%d", c.chunk, 1<<24)
	case c.size < 1 || c.size > 1<<30:
		return nil, fmt.Errorf("--size %d: want 1..%d", c.size, 1<<30)
	case c.window < 1 || c.window > 1<<12:
		return nil, fmt.Errorf("--window %d: want 1..%d", c.window, 1<<12)
	case c.timeout <= 0:
		return nil, fmt.Errorf("--timeout %v: want a positive duration", c.timeout)
	case c.depth < 1 || c.depth > 64:
		return nil, fmt.Errorf("--depth %d: want 1..64", c.depth)
	case c.duration <= 0 || c.duration > time.Hour:
		return nil, fmt.Errorf("--duration %v: want a positive duration up to 1h", c.duration)
	case c.workers < 1 || c.workers > 1024:
		return nil, fmt.Errorf("--workers %d: want 1..1024", c.workers)
	}
	if !c.active {
		var only string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "depth" || f.Name == "duration" || f.Name == "workers" || f.Name == "own-mr" {
				only = f.Name
			}
		})
		if only != "" {
			return nil, fmt.Errorf("--%s applies to --active runs only", only)
		}
	}
	return c, nil
}

func runScale(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseScaleFlags(args)
	if code, done := cli.FlagsResult("scale", scaleUsage, err, stdout, stderr); done {
		return code
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("--timeout %v reached", c.timeout))
	defer cancel()
	link := "UDP sockets"
	if c.mem {
		link = "in-memory network"
	}
	if c.active {
		regions := "one region per device"
		if c.ownMR {
			regions = "regions of their own per QP"
		}
		fmt.Fprintf(stdout, "rocev2d scale --active: %v <-> %v over %s, MTU %d, %d-byte WRITEs, %d per QP outstanding (one QP alone: %d), %d x %v per side of the ratio, %d goroutine(s) with a CQ each, %s\n",
			c.A, c.B, link, c.MTU.Bytes(), c.size, c.depth, c.window, c.rounds, c.duration, c.workers, regions)
		const rowFmt = "%7s %8s %10s %6s %6s %6s %8s\n"
		fmt.Fprintf(stdout, rowFmt, "QPs", "MB/s", "1 QP MB/s", "ratio", "min", "jain", "min/max")
		for _, n := range c.qps {
			row, err := scaleRow(ctx, c, n, stdout)
			if err != nil {
				fmt.Fprintf(stderr, "rocev2d scale: %d QPs: %v\n", n, cli.CtxErr(ctx, err))
				return cli.ExitFail
			}
			fmt.Fprintf(stdout, rowFmt, strconv.Itoa(n), formatMBs(row.mbs), formatMBs(row.mbs1), fmt.Sprintf("%.2f", row.ratio),
				fmt.Sprintf("%.2f", row.minRatio), fmt.Sprintf("%.3f", row.jain), fmt.Sprintf("%.2f", row.minMax))
			printActiveRounds(stdout, n, row)
			printRoundCores(stdout, row)
		}
		return cli.ExitOK
	}
	fmt.Fprintf(stdout, "rocev2d scale: %v <-> %v over %s, MTU %d, %d-byte WRITEs, %d in flight, %d x %d WRITEs per side of the ratio\n",
		c.A, c.B, link, c.MTU.Bytes(), c.size, c.window, c.rounds, c.chunk)
	// Fixed widths: a row is printed as soon as it is measured.
	const rowFmt = "%7s %10s %10s %9s %8s %10s %6s %6s\n"
	fmt.Fprintf(stdout, rowFmt, "QPs", "B/idle QP", "goroutines", "setup/s", "MB/s", "1 QP MB/s", "ratio", "min")
	for _, n := range c.qps {
		row, err := scaleRow(ctx, c, n, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d scale: %d QPs: %v\n", n, cli.CtxErr(ctx, err))
			return cli.ExitFail
		}
		fmt.Fprintf(stdout, rowFmt, strconv.Itoa(n), fmt.Sprintf("%.0f", row.bytesPerQP), strconv.Itoa(row.goroutines),
			fmt.Sprintf("%.0f", row.setupRate), formatMBs(row.mbs), formatMBs(row.mbs1), fmt.Sprintf("%.2f", row.ratio),
			fmt.Sprintf("%.2f", row.minRatio))
		printRoundCores(stdout, row)
	}
	return cli.ExitOK
}

// printActiveRounds prints, below an --active row, every round's ratio in
// order and the CPU time per MB of each side, then one line per round
// that splits its ratio into the share of the CPU each side got and what
// each side's bytes cost: a round's ratio is, up to the averaging of the
// one-QP phases around it, (cores N / cores 1) x (ms per MB 1 / ms per MB
// N), so a low round shows whether its N-QP phase got less of the
// machine (load from elsewhere) or spent more CPU per byte (the stack).
func printActiveRounds(w io.Writer, n int, row scaleResult) {
	r := make([]string, len(row.roundRatios))
	for i, v := range row.roundRatios {
		r[i] = fmt.Sprintf("%.2f", v)
	}
	fmt.Fprintf(w, "  rounds %s", strings.Join(r, " "))
	if row.cpuMeasured {
		fmt.Fprintf(w, "; CPU per MB: %d QPs %s, 1 QP %s", n, formatCPUPerMB(row.cpuN, row.bytesN), formatCPUPerMB(row.cpu1, row.bytes1))
	}
	fmt.Fprintln(w)
	if !row.cpuMeasured {
		return
	}
	for i, rd := range row.rounds {
		if i >= len(row.roundRatios) {
			break
		}
		fmt.Fprintf(w, "  round %d: %.2f; %d QPs %s, 1 QP %s; GCs %d, heap objects allocated %d\n",
			i+1, row.roundRatios[i], n, rd.n.costString(), rd.one.costString(), rd.n.gcs+rd.one.gcs, rd.n.allocs+rd.one.allocs)
	}
}

// formatCPUPerMB formats cpu over the MB moved: "n/a" with the reason
// when nothing moved (cpu/0 printed as +Inf) or no CPU time was measured.
func formatCPUPerMB(cpu time.Duration, bytes float64) string {
	switch {
	case bytes <= 0:
		return "n/a (moved nothing)"
	case cpu <= 0:
		return "n/a (no CPU time measured)"
	}
	return fmt.Sprintf("%.3f ms", cpu.Seconds()*1e3/(bytes/1e6))
}

// printRoundCores prints, below a row, the CPU distance sampled around
// its rounds (cpudist) when some round had a sample at twice the fastest
// or more: the rounds run with the CPUs apart (in a VM, where the host
// put them), their ratios, and the lowest ratio of the other rounds —
// "min" is often one of the former. Nothing is printed when every round
// ran with the CPUs close, or where they cannot be sampled.
func printRoundCores(w io.Writer, row scaleResult) {
	var all cpudist.Watch
	for _, cw := range row.roundCores {
		all.Merge(cw)
	}
	var apart []string
	closeMin := -1.0
	for i, cw := range row.roundCores {
		if i >= len(row.roundRatios) {
			break
		}
		r := row.roundRatios[i]
		if cw.Apart(all.Min) {
			apart = append(apart, fmt.Sprintf("%.2f", r))
		} else if closeMin < 0 || r < closeMin {
			closeMin = r
		}
	}
	if len(apart) == 0 {
		return
	}
	fmt.Fprintf(w, "  CPU distance %d-%d ns: %d of %d rounds ran with the CPUs apart (a sample at twice the fastest or more), ratios %s",
		all.Min.Nanoseconds(), all.Max.Nanoseconds(), len(apart), len(row.roundRatios), strings.Join(apart, " "))
	if closeMin >= 0 {
		fmt.Fprintf(w, "; lowest with them close %.2f", closeMin)
	}
	fmt.Fprintln(w)
}

// scaleResult is one row of the table.
type scaleResult struct {
	bytesPerQP float64
	goroutines int
	setupRate  float64 // pairs/s
	mbs, mbs1  float64 // goodput over N QPs, over one
	ratio      float64 // median of the paired chunks' goodput ratios
	minRatio   float64 // the lowest of them
	jain       float64 // --active: Jain's index of the bytes per QP
	minMax     float64 // --active: least over most bytes of one QP
	// --active: the process's CPU time over the N-QP phases and over the
	// one-QP phases, and the bytes they moved (cpuMeasured: getrusage
	// answered; see formatCPUPerMB).
	cpuN, cpu1     time.Duration
	bytesN, bytes1 float64
	cpuMeasured    bool
	rounds         []activeRound // --active: each round's phases
	// roundRatios are the rounds' ratios (N QPs / 1 QP) and roundCores
	// the CPU distance sampled before, between and after each round's
	// two runs (cpudist), in round order.
	roundRatios []float64
	roundCores  []cpudist.Watch
}

// scaleLinks opens the two links of a row.
func scaleLinks(c *scaleConfig) (udp.Link, udp.Link, error) {
	if c.mem {
		n := memnet.NewMemNetwork(memnet.Faults{})
		la, err := n.Link(c.A)
		if err != nil {
			return nil, nil, err
		}
		lb, err := n.Link(c.B)
		if err != nil {
			la.Close()
			return nil, nil, err
		}
		return la, lb, nil
	}
	o := c.Sock.Options(false, 0)
	la, err := udp.ListenSocket(c.A, &o)
	if err != nil {
		return nil, nil, err
	}
	lb, err := udp.ListenSocket(c.B, &o)
	if err != nil {
		la.Close()
		return nil, nil, err
	}
	return la, lb, nil
}

// scaleSide is one device of a row with its QPs.
type scaleSide struct {
	dev *transport.Device
	pd  *memreg.PD
	cq  *transport.CQ   // cqs[0]
	cqs []*transport.CQ // --workers: QP i completes on cqs[i%len(cqs)]
	mr  *memreg.MR
	mrs []*memreg.MR // --own-mr: QP i's region, else nil
	qps []*transport.QP
}

// qpMR returns QP i's region.
func (s *scaleSide) qpMR(i int) *memreg.MR {
	if s.mrs != nil {
		return s.mrs[i]
	}
	return s.mr
}

func newScaleSide(l udp.Link, c *scaleConfig, n int, access memreg.Access) (*scaleSide, error) {
	dev, err := transport.NewDevice(l, transport.DeviceConfig{MaxQP: n + 16, Congestion: c.Sock.CC.Config()})
	if err != nil {
		l.Close()
		return nil, err
	}
	s := &scaleSide{dev: dev, qps: make([]*transport.QP, 0, n)}
	if s.pd, err = dev.AllocPD(); err != nil {
		return s, err
	}
	depth := 4*c.window + 16
	workers := 1
	if c.active {
		workers = c.workers
		depth = max(depth, (n+workers-1)/workers*c.depth+16)
	}
	for range workers {
		cq, err := dev.CreateCQ(depth)
		if err != nil {
			return s, err
		}
		s.cqs = append(s.cqs, cq)
	}
	s.cq = s.cqs[0]
	if s.mr, err = s.pd.RegisterMR(make([]byte, c.size), memreg.AccessLocalWrite|access); err != nil {
		return s, err
	}
	return s, nil
}

// scaleRow sets up n pairs on fresh devices and measures them.
func scaleRow(ctx context.Context, c *scaleConfig, n int, stdout io.Writer) (scaleResult, error) {
	var res scaleResult
	la, lb, err := scaleLinks(c)
	if err != nil {
		return res, err
	}
	a, err := newScaleSide(la, c, n, 0)
	if a != nil {
		defer a.dev.Close()
	}
	if err != nil {
		lb.Close()
		return res, err
	}
	b, err := newScaleSide(lb, c, n, memreg.AccessRemoteWrite)
	if b != nil {
		defer b.dev.Close()
	}
	if err != nil {
		return res, err
	}
	h0 := settledHeap()
	start := time.Now()
	for i := range n {
		if i%256 == 0 && ctx.Err() != nil {
			return res, fmt.Errorf("setting up pair %d: %w", i, context.Cause(ctx))
		}
		cq := a.cqs[i%len(a.cqs)]
		qa, err := a.dev.CreateQP(a.pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: max(2*c.window, c.depth), MaxRecvWR: 1})
		if err != nil {
			return res, err
		}
		qb, err := b.dev.CreateQP(b.pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: b.cq, RecvCQ: b.cq, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			return res, err
		}
		if err := qa.Connect(transport.ConnParams{Peer: b.dev.Addr(), DestQPN: qb.QPN(), PathMTU: c.MTU}); err != nil {
			return res, err
		}
		if err := qb.Connect(transport.ConnParams{Peer: a.dev.Addr(), DestQPN: qa.QPN(), PathMTU: c.MTU, Access: memreg.AccessRemoteWrite}); err != nil {
			return res, err
		}
		a.qps = append(a.qps, qa)
		b.qps = append(b.qps, qb)
		if c.active && c.ownMR {
			ma, err := a.pd.RegisterMR(make([]byte, c.size), memreg.AccessLocalWrite)
			if err != nil {
				return res, err
			}
			mb, err := b.pd.RegisterMR(make([]byte, c.size), memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
			if err != nil {
				return res, err
			}
			a.mrs = append(a.mrs, ma)
			b.mrs = append(b.mrs, mb)
		}
	}
	res.setupRate = float64(n) / time.Since(start).Seconds()
	res.bytesPerQP = float64(settledHeap()-h0) / float64(2*n)
	res.goroutines = runtime.NumGoroutine()

	w := &scaleWriter{c: c, a: a, b: b, dst: b.mr}
	if len(a.cqs) == 1 {
		// With several CQs the first unmeasured --active phases are
		// every QP's first traffic.
		if _, err := w.run(ctx, n, n, min(64, c.size)); err != nil {
			return res, fmt.Errorf("first WRITE on every QP: %w", err)
		}
	}
	if c.active {
		res, err := w.activeRounds(ctx, n, res)
		if err == nil && c.Verbose {
			a.dev.Close()
			b.dev.Close()
			cli.PrintCounters(stdout, fmt.Sprintf("%v (%d QPs)", a.dev.Addr(), n), a.dev)
			cli.PrintCounters(stdout, fmt.Sprintf("%v (%d QPs)", b.dev.Addr(), n), b.dev)
		}
		return res, err
	}
	// One pair of chunks warms both sides up unmeasured: the first chunk
	// of full-size WRITEs met cold buffers and pools and took up to twice
	// as long, which a median of few rounds took for the ratio.
	if _, err := w.run(ctx, 1, c.chunk, c.size); err != nil {
		return res, fmt.Errorf("one QP, warming up: %w", err)
	}
	if _, err := w.run(ctx, n, c.chunk, c.size); err != nil {
		return res, fmt.Errorf("%d QPs, warming up: %w", n, err)
	}
	var t1, tn time.Duration
	ratios := make([]float64, 0, c.rounds)
	for range c.rounds {
		var cw cpudist.Watch
		cw.Sample()
		d1, err := w.run(ctx, 1, c.chunk, c.size)
		if err != nil {
			return res, fmt.Errorf("one QP: %w", err)
		}
		cw.Sample()
		dn, err := w.run(ctx, n, c.chunk, c.size)
		if err != nil {
			return res, fmt.Errorf("%d QPs: %w", n, err)
		}
		cw.Sample()
		t1 += d1
		tn += dn
		ratios = append(ratios, d1.Seconds()/dn.Seconds())
		res.roundCores = append(res.roundCores, cw)
	}
	res.roundRatios = ratios
	bytes := float64(c.rounds) * float64(c.chunk) * float64(c.size)
	res.mbs = bytes / tn.Seconds() / 1e6
	res.mbs1 = bytes / t1.Seconds() / 1e6
	res.ratio, res.minRatio = ratioStats(ratios)
	if c.Verbose {
		a.dev.Close()
		b.dev.Close()
		cli.PrintCounters(stdout, fmt.Sprintf("%v (%d QPs)", a.dev.Addr(), n), a.dev)
		cli.PrintCounters(stdout, fmt.Sprintf("%v (%d QPs)", b.dev.Addr(), n), b.dev)
	}
	return res, nil
}

// ratioStats returns the median and the lowest of the rounds' ratios,
// leaving ratios in round order: it is roundRatios, which printRoundCores
// pairs with roundCores by index (median sorted it in place, so the
// ratios it named for the rounds with the CPUs apart were the sorted
// list's, not those rounds').
func ratioStats(ratios []float64) (med, lo float64) {
	return median(slices.Clone(ratios)), slices.Min(ratios)
}

// median returns the median of x (not empty), the mean of the middle two
// when there is an even number; it sorts x.
func median(x []float64) float64 {
	slices.Sort(x)
	m := len(x) / 2
	if len(x)%2 == 0 {
		return (x[m-1] + x[m]) / 2
	}
	return x[m]
}

// formatMBs formats a goodput in MB/s with three significant digits at
// most, and no fewer than two below 100 (a 1-byte WRITE moves well under
// 1 MB/s, which %.0f printed as 0).
func formatMBs(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}

// settledHeap returns the live heap after two collections: the second
// frees what sync.Pools (the devices' packet buffers) only dropped into
// their victim caches in the first, so that a row does not count the
// previous row's buffers.
func settledHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// scaleWriter posts WRITEs round-robin over a side's QPs.
type scaleWriter struct {
	c    *scaleConfig
	a, b *scaleSide
	dst  *memreg.MR
	next int // where the round-robin over more than one QP goes on
	wcs  []transport.WC
	wrs  []transport.SendWR // --active: QP i's WRITE (runActive)
}

// run posts writes WRITEs of size bytes round-robin over the first nq
// QPs, c.window in flight, and returns how long they took.
func (w *scaleWriter) run(ctx context.Context, nq, writes, size int) (time.Duration, error) {
	if w.wcs == nil {
		w.wcs = make([]transport.WC, 4*w.c.window)
	}
	wr := transport.SendWR{Opcode: transport.WRWrite, Flags: transport.SendSignaled,
		SGEs:       []memreg.SGE{w.a.mr.SGE(0, uint32(size))},
		RemoteAddr: w.dst.IOVA(), RKey: w.dst.RKey()}
	next := 0
	if nq > 1 {
		next = w.next % nq
	}
	posted, done := 0, 0
	post := func() error {
		if err := w.a.qps[next].PostSend(wr); err != nil {
			return err
		}
		if next++; next == nq {
			next = 0
		}
		posted++
		return nil
	}
	start := time.Now()
	for posted < writes && posted < w.c.window {
		if err := post(); err != nil {
			return 0, err
		}
	}
	for done < writes {
		k, err := w.a.cq.Wait(ctx, w.wcs)
		if err != nil {
			return 0, fmt.Errorf("%d of %d WRITEs done: %w", done, writes, err)
		}
		for _, wc := range w.wcs[:k] {
			if wc.Status != transport.WCSuccess {
				return 0, fmt.Errorf("WRITE on QP %#x: %v", wc.QPN, wc.Status)
			}
			done++
			if posted < writes {
				if err := post(); err != nil {
					return 0, err
				}
			}
		}
	}
	if nq > 1 {
		w.next = next
	}
	return time.Since(start), nil
}

// activeRounds is scaleRow's measurement with --active: rounds of one QP
// alone (c.window WRITEs outstanding) against all n QPs busy at once
// (c.depth each), c.duration each, after one unmeasured pair.
func (w *scaleWriter) activeRounds(ctx context.Context, n int, res scaleResult) (scaleResult, error) {
	c := w.c
	perQP := make([]uint64, n)
	if _, err := w.runActive(ctx, 1, c.window, nil); err != nil {
		return res, fmt.Errorf("one QP, warming up: %w", err)
	}
	if _, err := w.runActive(ctx, n, c.depth, nil); err != nil {
		return res, fmt.Errorf("%d QPs, warming up: %w", n, err)
	}
	var t1, tn float64
	res.cpuMeasured = true
	ratios := make([]float64, 0, c.rounds)
	one := func() (activeRun, error) {
		r1, err := w.runActive(ctx, 1, c.window, nil)
		if err != nil {
			return r1, fmt.Errorf("one QP: %w", err)
		}
		res.bytes1, t1, res.cpu1 = res.bytes1+r1.bytes, t1+r1.d.Seconds(), res.cpu1+r1.cpu
		res.cpuMeasured = res.cpuMeasured && r1.cpuOK
		return r1, nil
	}
	before, err := one()
	if err != nil {
		return res, err
	}
	for range c.rounds {
		var cw cpudist.Watch
		cw.Sample()
		rn, err := w.runActive(ctx, n, c.depth, perQP)
		if err != nil {
			return res, fmt.Errorf("%d QPs: %w", n, err)
		}
		cw.Sample()
		after, err := one()
		if err != nil {
			return res, err
		}
		cw.Sample()
		res.bytesN, tn, res.cpuN = res.bytesN+rn.bytes, tn+rn.d.Seconds(), res.cpuN+rn.cpu
		res.cpuMeasured = res.cpuMeasured && rn.cpuOK
		ratios = append(ratios, roundRatio(rn, before, after))
		res.rounds = append(res.rounds, activeRound{n: rn, one: before.plus(after)})
		res.roundCores = append(res.roundCores, cw)
		before = after
	}
	res.roundRatios = ratios
	res.mbs, res.mbs1 = res.bytesN/tn/1e6, res.bytes1/t1/1e6
	res.ratio, res.minRatio = ratioStats(ratios)
	res.jain, res.minMax = fairness(perQP)
	return res, nil
}

// roundRatio is a round's ratio: the N-QP phase's goodput over the mean
// of the one-QP phases before and after it.
func roundRatio(n, before, after activeRun) float64 {
	return n.rate() / ((before.rate() + after.rate()) / 2)
}

// activeRun is one side of an --active round: bytes moved in d, using
// cpu of the process's CPU time (cpuOK: measured), while the process's
// threads were switched out vol times waiting and invol times preempted
// (getrusage), gcs garbage collections ended and allocs heap objects
// were allocated.
type activeRun struct {
	bytes      float64
	d          time.Duration
	cpu        time.Duration
	cpuOK      bool
	vol, invol int64
	gcs        uint64
	allocs     uint64
}

// activeRound is a round's N-QP phase and its one-QP phases before and
// after it, taken together.
type activeRound struct{ n, one activeRun }

func (r activeRun) rate() float64 { return r.bytes / r.d.Seconds() }

// plus returns r and o taken together (their sums).
func (r activeRun) plus(o activeRun) activeRun {
	return activeRun{bytes: r.bytes + o.bytes, d: r.d + o.d, cpu: r.cpu + o.cpu, cpuOK: r.cpuOK && o.cpuOK,
		vol: r.vol + o.vol, invol: r.invol + o.invol, gcs: r.gcs + o.gcs, allocs: r.allocs + o.allocs}
}

// costString says how much of the machine a phase got (cores: CPU time
// over wall time) and what its bytes cost (CPU time per MB).
func (r activeRun) costString() string {
	if !r.cpuOK || r.d <= 0 {
		return "n/a (no CPU time measured)"
	}
	s := fmt.Sprintf("%.2f cores x %s per MB", r.cpu.Seconds()/r.d.Seconds(), formatCPUPerMB(r.cpu, r.bytes))
	if r.bytes > 0 {
		s += fmt.Sprintf(" (%.1f+%.1f context switches per MB)", float64(r.vol)/(r.bytes/1e6), float64(r.invol)/(r.bytes/1e6))
	}
	return s
}

// gcAllocs returns the garbage collections ended and the heap objects
// allocated so far (runtime/metrics: no stop of the world).
func gcAllocs() (gcs, allocs uint64) {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		gcs = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		allocs = s[1].Value.Uint64()
	}
	return gcs, allocs
}

// runActive keeps depth WRITEs outstanding on each of the first nq QPs
// for c.duration (a completed WRITE is reposted on its QP until then),
// waits for the last ones and returns the bytes moved and the time from
// the first post to the last completion. perQP, if not nil, gets each
// QP's completed bytes added. With --workers each goroutine posts to and
// completes the QPs of its own CQ.
func (w *scaleWriter) runActive(ctx context.Context, nq, depth int, perQP []uint64) (activeRun, error) {
	c := w.c
	if w.wrs == nil {
		// Every QP's WRITE, built once: QP i's from its region (--own-mr)
		// to its peer's.
		w.wrs = make([]transport.SendWR, len(w.a.qps))
		for i := range w.wrs {
			dst := w.dst
			if w.b.mrs != nil {
				dst = w.b.mrs[i]
			}
			w.wrs[i] = transport.SendWR{WRID: uint64(i), Opcode: transport.WRWrite, Flags: transport.SendSignaled,
				SGEs:       []memreg.SGE{w.a.qpMR(i).SGE(0, uint32(c.size))},
				RemoteAddr: dst.IOVA(), RKey: dst.RKey()}
		}
	}
	gc0, allocs0 := gcAllocs()
	vol0, invol0, swOK0 := processSwitches()
	cpu0, ok0 := processCPU()
	start := time.Now()
	end := start.Add(c.duration)
	run := func(done uint64) activeRun {
		r := activeRun{bytes: float64(done) * float64(c.size), d: time.Since(start)}
		if cpu1, ok := processCPU(); ok && ok0 {
			r.cpu, r.cpuOK = cpu1-cpu0, true
		}
		if vol1, invol1, ok := processSwitches(); ok && swOK0 {
			r.vol, r.invol = vol1-vol0, invol1-invol0
		}
		gc1, allocs1 := gcAllocs()
		r.gcs, r.allocs = gc1-gc0, allocs1-allocs0
		return r
	}
	nw := min(len(w.a.cqs), nq)
	if nw == 1 {
		done, err := w.activeWorker(ctx, 0, 1, nq, depth, end, perQP)
		return run(done), err
	}
	type result struct {
		done uint64
		err  error
	}
	results := make(chan result, nw)
	for g := range nw {
		go func() {
			done, err := w.activeWorker(ctx, g, nw, nq, depth, end, perQP)
			results <- result{done, err}
		}()
	}
	var done uint64
	var err error
	for range nw {
		r := <-results
		done += r.done
		if err == nil {
			err = r.err
		}
	}
	return run(done), err
}

// activeWorker is runActive's work for the QPs g, g+nw, g+2nw, ... below
// nq, which complete on cqs[g]: it returns the WRITEs completed. The
// workers write to disjoint elements of perQP.
func (w *scaleWriter) activeWorker(ctx context.Context, g, nw, nq, depth int, end time.Time, perQP []uint64) (uint64, error) {
	c := w.c
	cq := w.a.cqs[g]
	wcs := make([]transport.WC, 256)
	wrs := w.wrs
	outstanding := 0
	for d := 0; d < depth; d++ {
		for i := g; i < nq; i += nw {
			if err := w.a.qps[i].PostSend(wrs[i]); err != nil {
				return 0, fmt.Errorf("QP %d: %w", i, err)
			}
			outstanding++
		}
	}
	var done uint64
	closing := false
	for outstanding > 0 {
		k, err := cq.Wait(ctx, wcs)
		if err != nil {
			return done, fmt.Errorf("%d WRITEs outstanding: %w", outstanding, err)
		}
		if !closing && time.Now().After(end) {
			closing = true
		}
		for _, wc := range wcs[:k] {
			if wc.Status != transport.WCSuccess {
				return done, fmt.Errorf("WRITE on QP %#x: %v", wc.QPN, wc.Status)
			}
			done++
			if perQP != nil {
				perQP[wc.WRID] += uint64(c.size)
			}
			if closing {
				outstanding--
				continue
			}
			if err := w.a.qps[wc.WRID].PostSend(wrs[wc.WRID]); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// fairness returns Jain's index of x, (sum x)^2 / (n sum x^2), and the
// least element over the largest (both 0 for an empty or all-zero x).
func fairness(x []uint64) (jain, minMax float64) {
	if len(x) == 0 {
		return 0, 0
	}
	var s, s2 float64
	lo, hi := x[0], x[0]
	for _, v := range x {
		f := float64(v)
		s += f
		s2 += f * f
		lo, hi = min(lo, v), max(hi, v)
	}
	if s2 == 0 || hi == 0 {
		return 0, 0
	}
	return s * s / (float64(len(x)) * s2), float64(lo) / float64(hi)
}
