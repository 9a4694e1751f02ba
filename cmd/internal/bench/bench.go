package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/cpudist"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// Commands is the bench command, for rocev2d's dispatch.
func Commands() []cli.Command {
	return []cli.Command{{Name: "bench", Summary: "raw UDP vs the RoCEv2 stack over loopback: goodput and ping-pong latency, side by side",
		Usage: benchUsage, Run: runBench}}
}

const benchUsage = `usage: rocev2d bench [options]

One run, side by side, over loopback: raw UDP baselines against the RoCEv2
stack (two devices, one RC QP each, UDP sockets on port 4791) for WRITE,
READ and SEND goodput with 64 B, 4 KiB and 64 KiB messages and for
8-byte SEND and WRITE (with immediate) ping-pongs, in two sections:

  sendmmsg   raw UDP: two plain sockets moving the stack's datagram sizes
             with sendmmsg/recvmmsg batches of 64; rocev2 with --gso=false
  GSO+GRO    raw UDP: the same datagrams sent as UDP GSO datagrams
             (UDP_SEGMENT, up to 64 segments, 64 KiB) to a socket with
             UDP_GRO; rocev2 with --gso=true

Without --gso both sections run; --gso=false or --gso=true runs only its
own. The header says which one the rocev2d commands use by default on
this path (GSO unless a NIC segments in hardware).

Goodput counts message bytes delivered; the baselines send each message
as the stack does, in datagrams of at most one path MTU of payload (plus 16
bytes for BTH and ICRC), the sender at most 2048 datagrams (512 of 1 KiB
or more) ahead of the receiver, as the stack's window keeps it. The stack
keeps 512 KiB of messages in flight, at most 256 work requests (64 B: 256,
4 KiB: 128, 64 KiB: 8), READs at most 64: its QPs have max_rd_atomic 64,
as perftest's ib_read_bw takes the device maximum.
READ's baseline is what a READ asks of UDP: one 32-byte request datagram
per message, answered with the message's response datagrams, as many
messages outstanding as the stack keeps READs in flight; the stack's ratio
to the one-way stream of the responses alone is printed below the table. Latency is the round-trip time of one message each
way, averaged over the run, against raw UDP bouncing one datagram the size
of the stack's request with the same wait technique: both block (the raw
sockets in Go's poller, the stack's waiters in CQ.Wait) or, with
--busy-poll=DUR, both poll without blocking for up to DUR first. The ratio
column is stack / raw UDP.

CPU is the user + system time of this whole process (both ends, every
thread, the Go runtime; getrusage RUSAGE_SELF before and after each run)
per MB (10^6 bytes) of message data delivered, or per round trip for the
ping-pong. Kernel work done in softirq context on another task's time
(ksoftirqd) is not in it, for either side.

Around every run (outside its timing) the bench times a cache line passed
back and forth between the first two CPUs, one thread pinned to each, and
prints the range below each table. In a virtual machine that shows where
the host runs the CPUs: rows during which it was twice its fastest or
more are named, since every copy between the two ends costs more then,
for raw UDP and rocev2 alike.

options:
  -t, --time=DUR  duration of each row (default 1s)
  -m, --mtu=MTU   path MTU of the stack and datagram payload size (default 4096)
  --a=IP          first address (default 127.0.0.1)
  --b=IP          second address (default 127.0.0.2)
  -v              print the stack's counters at the end
  --rows=LIST     run only these rows, comma-separated: an operation
                 (write, read, send) with an optional message size
                 (write:64k, read:64k, send:64b, write:4k), or latency
                 for the two ping-pongs (default: every row)
` + cli.SocketUsage

// benchConfig holds the parsed flags of `rocev2d bench`.
type benchConfig struct {
	cli.PairOptions
	dur  time.Duration
	rows *rowSet // nil: every row
}

// rowSet is what --rows selects: goodput rows by operation and message
// size (size 0: every size of the operation) and the latency rows.
type rowSet struct {
	goodput map[rowKey]bool
	latency bool
}

// rowKey names one goodput row; size 0 stands for every size.
type rowKey struct {
	op   transport.WROpcode
	size int
}

// benchOps and benchSizes are the goodput rows' operations and sizes.
var (
	benchOps   = []transport.WROpcode{transport.WRWrite, transport.WRRead, transport.WRSend}
	benchSizes = []int{64, 4096, 65536}
)

// parseRows parses --rows: write, read, send (every size), OP:SIZE with
// SIZE one of 64b, 4k, 64k, and latency.
func parseRows(v string) (*rowSet, error) {
	rs := &rowSet{goodput: map[rowKey]bool{}}
	ops := map[string]transport.WROpcode{"write": transport.WRWrite, "read": transport.WRRead, "send": transport.WRSend}
	sizes := map[string]int{"64b": 64, "64": 64, "4k": 4096, "4kib": 4096, "4096": 4096, "64k": 65536, "64kib": 65536, "65536": 65536}
	for _, f := range strings.Split(v, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "latency" || f == "pingpong" || f == "ping-pong" {
			rs.latency = true
			continue
		}
		name, size, hasSize := strings.Cut(f, ":")
		op, ok := ops[name]
		if !ok {
			return nil, fmt.Errorf("--rows: %q: want write, read, send (optionally :64b, :4k or :64k) or latency", f)
		}
		k := rowKey{op: op}
		if hasSize {
			if k.size, ok = sizes[size]; !ok {
				return nil, fmt.Errorf("--rows: %q: message size %q is not one of the rows' 64b, 4k, 64k", f, size)
			}
		}
		rs.goodput[k] = true
	}
	return rs, nil
}

// goodputRow reports whether the goodput row of op and size runs.
func (c *benchConfig) goodputRow(op transport.WROpcode, size int) bool {
	if c.rows == nil {
		return true
	}
	return c.rows.goodput[rowKey{op, 0}] || c.rows.goodput[rowKey{op, size}]
}

// latencyRows reports whether the ping-pong rows run.
func (c *benchConfig) latencyRows() bool { return c.rows == nil || c.rows.latency }

func parseBenchFlags(args []string) (*benchConfig, error) {
	c := &benchConfig{}
	fs := cli.NewFlagSet("rocev2d bench")
	fs.DurationVar(&c.dur, "t", time.Second, "")
	fs.DurationVar(&c.dur, "time", time.Second, "")
	rows := fs.String("rows", "", "")
	if err := cli.ParsePairFlags(fs, args, &c.PairOptions, 4096); err != nil {
		return nil, err
	}
	if *rows != "" {
		rs, err := parseRows(*rows)
		if err != nil {
			return nil, err
		}
		c.rows = rs
	}
	if c.A == c.B || c.A.Is4() != c.B.Is4() {
		return nil, errors.New("--a and --b must be two different addresses of one IP version")
	}
	if c.dur < 10*time.Millisecond || c.dur > time.Hour {
		return nil, fmt.Errorf("-t %v: duration must be between 10ms and 1h", c.dur)
	}
	return c, nil
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseBenchFlags(args)
	if code, done := cli.FlagsResult("bench", benchUsage, err, stdout, stderr); done {
		return code
	}
	if err := bench(ctx, c, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "rocev2d bench: %v\n", cli.CtxErr(ctx, err))
		return cli.ExitFail
	}
	return cli.ExitOK
}

// benchRow is one line of the table.
type benchRow struct {
	name    string
	size    int
	raw     benchSum // raw UDP
	roc     benchSum // rocev2
	latency bool
	// reqResp: raw is the READ baseline (request and response datagrams,
	// rawReadGoodput); oneWay is the one-way stream of the responses alone.
	reqResp bool
	oneWay  benchSum
	core    cpudist.Watch // the CPUs' distance around the row's runs
}

// benchSum adds up the runs of one side of a row.
type benchSum struct {
	bytes   float64       // message bytes delivered (goodput rows)
	iters   float64       // round trips (latency rows)
	el      time.Duration // time the runs took
	cpu     time.Duration // process CPU time (user + sys) during the runs
	pkts    float64       // datagrams (raw: delivered; rocev2: sent by both links)
	sent    float64       // raw: datagrams sent
	runs    int
	cpuSeen bool // the CPU time could be measured
}

func (b *benchSum) add(r benchRun) {
	b.bytes += r.bytes
	b.iters += r.iters
	b.el += r.el
	b.cpu += r.cpu
	b.pkts += r.pkts
	b.sent += r.sent
	b.runs++
	b.cpuSeen = r.cpuSeen
}

// mbs is the goodput in MB/s (10^6 bytes).
func (b *benchSum) mbs() float64 { return b.bytes / b.el.Seconds() / 1e6 }

// rtt is the mean round-trip time in µs.
func (b *benchSum) rtt() float64 { return float64(b.el.Nanoseconds()) / 1e3 / b.iters }

// pps is datagrams per second.
func (b *benchSum) pps() float64 { return b.pkts / b.el.Seconds() }

// loss is the fraction of the raw datagrams sent that were not received.
func (b *benchSum) loss() float64 {
	if b.sent == 0 {
		return 0
	}
	return max(0, 1-b.pkts/b.sent)
}

// cpuPerMB is CPU milliseconds per MB delivered.
func (b *benchSum) cpuPerMB() float64 { return b.cpu.Seconds() * 1e3 / (b.bytes / 1e6) }

// cpuPerRTT is CPU µs per round trip.
func (b *benchSum) cpuPerRTT() float64 { return float64(b.cpu.Nanoseconds()) / 1e3 / b.iters }

// benchRun is what one raw or stack run measured.
type benchRun struct {
	bytes, iters, pkts, sent float64
	el, cpu                  time.Duration
	cpuSeen                  bool
}

// cpuMeter measures the process CPU time of one run.
type cpuMeter struct {
	t0 time.Duration
	ok bool
}

func startCPU() cpuMeter {
	t, ok := processCPU()
	return cpuMeter{t0: t, ok: ok}
}

// stop returns the CPU time since start and whether it is known.
func (m cpuMeter) stop() (time.Duration, bool) {
	t, ok := processCPU()
	return t - m.t0, ok && m.ok
}

// benchMode is a section of the table: how both sides send.
type benchMode struct {
	title string
	gso   bool // rocev2 with GSO, raw UDP with GSO+GRO
}

var (
	modePlain = benchMode{title: "sendmmsg/recvmmsg: raw UDP in batches of 64 datagrams, rocev2 --gso=false", gso: false}
	modeGSO   = benchMode{title: "GSO+GRO: raw UDP as UDP_SEGMENT datagrams into a UDP_GRO socket, rocev2 --gso=true", gso: true}
)

func bench(ctx context.Context, c *benchConfig, stdout, stderr io.Writer) error {
	usr1 := cli.WatchSIGUSR1(stderr)
	defer usr1.Stop()
	fmt.Fprintf(stdout, "rocev2d bench: %v <-> %v over loopback, path MTU %v, per row %v of raw UDP and %v of rocev2 in %d alternating runs\n",
		c.A, c.B, c.MTU, c.dur, c.dur, benchRounds)
	if off, err := udp.DeviceOffloadFor(c.A); err != nil {
		fmt.Fprintf(stdout, "GSO default of the rocev2d commands on %v: off (%v)\n", c.A, err)
	} else {
		fmt.Fprintf(stdout, "GSO default of the rocev2d commands on %v: %s, %s\n", c.A, map[bool]string{true: "on", false: "off"}[off.GSODefault()], off)
	}
	modes := []benchMode{modePlain, modeGSO}
	if c.Sock.GSOSet {
		modes = []benchMode{modePlain}
		if c.Sock.GSO {
			modes = []benchMode{modeGSO}
		}
	}
	for _, m := range modes {
		if m.gso && !rawGSOSupported {
			fmt.Fprintf(stdout, "\n%s: not on this platform\n", m.title)
			continue
		}
		if err := benchSection(ctx, c, m, usr1, stdout); err != nil {
			return err
		}
	}
	return nil
}

// benchStack is the stack side of one section: two connected endpoints
// and the memory the rows use.
type benchStack struct {
	a, b              *cli.Endpoint
	srcMR, dstMR, rmr *memreg.MR
	recv              transport.RecvWR // B's receive WR for the SEND rows
}

// benchRdAtomic is the READ/atomic depth of the bench's QPs (max_rd_atomic
// and max_dest_rd_atomic, and the devices' limit): the window of 64 the
// other rows keep in flight, as perftest's ib_read_bw uses the device's
// maximum (rxe: 128). At 16 a READ row ran in rounds of 16 requests and
// responses, each round woke both receive goroutines: twice the syscalls
// per READ.
const benchRdAtomic = 64

// benchRecvs is how many receives B keeps posted for the SEND rows: twice
// the largest window, so that B reposting a consumed receive a little late
// never leaves a SEND without one (an RNR NAK would stall the row).
const benchRecvs = 512

// openBenchStack opens the stack side of mode m on c's addresses.
func openBenchStack(c *benchConfig, m benchMode) (*benchStack, error) {
	opts := c.Sock.Options(true, 0)
	opts.GSO, opts.GSOAuto = m.gso, false
	la, lb, err := cli.ListenSocketPair(c.A, c.B, opts, "pick other addresses with --a/--b")
	if err != nil {
		return nil, err
	}
	q := cli.PairQueues
	q.MaxRecvWR = benchRecvs + 64 // and the ping-pong rows' own
	q.CC = c.Sock.CC.Config()
	q.RdAtomic = benchRdAtomic
	a, err := cli.NewEndpoint(la, q)
	if err != nil {
		lb.Close()
		return nil, fmt.Errorf("device A: %w", err)
	}
	b, err := cli.NewEndpoint(lb, q)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("device B: %w", err)
	}
	s := &benchStack{a: a, b: b}
	fail := func(err error) (*benchStack, error) {
		s.close()
		return nil, err
	}
	if err = a.Connect(c.B, b.QP.QPN(), b.PSN, c.MTU, benchRdAtomic, 14); err == nil {
		err = b.Connect(c.A, a.QP.QPN(), a.PSN, c.MTU, benchRdAtomic, 14)
	}
	if err != nil {
		return fail(err)
	}
	// One registration per buffer for the whole section, released after
	// the devices are closed.
	if _, s.srcMR, err = a.Alloc(1<<16, memreg.AccessLocalWrite); err != nil {
		return fail(err)
	}
	if _, s.dstMR, err = b.Alloc(1<<16, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead); err != nil {
		return fail(err)
	}
	// B's receive buffer for the SEND rows: one registration, big enough
	// for every size, with receives kept posted across rows.
	if _, s.rmr, err = b.Alloc(1<<16, memreg.AccessLocalWrite); err != nil {
		return fail(err)
	}
	s.recv = transport.RecvWR{SGEs: []memreg.SGE{{Addr: s.rmr.IOVA(), Length: uint32(s.rmr.Len()), LKey: s.rmr.LKey()}}}
	for i := 0; i < benchRecvs; i++ {
		if err := b.QP.PostRecv(s.recv); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

func (s *benchStack) close() {
	s.a.Close()
	s.b.Close()
}

// goodputRow runs rounds alternating runs of the raw baseline of mode m
// and of op on the stack, each rc.dur long, with messages of size bytes.
func (s *benchStack) goodputRow(ctx context.Context, rc *benchConfig, m benchMode, op transport.WROpcode, size, rounds int) (benchRow, error) {
	row := benchRow{name: cli.OpName(op) + " goodput", size: size}
	for r := range rounds {
		raw := func() error {
			if op == transport.WRRead {
				run, err := rawReadGoodput(ctx, rc, size, stackWindow(op, size), m.gso)
				if err != nil {
					return fmt.Errorf("raw UDP READ baseline, %d B messages: %w", size, err)
				}
				row.raw.add(run)
				row.reqResp = true
			}
			run, err := rawGoodput(ctx, rc, size, m.gso)
			if err != nil {
				return fmt.Errorf("raw UDP baseline, %d B messages: %w", size, err)
			}
			if row.reqResp {
				row.oneWay.add(run)
			} else {
				row.raw.add(run)
			}
			return nil
		}
		stack := func() error {
			run, err := stackGoodput(ctx, rc, s.a, s.b, op, size, s.srcMR, s.dstMR, s.recv)
			if err != nil {
				return fmt.Errorf("%s %d B: %w", cli.OpName(op), size, err)
			}
			row.roc.add(run)
			return nil
		}
		if err := benchPair(r, &row.core, raw, stack); err != nil {
			return row, err
		}
	}
	return row, nil
}

// benchSection runs every row of one mode and prints its table.
func benchSection(ctx context.Context, c *benchConfig, m benchMode, usr1 *cli.USR1Watch, stdout io.Writer) error {
	// Every row alternates benchRounds short runs of the raw UDP baseline
	// (plain UDP sockets on ephemeral ports) and of the stack, each
	// c.dur/benchRounds long, so that both see the same moments of a noisy
	// machine.
	rc := *c
	rc.dur = max(c.dur/benchRounds, 10*time.Millisecond)
	s, err := openBenchStack(c, m)
	if err != nil {
		return err
	}
	defer s.close()
	tag := map[bool]string{false: "", true: " gso"}[m.gso]
	usr1.Add("A "+c.A.String()+tag, s.a.Dev)
	usr1.Add("B "+c.B.String()+tag, s.b.Dev)
	var rows []benchRow
	for _, op := range benchOps {
		for _, size := range benchSizes {
			if !c.goodputRow(op, size) {
				continue
			}
			row, err := s.goodputRow(ctx, &rc, m, op, size, benchRounds)
			if err != nil {
				return err
			}
			rows = append(rows, row)
		}
	}
	if c.latencyRows() {
		lat, err := s.latencyRows(ctx, &rc, benchRounds)
		if err != nil {
			return err
		}
		rows = append(rows, lat...)
	}
	printBenchTable(stdout, m, rows)
	if c.Verbose {
		fmt.Fprintln(stdout)
		cli.PrintCounters(stdout, "A "+c.A.String()+tag, s.a.Dev)
		cli.PrintCounters(stdout, "B "+c.B.String()+tag, s.b.Dev)
	}
	return nil
}

// printBenchTable prints one section.
func printBenchTable(w io.Writer, m benchMode, rows []benchRow) {
	fmt.Fprintf(w, "\n%s\n\n", m.title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "test\tmessage\traw UDP\trocev2\tratio\traw CPU\trocev2 CPU\tCPU ratio\traw pkt/s\traw loss\trocev2 pkt/s\t")
	for _, r := range rows {
		if r.latency {
			fmt.Fprintf(tw, "%s\t%d B\t%.1f µs\t%.1f µs\t%.2f\t%s\t%s\t%s\t\t\t\t\n", r.name, r.size, r.raw.rtt(), r.roc.rtt(), r.roc.rtt()/r.raw.rtt(),
				cpuCell(r.raw.cpuSeen, r.raw.cpuPerRTT(), "µs/rtt"), cpuCell(r.roc.cpuSeen, r.roc.cpuPerRTT(), "µs/rtt"), cpuRatio(r.raw.cpuSeen && r.roc.cpuSeen, r.roc.cpuPerRTT(), r.raw.cpuPerRTT()))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f MB/s\t%.1f MB/s\t%.3f\t%s\t%s\t%s\t%.0f\t%.1f%%\t%.0f\t\n", r.name, benchSize(r.size), r.raw.mbs(), r.roc.mbs(), r.roc.mbs()/r.raw.mbs(),
			cpuCell(r.raw.cpuSeen, r.raw.cpuPerMB(), "ms/MB"), cpuCell(r.roc.cpuSeen, r.roc.cpuPerMB(), "ms/MB"), cpuRatio(r.raw.cpuSeen && r.roc.cpuSeen, r.roc.cpuPerMB(), r.raw.cpuPerMB()),
			r.raw.pps(), 100*r.raw.loss(), r.roc.pps())
	}
	tw.Flush()
	fmt.Fprintln(w, "\nratio = rocev2 / raw UDP (goodput: higher is better; RTT and CPU: lower is better).")
	fmt.Fprintln(w, "CPU = user + system time of the whole process (both ends) per MB delivered, or per round trip.")
	fmt.Fprintln(w, "raw UDP's sender stays at most 512-2048 datagrams ahead of its receiver; raw loss is what the receiving socket dropped all the same.")
	fmt.Fprintln(w, "raw pkt/s counts datagrams on the wire (GSO segments); rocev2 pkt/s those of both directions (data, ACKs, READ responses).")
	var oneWay []benchRow
	for _, r := range rows {
		if r.reqResp {
			oneWay = append(oneWay, r)
		}
	}
	if len(oneWay) == 0 {
		printCoreNote(w, rows)
		return
	}
	fmt.Fprintln(w, "READ's raw UDP is request/response: one 32-byte request datagram per message, answered with the message's")
	fmt.Fprintln(w, "response datagrams, as many messages outstanding as the stack keeps READs in flight; its pkt/s counts both directions.")
	fmt.Fprintln(w, "Against the one-way stream of the response datagrams alone (the WRITE rows' baseline), measured in the same rounds:")
	for _, r := range oneWay {
		fmt.Fprintf(w, "  READ %s: one-way raw UDP %.1f MB/s, rocev2 / one-way %.3f\n", benchSize(r.size), r.oneWay.mbs(), r.roc.mbs()/r.oneWay.mbs())
	}
	printCoreNote(w, rows)
}

func cpuCell(ok bool, v float64, unit string) string {
	if !ok {
		return "-"
	}
	if v < 10 {
		return fmt.Sprintf("%.3f %s", v, unit)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

func cpuRatio(ok bool, roc, raw float64) string {
	if !ok || raw <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", roc/raw)
}

// benchRounds is how many alternating raw / stack runs make one row.
const benchRounds = 3

// benchPair runs raw and stack, raw first in even rounds and stack first in
// odd ones, and samples the CPUs' distance into w before, between and after
// the two runs, outside their timing.
func benchPair(round int, w *cpudist.Watch, raw, stack func() error) error {
	first, second := raw, stack
	if round%2 == 1 {
		first, second = stack, raw
	}
	w.Sample()
	if err := first(); err != nil {
		return err
	}
	w.Sample()
	if err := second(); err != nil {
		return err
	}
	w.Sample()
	return nil
}

// printCoreNote prints what cpudist saw around the section's runs and
// names the rows during which the CPUs were at least twice as far apart
// as at best: in a virtual machine, the host ran its two CPUs apart then,
// and the copies between the bench's two ends cost more for raw UDP and
// rocev2 alike, in whichever runs of the row it lasted.
func printCoreNote(w io.Writer, rows []benchRow) {
	var all cpudist.Watch
	for _, r := range rows {
		all.Merge(r.core)
	}
	if all.N == 0 {
		return
	}
	fmt.Fprintf(w, "CPU distance: the first two CPUs passed a cache line back and forth in %d-%d ns, sampled around every run.\n",
		all.Min.Nanoseconds(), all.Max.Nanoseconds())
	var far []string
	for _, r := range rows {
		if r.core.Apart(all.Min) {
			far = append(far, fmt.Sprintf("%s %s (%d ns)", r.name, benchSize(r.size), r.core.Max.Nanoseconds()))
		}
	}
	if len(far) > 0 {
		fmt.Fprintf(w, "Rows with a sample at twice the fastest or more — the CPUs were apart (a VM's host moved them), copies cost more, compare with care:\n  %s\n",
			strings.Join(far, "\n  "))
	}
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
	sa, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.A, 0)))
	if err != nil {
		return nil, nil, err
	}
	sb, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.B, 0)))
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

// rawPairGRO is rawPair with UDP_GRO on a's socket (groA) and b's (groB).
func rawPairGRO(c *benchConfig, groA, groB bool) (sa, sb *net.UDPConn, err error) {
	sa, sb, err = rawPair(c)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range []struct {
		conn *net.UDPConn
		on   bool
	}{{sa, groA}, {sb, groB}} {
		if !s.on {
			continue
		}
		if err = enableGRO(s.conn); err != nil {
			sa.Close()
			sb.Close()
			return nil, nil, fmt.Errorf("UDP_GRO: %w", err)
		}
	}
	return sa, sb, nil
}

// rawGoodput sends messages of size bytes, cut into datagrams of at most
// one MTU of payload plus 16 bytes (BTH + ICRC), from a to b for c.dur and
// receives them. Without gso both ends move batches of benchBatch
// datagrams with sendmmsg/recvmmsg; with gso the sender hands runs of
// equal-size datagrams to the kernel as UDP GSO datagrams (UDP_SEGMENT, at
// most gsoSegs segments and gsoBytes bytes each, several per sendmmsg) and
// the receiving socket has UDP_GRO, so that it gets coalesced buffers.
// The sender stays at most rawWindow datagrams ahead of the receiver. The
// run counts the message bytes delivered and the datagrams sent and
// delivered (GSO segments one by one).
func rawGoodput(ctx context.Context, c *benchConfig, size int, gso bool) (benchRun, error) {
	sa, sb, err := rawPairGRO(c, false, gso)
	if err != nil {
		return benchRun{}, err
	}
	defer sa.Close()
	defer sb.Close()
	mtu := c.MTU.Bytes()
	// The datagrams of one message: full MTU chunks and the remainder.
	var chunks []int
	for left := size; left > 0; left -= mtu {
		chunks = append(chunks, min(left, mtu)+16)
	}
	dst := sb.LocalAddr()
	wb := newBatchConn(sa, c.A.Is4())
	rb := newBatchConn(sb, c.A.Is4())
	var msgs []ipv4.Message
	var segs []int // datagrams in each of msgs
	if !gso {
		// Keep message boundaries: batches are whole multiples of a message.
		n := benchBatch - benchBatch%len(chunks)
		if n == 0 {
			n = len(chunks)
		}
		for i := range n {
			msgs = append(msgs, ipv4.Message{Buffers: [][]byte{make([]byte, chunks[i%len(chunks)])}, Addr: dst})
			segs = append(segs, 1)
		}
	} else {
		// Whole messages, repeated until a batch of GSO datagrams is
		// full, grouped as the stack's link groups them: runs of equal
		// size, the last of a run possibly shorter.
		// The batch stays within the sender's window (at MTU 1024 a
		// batch of 1,023 datagrams against a window of 512 never left).
		var stream []int
		for len(stream) == 0 || len(stream) < benchBatch*gsoSegs && len(stream)*mtu < benchBatch*gsoBytes/4 &&
			len(stream)+len(chunks) <= rawWindow(chunks[0]) {
			stream = append(stream, chunks...)
		}
		total, seg, n := gsoGroups(stream)
		for i := range total {
			msgs = append(msgs, ipv4.Message{Buffers: [][]byte{make([]byte, total[i])}, OOB: gsoCmsg(seg[i]), Addr: dst})
		}
		segs = n
	}
	// A window keeps the sender at most rawWindow datagrams ahead of the
	// receiver (what the receiving socket's buffer holds), so that the
	// baseline measures what the path delivers rather than how a flooded
	// socket drops: the receiver signals credit after every batch, and a
	// sender that waited 2 ms for it goes on (datagrams lost for good
	// never come back as credit).
	window := int64(rawWindow(chunks[0]))
	credit := make(chan struct{}, 1)
	var rcvdBytes, rcvdPkts atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rm := make([]ipv4.Message, benchBatch)
		for i := range rm {
			rm[i] = ipv4.Message{Buffers: [][]byte{make([]byte, 65536)}, OOB: make([]byte, 64)}
		}
		for {
			sb.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			n, err := rb.ReadBatch(rm, 0)
			for _, m := range rm[:max(n, 0)] {
				k := 1
				if seg := groSegment(m.OOB[:m.NN]); seg > 0 {
					k = (m.N + seg - 1) / seg
				}
				rcvdBytes.Add(int64(m.N - 16*k))
				rcvdPkts.Add(int64(k))
			}
			if n > 0 {
				select {
				case credit <- struct{}{}:
				default:
				}
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
	batchSegs := int64(0)
	for _, n := range segs {
		batchSegs += int64(n)
	}
	wait := time.NewTimer(time.Hour)
	defer wait.Stop()
	var sent, gone int64 // gone: datagrams given up on (lost)
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(c.dur)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if out := sent - gone - rcvdPkts.Load(); out > 0 && out+batchSegs > window {
			wait.Reset(2 * time.Millisecond)
			select {
			case <-credit:
			case <-wait.C:
				gone = sent - rcvdPkts.Load() // what is still missing is lost
			}
			wait.Stop()
			continue
		}
		k, err := wb.WriteBatch(msgs, 0)
		for _, n := range segs[:max(k, 0)] {
			sent += int64(n)
		}
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.EAGAIN) {
				continue
			}
			close(stop)
			wg.Wait()
			return benchRun{}, err
		}
	}
	el := time.Since(start)
	time.Sleep(20 * time.Millisecond) // let the receiver drain
	close(stop)
	wg.Wait()
	run := benchRun{bytes: float64(rcvdBytes.Load()), pkts: float64(rcvdPkts.Load()), sent: float64(sent), el: el}
	run.cpu, run.cpuSeen = cpu.stop()
	return run, ctx.Err()
}

// stackWindow is how many work requests of size bytes the stack keeps in
// flight in the goodput rows of op (and the READ baseline keeps
// outstanding): about 512 KiB of messages, at most 256 of them (64 B: 256,
// 4 KiB: 128 as perftest's default tx_depth, 64 KiB: 8), and READs at most
// benchRdAtomic. The raw baseline's sender may be 2048 datagrams ahead; a
// window of 64 small messages made the stack's rows wait for round trips
// the baseline never waits for (64 B at 0.07 of raw GSO+GRO, 0.12 at 256).
func stackWindow(op transport.WROpcode, size int) int {
	w := min(256, max(8, benchWindowBytes/max(size, 1)))
	if op == transport.WRRead {
		w = min(w, benchRdAtomic)
	}
	return w
}

// benchWindowBytes is the message bytes stackWindow keeps in flight.
const benchWindowBytes = 512 << 10

// rawWindow is how many datagrams of dgram bytes the raw baseline's sender
// may be ahead of its receiver: about 2 MiB of socket buffer (the receive
// buffer is 8 MiB; a small datagram costs ~1 KiB of it).
func rawWindow(dgram int) int {
	if dgram < 1024 {
		return 2048
	}
	return 512
}

// gsoSegs and gsoBytes bound one GSO datagram of the raw baseline as
// udp.SocketLink bounds the stack's.
const (
	gsoSegs  = 64
	gsoBytes = 65535 - 8 - 40
)

// stackGoodput runs op from A to B (READ: B's memory to A) with messages of
// size bytes and a window of outstanding work requests for c.dur, and
// returns the message bytes delivered, the packets both links sent, the
// time and the process CPU time.
// srcMR (on A) and dstMR (on B) hold at least size bytes. For SEND, B has
// receives of recv posted and reposts each one consumed.
func stackGoodput(ctx context.Context, c *benchConfig, a, b *cli.Endpoint, op transport.WROpcode, size int, srcMR, dstMR *memreg.MR, recv transport.RecvWR) (benchRun, error) {
	window := stackWindow(op, size)
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
				n, err := b.RCQ.Wait(rctx, wcs)
				if err != nil {
					if rctx.Err() == nil {
						recvErr = err
					}
					return
				}
				for _, wc := range wcs[:n] {
					if wc.Status != transport.WCSuccess {
						recvErr = cli.WCError(wc, "receive")
						return
					}
					if err := b.QP.PostRecv(recv); err != nil {
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
	pkts0 := a.Link.Stats().SentPkts + b.Link.Stats().SentPkts
	var posted, done int
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(c.dur)
	for {
		if time.Now().Before(deadline) && posted-done < window {
			k := window - (posted - done)
			if err := a.QP.PostSend(wrs[:k]...); err != nil {
				return benchRun{}, err
			}
			posted += k
		}
		if posted == done {
			break
		}
		n, err := a.SCQ.Wait(ctx, wcs)
		if err != nil {
			return benchRun{}, err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return benchRun{}, cli.WCError(wc, "send")
			}
		}
		done += n
	}
	el := time.Since(start)
	pkts := a.Link.Stats().SentPkts + b.Link.Stats().SentPkts - pkts0
	if op == transport.WRSend {
		// Wait until B has consumed (and reposted) every message.
		for time.Since(start) < c.dur+5*time.Second && received.Load() < int64(done) {
			time.Sleep(time.Millisecond)
		}
		cancel()
		wg.Wait()
		if recvErr != nil {
			return benchRun{}, recvErr
		}
	}
	run := benchRun{bytes: float64(done) * float64(size), pkts: float64(pkts), el: el}
	run.cpu, run.cpuSeen = cpu.stop()
	return run, ctx.Err()
}
