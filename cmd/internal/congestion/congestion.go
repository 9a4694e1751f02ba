package congestion

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"

	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// Commands is the congestion command, for rocev2d's dispatch.
func Commands() []cli.Command {
	return []cli.Command{{Name: "congestion", Summary: "N RC flows into one bottleneck of the in-memory switch: rates, queue and CNPs as CSV and SVG",
		Usage: congestionUsage, Run: runCongestion}}
}

const congestionUsage = `usage: rocev2d congestion [options]

Runs N RC flows, each an RC QP on its own sender device, into one
bottleneck: the switch egress port toward the receiver in the in-memory
network (memnet.MemNetwork.Bottleneck), which drains at --rate, marks
ECN-capable packets CE on its queue depth as RED does (probability 0 up to
--kmin, rising linearly to --pmax at --kmax, 1 beyond) and tail-drops what
does not fit in --buffer. Each sender's link is shaped at --line-rate. Every
flow keeps --depth RDMA WRITEs of --size bytes outstanding; its goodput is
counted from its completions. The receiver's notification point answers CE
marks with CNPs; each sender's DCQCN reaction point cuts and recovers its
rate.

The run is in virtual time: the devices share one manual clock and the
network moves packets only when the run steps it, so a run is a function of
its flags and --seed (the same flags give the same CSV and SVG, byte for
byte) and its rates are not limited by this machine's CPU.

Every --interval it records each flow's goodput and DCQCN rate, the queue
depth, and the CNPs sent (receiver's np_cnp_sent) and handled (senders'
rp_cnp_handled), CE marks and drops of the interval: as CSV (--csv) and as
an SVG plot (--svg) of stacked panels over time. At the end it prints a
summary: over the last half, the aggregate goodput against the bottleneck,
Jain's fairness index of the flows' goodputs, the drops and the mean
queue; over the whole run, the goodput after the last flow started, the
drops, CE marks and CNPs. A flow whose QP fails (retries exhausted) stops,
the run goes on, and the command names it and exits 1.

The defaults are test/ccsim's scenario: a 10 Gb/s port with a 512 KiB
buffer marking from 5 KiB to 200 KiB (1 % at Kmax, as in the DCQCN paper),
senders with 25 Gb/s NICs, 2 µs per hop, 64 KiB WRITEs, 8 outstanding per
flow, MTU 4096, and the reaction point of the DCQCN paper (--rp=paper);
but the flows start --stagger apart where test/ccsim starts them at once,
and a run lasts 100 ms, not 200 ms. --duration 200ms --stagger 0 gives
test/ccsim's numbers.

Options:
  -n, --flows N    flows (default 4, at most 64)
  --rate RATE      bottleneck rate, bits/s of IP datagrams (default 10G;
                   RATE: 10G, 500M, 2.5e9)
  --line-rate RATE each sender's line rate (default 25G, or --rate if
                   above); also DCQCN's rpg_max_rate unless --dcqcn-param
                   sets it
  --buffer SIZE    bottleneck buffer (default 512KiB; SIZE: bytes, or
                   with k/KB, M/MB (×1000) or KiB, MiB (×1024))
  --kmin SIZE      marking starts above this depth (default 5KiB)
  --kmax SIZE      marking probability reaches --pmax here (default 200KiB)
  --pmax P         marking probability at --kmax (default 0.01)
  --rp=paper|nvidia   the reaction point's knobs before --dcqcn-param:
                   paper (default): Zhu et al. 2015's table 1 with its
                   rates scaled from 40 Gb/s to --rate — α gain 1/256
                   (dce_tcp_g 1020) every 55 µs, rate increase timer 55 µs,
                   byte counter 10 MB, 5 steps of fast recovery, AI 40 Mb/s,
                   HAI 400 Mb/s, minimum 10 Mb/s (×rate/40G); nvidia: the
                   dcqcn package's defaults (NVIDIA's for 100 Gb/s NICs
                   with hardware timers: α every 1 µs, byte counter 32 KiB,
                   threshold 1), which at these rates keep the flows above
                   the bottleneck
  --duration DUR   virtual time the flows run (default 100ms)
  --interval DUR   sample interval (default 1ms)
  --stagger DUR    flow i (from 0) starts at i×DUR (default 10ms):
                   staggered starts show the convergence
  --size BYTES     RDMA WRITE size (default 65536)
  --depth N        WRITEs outstanding per flow (default 8)
  --mtu N          path MTU: 256, 512, 1024, 2048 or 4096 (default 4096)
  --delay DUR      one-way propagation delay (default 2us)
  --timeout N      local ACK timeout exponent, 4.096us×2^N (default 12)
  --seed N         seed of the network's random decisions (default 1)
  --csv PATH       write the samples as CSV
  --svg PATH       write the plot as SVG (any browser shows it)
  -v               print every device's counters at the end
` + cli.CCUsage

// ccConfig is the parsed command line of rocev2d congestion.
type ccConfig struct {
	flows           int
	rate, lineRate  float64
	buffer          int
	kmin, kmax      int
	pmax            float64
	duration        time.Duration
	interval        time.Duration
	stagger         time.Duration
	size, depth     int
	mtu             transport.MTU
	delay           time.Duration
	timeout         int
	seed            int64
	csvPath, svgPth string
	verbose         bool
	cc              cli.CCFlags
}

func parseCongestionFlags(args []string) (*ccConfig, error) {
	c := &ccConfig{}
	fs := cli.NewFlagSet("congestion")
	cli.IntFlags(fs, &c.flows, "n", "flows", 4)
	rateFlag(fs, &c.rate, "rate", 10e9)
	rateFlag(fs, &c.lineRate, "line-rate", 0)
	sizeFlag(fs, &c.buffer, "buffer", 512<<10)
	sizeFlag(fs, &c.kmin, "kmin", 5<<10)
	sizeFlag(fs, &c.kmax, "kmax", 200<<10)
	fs.Float64Var(&c.pmax, "pmax", 0.01, "")
	rp := fs.String("rp", "paper", "")
	fs.DurationVar(&c.duration, "duration", 100*time.Millisecond, "")
	fs.DurationVar(&c.interval, "interval", time.Millisecond, "")
	fs.DurationVar(&c.stagger, "stagger", 10*time.Millisecond, "")
	fs.IntVar(&c.size, "size", 64<<10, "")
	fs.IntVar(&c.depth, "depth", 8, "")
	mtu := fs.Int("mtu", 4096, "")
	fs.DurationVar(&c.delay, "delay", 2*time.Microsecond, "")
	fs.IntVar(&c.timeout, "timeout", 12, "")
	fs.Int64Var(&c.seed, "seed", 1, "")
	fs.StringVar(&c.csvPath, "csv", "", "")
	fs.StringVar(&c.svgPth, "svg", "", "")
	fs.BoolVar(&c.verbose, "v", false, "")
	cli.AddCCFlags(fs, &c.cc)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.lineRate == 0 {
		c.lineRate = max(25e9, c.rate)
	}
	var ok bool
	if c.mtu, ok = transport.MTUFromBytes(*mtu); !ok {
		return nil, fmt.Errorf("--mtu %d: want 256, 512, 1024, 2048 or 4096", *mtu)
	}
	switch {
	case c.flows < 1 || c.flows > 64:
		return nil, fmt.Errorf("-n %d: want 1 to 64 flows", c.flows)
	case c.kmin > c.kmax:
		return nil, fmt.Errorf("--kmin %d is above --kmax %d", c.kmin, c.kmax)
	case c.buffer <= 0:
		return nil, fmt.Errorf("--buffer must be > 0")
	case !(c.pmax >= 0 && c.pmax <= 1):
		return nil, fmt.Errorf("--pmax %v: want a probability in [0, 1]", c.pmax)
	case c.duration <= 0 || c.duration > time.Minute:
		return nil, fmt.Errorf("--duration %v: want (0, 1m]", c.duration)
	case c.interval <= 0 || c.interval > c.duration:
		return nil, fmt.Errorf("--interval %v: want (0, --duration]", c.interval)
	case c.duration/c.interval > 100000:
		return nil, fmt.Errorf("--interval %v: at most 100000 samples per run", c.interval)
	case c.stagger < 0:
		return nil, fmt.Errorf("--stagger %v: want 0 (all at once) or more", c.stagger)
	case c.stagger*time.Duration(c.flows-1) >= c.duration:
		return nil, fmt.Errorf("--stagger %v: the last flow must start before --duration %v", c.stagger, c.duration)
	case c.size < 1 || c.size > 1<<30:
		return nil, fmt.Errorf("--size %d: want 1 to 1 GiB", c.size)
	case c.depth < 1 || c.depth > 1024:
		return nil, fmt.Errorf("--depth %d: want 1 to 1024", c.depth)
	case c.delay < 0 || c.delay > time.Second:
		return nil, fmt.Errorf("--delay %v: want [0, 1s]", c.delay)
	case c.timeout < 1 || c.timeout > 31:
		return nil, fmt.Errorf("--timeout %d: want 1 to 31", c.timeout)
	}
	// The reaction point: the profile, then the --dcqcn-param knobs.
	switch *rp {
	case "paper":
		c.cc.Params = paperRP(c.rate)
	case "nvidia":
		c.cc.Params = dcqcn.Config{}
	default:
		return nil, fmt.Errorf("--rp %q: want paper or nvidia", *rp)
	}
	if err := cli.SetDCQCNParams(&c.cc.Params, c.cc.ParamArgs); err != nil {
		return nil, fmt.Errorf("--dcqcn-param %s: %w", c.cc.ParamArgs, err)
	}
	if c.cc.Params.LineRate == 0 {
		c.cc.Params.LineRate = c.lineRate
	}
	if _, err := c.cc.Params.Normalize(); err != nil {
		return nil, err
	}
	return c, nil
}

// paperRP returns the reaction point of the DCQCN paper (Zhu et al.,
// SIGCOMM 2015, table 1, for 40 Gb/s), its rates and byte counter scaled
// to a bottleneck of rate bits/s — at 10 Gb/s, test/ccsim's knobs.
func paperRP(rate float64) dcqcn.Config {
	f := rate / 40e9
	return dcqcn.Config{
		G: 1020, AlphaPeriod: 55 * time.Microsecond, TimeReset: 55 * time.Microsecond,
		ByteReset: max(1, int64(10e6*f)), Threshold: 5,
		AIRate: 40e6 * f, HAIRate: 400e6 * f, MinRate: 40e6 * f,
	}
}

// rateFlag registers a bits/s option (10G, 500M, 2.5e9).
func rateFlag(fs *flag.FlagSet, p *float64, name string, def float64) {
	*p = def
	fs.Func(name, "", func(v string) error {
		r, err := cli.ParseBitRate(v, 1)
		if err == nil {
			*p = r
		}
		return err
	})
}

// sizeFlag registers a byte size option (200KB, 1MiB, 40000).
func sizeFlag(fs *flag.FlagSet, p *int, name string, def int) {
	*p = def
	fs.Func(name, "", func(v string) error {
		n, err := parseByteSize(v)
		if err == nil {
			*p = n
		}
		return err
	})
}

// parseByteSize parses a byte count: a number with an optional k/KB or
// M/MB (×1000) or KiB/MiB (×1024) suffix.
func parseByteSize(v string) (int, error) {
	s := strings.TrimSpace(v)
	mult := 1.0
	for _, u := range []struct {
		sfx string
		m   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"KB", 1e3}, {"kB", 1e3}, {"MB", 1e6}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"B", 1}} {
		if t, ok := strings.CutSuffix(s, u.sfx); ok {
			s, mult = t, u.m
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f >= 0) || f*mult > 1<<34 {
		return 0, fmt.Errorf("want a byte size (e.g. 200KB, 1MiB, 40000)")
	}
	return int(math.Round(f * mult)), nil
}

func runCongestion(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseCongestionFlags(args)
	if code, done := cli.FlagsResult("congestion", congestionUsage, err, stdout, stderr); done {
		return code
	}
	// Create the output files first: a bad path fails before the run.
	var csvF, svgF *os.File
	for _, o := range []struct {
		flag, path string
		f          **os.File
	}{{"--csv", c.csvPath, &csvF}, {"--svg", c.svgPth, &svgF}} {
		if o.path == "" {
			continue
		}
		if *o.f, err = os.Create(o.path); err != nil {
			fmt.Fprintf(stderr, "rocev2d congestion: %s: %v\n", o.flag, err)
			return cli.ExitUsage
		}
		defer (*o.f).Close()
	}
	run, sim, err := runCongestionSim(ctx, c, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d congestion: %v\n", err)
		if run == nil || len(run.Samples) == 0 {
			return cli.ExitFail
		}
	}
	code := cli.ExitOK
	if err != nil {
		code = cli.ExitFail
	}
	for _, f := range run.Failed {
		fmt.Fprintf(stdout, "failed: %s\n", f)
		code = cli.ExitFail
	}
	if csvF != nil {
		if err := run.WriteCSV(csvF); err == nil {
			err = csvF.Close()
		}
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d congestion: --csv: %v\n", err)
			code = cli.ExitFail
		}
	}
	if svgF != nil {
		if err := run.Plot().Encode(svgF); err == nil {
			err = svgF.Close()
		}
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d congestion: --svg: %v\n", err)
			code = cli.ExitFail
		}
	}
	if c.verbose && sim != nil {
		cli.PrintCounters(stdout, "receiver "+sim.recv.Dev.Addr().String(), sim.recv.Dev)
		for i, s := range sim.send {
			cli.PrintCounters(stdout, fmt.Sprintf("flow %d sender %v", i+1, s.Dev.Addr()), s.Dev)
		}
	}
	if sim != nil {
		sim.close()
	}
	fmt.Fprintf(stdout, "summary: %s\n", run.Summary().format(run))
	if c.csvPath != "" {
		fmt.Fprintf(stdout, "csv: %s\n", c.csvPath)
	}
	if c.svgPth != "" {
		fmt.Fprintf(stdout, "svg: %s\n", c.svgPth)
	}
	return code
}

// ccSim is a congestion run's network and devices.
type ccSim struct {
	c     *ccConfig
	clk   *transport.ManualClock
	net   *memnet.MemNetwork
	port  *memnet.SwitchPort
	recv  *cli.Endpoint
	rqps  []*transport.QP // the receiver's QP of each flow
	send  []*cli.Endpoint
	write []transport.SendWR // each flow's WRITE
	wcs   []transport.WC
}

// congestion run addresses (RFC 5737 documentation range).
var (
	ccRecvAddr = netip.MustParseAddr("192.0.2.1")
	ccSendBase = netip.MustParseAddr("192.0.2.10")
)

func (s *ccSim) close() {
	for _, e := range s.send {
		e.Close()
	}
	if s.recv != nil {
		s.recv.Close()
	}
}

// newCCSim builds the network: the bottleneck toward the receiver, the
// receiver with one QP per flow, and each flow's sender on its shaped
// link, connected.
func newCCSim(c *ccConfig) (*ccSim, error) {
	s := &ccSim{c: c, clk: transport.NewManualClock(time.Unix(0, 0).UTC())}
	s.net = memnet.NewVirtualMemNetwork(memnet.Faults{Seed: c.seed, Delay: c.delay}, s.clk.Now)
	var err error
	s.port, err = s.net.Bottleneck(ccRecvAddr, memnet.Bottleneck{Rate: c.rate, Buffer: c.buffer, Kmin: c.kmin, Kmax: c.kmax, Pmax: c.pmax})
	if err != nil {
		return nil, err
	}
	cc := c.cc.Config()
	access := memreg.AccessRemoteWrite
	link, err := s.net.Link(ccRecvAddr)
	if err != nil {
		return nil, err
	}
	cfg := cli.EndpointConfig{SendCQ: 16 * c.flows, RecvCQ: 16, MaxSendWR: 4, MaxRecvWR: 1, Access: access, CC: cc, Clock: s.clk}
	if s.recv, err = cli.NewEndpoint(link, cfg); err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	_, dst, err := s.recv.Alloc(c.size, access|memreg.AccessLocalWrite)
	if err != nil {
		s.close()
		return nil, err
	}
	s.rqps = append(s.rqps, s.recv.QP)
	for range c.flows - 1 {
		qp, err := s.recv.NewQP(cfg)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("receiver: %w", err)
		}
		s.rqps = append(s.rqps, qp)
	}
	scfg := cli.EndpointConfig{SendCQ: c.depth + 16, RecvCQ: 16, MaxSendWR: c.depth, MaxRecvWR: 1, Access: access, CC: cc, Clock: s.clk}
	a4 := ccSendBase.As4()
	for i := range c.flows {
		a4[3] = byte(10 + i)
		addr := netip.AddrFrom4(a4)
		l, err := s.net.Link(addr)
		if err != nil {
			s.close()
			return nil, err
		}
		if _, err := l.Shape(memnet.Bottleneck{Rate: c.lineRate}); err != nil {
			l.Close()
			s.close()
			return nil, err
		}
		e, err := cli.NewEndpoint(l, scfg)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("flow %d: %w", i+1, err)
		}
		s.send = append(s.send, e)
		src, smr, err := e.Alloc(c.size, memreg.AccessLocalWrite)
		if err != nil {
			s.close()
			return nil, err
		}
		for k := range src {
			src[k] = byte(i)
		}
		rpsn := uint32(0x1000 * (i + 1))
		if err := e.Connect(ccRecvAddr, s.rqps[i].QPN(), rpsn, c.mtu, 1, uint8(c.timeout)); err != nil {
			s.close()
			return nil, fmt.Errorf("flow %d: %w", i+1, err)
		}
		if err := s.recv.ConnectQP(s.rqps[i], rpsn, addr, e.QP.QPN(), e.PSN, c.mtu, 1, uint8(c.timeout)); err != nil {
			s.close()
			return nil, fmt.Errorf("flow %d: receiver: %w", i+1, err)
		}
		s.write = append(s.write, transport.SendWR{Opcode: transport.WRWrite, Flags: transport.SendSignaled,
			SGEs:       []memreg.SGE{{Addr: smr.IOVA(), Length: uint32(c.size), LKey: smr.LKey()}},
			RemoteAddr: dst.IOVA(), RKey: dst.RKey()})
	}
	s.wcs = make([]transport.WC, 64)
	return s, nil
}

// ccQuantum is the longest the run advances the clock in one step when
// the network has nothing due sooner: a packet delivered within a step is
// answered at its end, so this bounds the error of a response's time.
const ccQuantum = time.Microsecond

// runCongestionSim runs the flows and returns the samples (and the
// devices, for -v; the caller closes them).
func runCongestionSim(ctx context.Context, c *ccConfig, stdout io.Writer) (*ccRun, *ccSim, error) {
	run := &ccRun{Flows: c.flows, Bottleneck: c.rate, Buffer: c.buffer, Kmin: c.kmin, Kmax: c.kmax, Pmax: c.pmax,
		DCQCN: !c.cc.DCQCNOff, Interval: c.interval}
	for i := range c.flows {
		run.Starts = append(run.Starts, time.Duration(i)*c.stagger)
	}
	s, err := newCCSim(c)
	if err != nil {
		return run, nil, err
	}
	t0 := s.clk.Now()
	outstanding := make([]int, c.flows)
	failed := make([]bool, c.flows)
	bytes := make([]uint64, c.flows) // completed since the last sample
	prevPort := s.port.Stats()
	prevCNPSent := s.recv.Dev.Counters().NPCNPSent
	prevHandled := make([]uint64, c.flows)
	nextSample := t0.Add(c.interval)
	end := t0.Add(c.duration)
	for iter := 0; ; iter++ {
		if iter&1023 == 0 && ctx.Err() != nil {
			return run, s, fmt.Errorf("interrupted at %v of virtual time", s.clk.Now().Sub(t0))
		}
		now := s.clk.Now()
		// Keep every started flow's window full.
		for i := range c.flows {
			if now.Sub(t0) < run.Starts[i] || now.After(end) || failed[i] {
				continue
			}
			for ; outstanding[i] < c.depth; outstanding[i]++ {
				if err := s.send[i].QP.PostSend(s.write[i]); err != nil {
					failed[i] = true
					run.Failed = append(run.Failed, fmt.Sprintf("flow %d at %v: %v", i+1, now.Sub(t0), err))
					break
				}
			}
		}
		// Advance to the network's next event, the next sample or flow
		// start, or by one quantum.
		next := now.Add(ccQuantum)
		if t, ok := s.net.NextEvent(); ok && t.Before(next) {
			next = t
		}
		if nextSample.Before(next) {
			next = nextSample
		}
		for _, st := range run.Starts {
			if at := t0.Add(st); at.After(now) && at.Before(next) {
				next = at
			}
		}
		if d := next.Sub(now); d > 0 {
			s.clk.Advance(d)
		}
		if err := s.net.Step(); err != nil {
			return run, s, err
		}
		for i := range c.flows {
			for {
				n := s.send[i].SCQ.Poll(s.wcs)
				if n == 0 {
					break
				}
				for _, wc := range s.wcs[:n] {
					outstanding[i]--
					if wc.Status != transport.WCSuccess {
						// The QP is in the error state: the flow is over
						// (its other WRs complete flushed).
						if !failed[i] {
							failed[i] = true
							run.Failed = append(run.Failed, fmt.Sprintf("flow %d at %v: %v", i+1, s.clk.Now().Sub(t0), cli.WCError(wc, "RDMA WRITE")))
						}
						continue
					}
					bytes[i] += uint64(c.size)
				}
			}
		}
		now = s.clk.Now()
		if now.Before(nextSample) {
			continue
		}
		// Sample.
		st := s.port.Stats()
		cnpSent := s.recv.Dev.Counters().NPCNPSent
		sm := ccSample{T: now.Sub(t0), Queue: float64(st.Depth), MeanQueue: memnet.MeanDepth(prevPort, st),
			CNPSent: cnpSent - prevCNPSent, Marked: st.Marked - prevPort.Marked, Dropped: st.Dropped - prevPort.Dropped}
		for i := range c.flows {
			sm.Goodput = append(sm.Goodput, float64(bytes[i])*8/c.interval.Seconds())
			bytes[i] = 0
			rate := math.NaN()
			if sm.T > run.Starts[i] {
				rate = s.send[i].QP.Congestion().Rate
			}
			sm.Rate = append(sm.Rate, rate)
			h := s.send[i].Dev.Counters().RPCNPHandled
			sm.CNPHandled += h - prevHandled[i]
			prevHandled[i] = h
		}
		run.Samples = append(run.Samples, sm)
		prevPort, prevCNPSent = st, cnpSent
		nextSample = nextSample.Add(c.interval)
		if now.Before(end) {
			continue
		}
		return run, s, nil
	}
}
