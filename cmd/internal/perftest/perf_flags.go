package perftest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

func init() {
	for _, t := range []oob.PerfTest{oob.WriteBW, oob.ReadBW, oob.SendBW, oob.AtomicBW, oob.WriteLat, oob.ReadLat, oob.SendLat, oob.AtomicLat} {
		t := t
		title := perfTitle(t, "")
		title = strings.ReplaceAll(title, "  ", " ")
		commands.Register(t.String(), "perftest-compatible "+title+" (ib_"+strings.ReplaceAll(t.String(), "-", "_")+")",
			perfUsage(t), func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
				return runPerf(ctx, t, args, stdout, stderr)
			})
	}
}

// perfUsage is the help text of one perftest subcommand.
func perfUsage(t oob.PerfTest) string {
	tool := "ib_" + strings.ReplaceAll(t.String(), "-", "_")
	defSize, defIters, defTx := perfDefaults(t)
	return fmt.Sprintf(`usage: rocev2d %[1]s [options] [server]

Compatible with perftest 4.5's %[2]s: the same flags, the same out-of-band
exchange on TCP (default port 18515) and the same result table, so either
side may be rocev2d or the real tool. Without a server argument it waits for
a client (the server); with one it connects to it (the client). RoCEv2 runs
over a UDP socket on port 4791 of the local address. With -R both sides
connect through rdma_cm (IB CM MADs to QP1) instead, as %[2]s -R does.

options:
  -s, --size=BYTES        message size (default %[3]d; the atomic tests refuse any but 8)
  -n, --iters=N           iterations (default %[4]d, at least 5)
  -a, --all               run sizes 2, 4, ... 8388608 (not for atomics)
  -D, --duration=SEC      run for SEC seconds instead of -n (bandwidth tests)
      --run_infinitely    run until interrupted (SIGINT), printing a row every -D seconds
                          (default 5): that period's iterations, average and message rate,
                          peak 0.00, as perftest (bandwidth tests; not with -e, -b, -a, -R,
                          --check). A write/read/atomic server prints nothing, as perftest's;
                          a side whose peer went away ends (exit 0), saying so on stderr
  -b, --bidirectional     both sides send at once and print the sum of both directions
                          (bandwidth tests; both sides need -b)
  -m, --mtu=MTU           path MTU 256..4096 (default 1024; the smaller of both sides wins)
  -t, --tx-depth=N        outstanding send work requests (default %[5]d; per QP)
  -q, --qp=N              QPs (bandwidth tests; default 1): -n iterations and -t depth on
                          each, posted round-robin, the result counts all (both sides need
                          the same -q; a mismatch fails in the exchange, naming both;
                          with -R each QP has its own rdma_cm connection)
  -r, --rx-depth=N        receives posted (SEND tests, default 512)
  -Q, --cq-mod=N          request a completion for one send WR in N (1..1024; default 100,
                          but 1 for messages over 8192 bytes unless -Q, -a or -e; at most
                          -t), as perftest; the bandwidth tests count each completion as the
                          WRs it ends (the latency tests signal every WR)
  -l, --post_list=N       post the send WRs in lists of N, one post call each (bandwidth
                          tests; -n a multiple of N; sets -Q to N unless given, which must
                          divide N), as perftest
  -u, --qp-timeout=T      local ACK timeout exponent (default 14)
  -A, --atomic_type=TYPE  CMP_AND_SWAP or FETCH_AND_ADD (default FETCH_AND_ADD)
  -p, --port=PORT         out-of-band TCP port (default 18515); with -R the rdma_cm port
  -R, --rdma_cm           connect through rdma_cm, as perftest -R: the exchange runs over an
                          RC connection made through the IB CM on port -p, then the test QP
                          gets its own (a server needs --bind; both sides need -R)
      --use-srq           SEND tests: the QPs take their receives from one shared receive
                          queue of -r WRs (-r / QPs posted for each QP's region), as perftest
  -I, --inline_size=N     taken (0..912) and disabled, as perftest on rxe and any device it
                          does not know: it says "Device not recognized to implement inline
                          feature. Disabling it" and sends without inline data (the header's
                          "Max inline data : 0[B]"); WRITE and SEND tests only, as perftest
  -U, --report-unsorted   latency tests: print every latency as measured ("N, usec" lines),
                          then the row, as perftest (which refuses -U and -H in the others)
  -H, --report-histogram  latency tests: print the sorted latencies, then the row, as perftest
      --output=WHAT       print only the figure, as perftest: bandwidth or message_rate (the
                          average, bandwidth tests) or latency (the average, latency tests),
                          one "%%f" line per result; no banner, header or table
      --mr_per_qp         a buffer and memory region per QP (its own RKey), as perftest; without
                          it one MR serves all QPs
      --tclass=TC         traffic class of the test QPs, 0..255 (default 0): the IP DSCP/ECN
                          byte of their packets, as perftest's GRH traffic class (not with -R)
  -S, --sl=SL             accepted (0..15) with no effect: RoCEv2 packets carry no SL (rxe
                          drops it too)
  -x, --gid-index=IDX     accepted for compatibility (the GID is the local address)
  -d, --ib-dev=DEV        accepted for compatibility
  -i, --ib-port=PORT      accepted, must be 1
  -F, --CPU-freq          accepted (no CPU frequency check is made)
  -c, --connection=TYPE   RC, the only connection type (UC or UD are refused)
  -N, --noPeak            no peak bandwidth: the row's peak is 0.00, as perftest's (which
                          also computes none with -n above 20000)
      --report_gbits      bandwidth columns in Gb/s (10^9 bits) instead of MB/sec (2^20
                          bytes), as perftest; each side prints the peer's report in the
                          peer's unit, as perftest does (the latency tests ignore it)
  -e, --events            sleep until packets arrive; without it the latency tests poll
                          their socket for up to 100 µs per wait (--busy-poll sets how
                          long), as perftest polls its CQ
      --bind=IP           local IP for RoCEv2 (default: the local end of the TCP connection);
                          a server with --bind opens UDP 4791 there before it waits
      --pcap=FILE         write every RoCEv2 packet sent and received to FILE (pcap,
                          buffered: the stack pays only for the copy)
      --snaplen=N         with --pcap, keep at most N bytes of each frame, as tcpdump -s
                          (128 keeps every header; default 0 = whole frames)
      --check             fill the source with a pattern and verify the data at the end
                          (both sides must be rocev2d with the same flags)
      --connect-timeout=D how long a client keeps trying to reach the server (default 10s)
      --timeout=D         give up when the whole run takes longer (default 0 = no limit)
  -v                      print the device counters at the end (also on SIGUSR1) and
                          each QP's loss recovery (go-back-N or selective repeat)
      --selective-repeat  recover from loss by resending only what is missing (IRN-style);
                          only with a rocev2d peer that sets it too (with -R the CM's ECE
                          exchange checks that; rxe and other peers keep go-back-N)

A side whose peer has ended its data phase (or closed the connection) gives up
once its own has moved no packet for 5 s; so does a SEND side whose SENDs meet
only RNR NAKs for 5 s (the peer posts no receives). perftest's exchange names no
test, but a WRITE or SEND side refuses a peer that announces more than one
outstanding READ (perftest's READ and atomic tests do).
`, t, tool, defSize, defIters, defTx) + cli.SocketUsage
}

// perfConfig holds the parsed flags of a perftest subcommand.
type perfConfig struct {
	test        oob.PerfTest
	size        int
	iters       int
	all         bool
	duration    int
	mtu         oob.MTU
	txDepth     int
	rxDepth     int
	qpTimeout   int
	atomicType  string
	port        int
	gidIdx      int
	dev         string
	ibPort      int
	cpuFreq     bool
	bind        netip.Addr
	check       bool
	pcap        string
	snaplen     int
	connTimeout time.Duration
	timeout     time.Duration
	verbose     bool
	sr          bool // --selective-repeat: offer selective repeat (both sides must set it)
	events      bool
	rdmaCM      bool   // -R: connect the QPs through rdma_cm, exchange over it
	bidi        bool   // -b: both sides run the data phase (perftest's duplex)
	qps         int    // -q: QPs (bandwidth tests)
	gbits       bool   // --report_gbits: bandwidth in Gb/s instead of MB/s
	runInf      bool   // --run_infinitely: report every -D seconds until interrupted
	cqMod       int    // -Q: signal one send WR in cqMod (perftest's effective value)
	postList    int    // -l: post lists of postList send WRs, one post call each
	tclass      int    // --tclass: the QPs' traffic class (IP DSCP/ECN byte)
	sl          int    // -S: accepted, no effect on RoCEv2
	noPeak      bool   // -N, or perftest's own choice: no peak bandwidth (0.00)
	useSRQ      bool   // --use-srq: the QPs take their receives from one SRQ
	inline      int    // -I: taken and disabled, as perftest on a device it does not know (-1: not given)
	unsorted    bool   // -U: print the latencies unsorted (latency tests)
	histogram   bool   // -H: print the sorted latencies (latency tests)
	output      string // --output: bandwidth, message_rate or latency alone ("": everything)
	mrPerQP     bool   // --mr_per_qp: a buffer and MR per QP
	// notes are the lines perftest prints to stdout while it parses
	// its flags (its CQ moderation notices), printed first.
	notes  []string
	sock   cli.SocketFlags
	server string
}

// perfMaxSize is perftest's MAX_SIZE, the largest size of -a.
const perfMaxSize = 1 << 23

// perfDefaults are the defaults of -s, -n and -t, perftest's for t.
func perfDefaults(t oob.PerfTest) (size, iters, txDepth int) {
	if t.IsBW() {
		return 65536, 5000, 128
	}
	return 2, 1000, 1
}

func parsePerfFlags(t oob.PerfTest, args []string) (*perfConfig, error) {
	c := &perfConfig{test: t}
	fs := cli.NewFlagSet(t.String())
	defSize, defIters, defTx := perfDefaults(t)
	var mtu int
	var bind string
	cli.IntFlags(fs, &c.size, "s", "size", defSize)
	cli.IntFlags(fs, &c.iters, "n", "iters", defIters)
	cli.BoolFlags(fs, &c.all, "a", "all")
	cli.IntFlags(fs, &c.duration, "D", "duration", 0)
	cli.IntFlags(fs, &mtu, "m", "mtu", 1024)
	cli.IntFlags(fs, &c.txDepth, "t", "tx-depth", defTx)
	cli.IntFlags(fs, &c.rxDepth, "r", "rx-depth", 512)
	cli.IntFlags(fs, &c.qps, "q", "qp", 1)
	cli.BoolFlags(fs, &c.events, "e", "events")
	cli.IntFlags(fs, &c.qpTimeout, "u", "qp-timeout", 14)
	cli.StringFlags(fs, &c.atomicType, "A", "atomic_type", "FETCH_AND_ADD")
	cli.IntFlags(fs, &c.port, "p", "port", oob.DefaultPort)
	cli.IntFlags(fs, &c.gidIdx, "x", "gid-index", -1)
	cli.StringFlags(fs, &c.dev, "d", "ib-dev", "")
	cli.IntFlags(fs, &c.ibPort, "i", "ib-port", 1)
	cli.BoolFlags(fs, &c.cpuFreq, "F", "CPU-freq")
	cli.BoolFlags(fs, &c.rdmaCM, "R", "rdma_cm")
	cli.BoolFlags(fs, &c.bidi, "b", "bidirectional")
	fs.BoolVar(&c.gbits, "report_gbits", false, "")
	fs.BoolVar(&c.runInf, "run_infinitely", false, "")
	cli.IntFlags(fs, &c.cqMod, "Q", "cq-mod", perfDefCQMod)
	cli.IntFlags(fs, &c.postList, "l", "post_list", 1)
	fs.IntVar(&c.tclass, "tclass", 0, "")
	cli.BoolFlags(fs, &c.noPeak, "N", "noPeak")
	fs.BoolVar(&c.useSRQ, "use-srq", false, "")
	cli.IntFlags(fs, &c.inline, "I", "inline_size", -1)
	cli.BoolFlags(fs, &c.unsorted, "U", "report-unsorted")
	cli.BoolFlags(fs, &c.histogram, "H", "report-histogram")
	fs.StringVar(&c.output, "output", "", "")
	fs.BoolVar(&c.mrPerQP, "mr_per_qp", false, "")
	cli.IntFlags(fs, &c.sl, "S", "sl", 0)
	var conn string
	cli.StringFlags(fs, &conn, "c", "connection", "RC")
	var commCM bool
	cli.BoolFlags(fs, &commCM, "z", "comm_rdma_cm")
	fs.StringVar(&bind, "bind", "", "")
	fs.BoolVar(&c.check, "check", false, "")
	fs.StringVar(&c.pcap, "pcap", "", "")
	fs.IntVar(&c.snaplen, "snaplen", 0, "")
	fs.DurationVar(&c.connTimeout, "connect-timeout", 10*time.Second, "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.verbose, "v", false, "")
	fs.BoolVar(&c.sr, "selective-repeat", false, "")
	cli.AddSocketFlags(fs, &c.sock)
	var err error
	if c.server, err = cli.ParseWithServer(fs, args); err != nil {
		return nil, perftestOnlyFlag(err)
	}
	if conn != "RC" {
		// perftest's exchange does not carry the connection type: a UC or
		// UD peer would only fail in the data phase.
		return nil, fmt.Errorf("-c %s: rocev2d's perftest commands run RC only (UC and UD are in uc-pingpong and ud-pingpong); both sides need -c RC, perftest's default", conn)
	}
	var ok bool
	if c.mtu, ok = oob.MTUFromBytes(mtu); !ok {
		return nil, cli.ErrMTUFlag(mtu)
	}
	if commCM {
		return nil, errors.New("-z (exchange over rdma_cm, QPs connected without it) is not supported; -R connects the QPs through rdma_cm too")
	}
	isAtomic := t == oob.AtomicBW || t == oob.AtomicLat
	if isAtomic {
		if c.size != 8 && flagSet(fs, "s", "size") {
			// perftest: "Message size cannot be changed for Atomic tests".
			return nil, fmt.Errorf("-s %d: the message size of the atomic tests cannot be changed (always 8 bytes)", c.size)
		}
		c.size = 8
		if c.all {
			return nil, errors.New("-a: atomic tests have one size (8 bytes)")
		}
	}
	if c.runInf {
		if err := c.checkRunInfinitely(fs); err != nil {
			return nil, err
		}
	}
	switch c.atomicType {
	case "CMP_AND_SWAP", "FETCH_AND_ADD":
	default:
		return nil, fmt.Errorf("-A %q: atomic type must be CMP_AND_SWAP or FETCH_AND_ADD", c.atomicType)
	}
	switch {
	case c.size < 1 || c.size > perfMaxSize:
		return nil, fmt.Errorf("-s %d: size out of range 1..%d", c.size, perfMaxSize)
	case c.iters < 5 || c.iters > 100000000:
		return nil, fmt.Errorf("-n %d: iterations must be between 5 and 100000000", c.iters)
	case c.duration < 0 || (c.duration == 0 && flagSet(fs, "D", "duration")):
		return nil, fmt.Errorf("-D %d: duration must be greater than 0", c.duration)
	case c.duration > 0 && !t.IsBW():
		return nil, fmt.Errorf("-D: duration mode is implemented for the bandwidth tests only")
	case c.bidi && !t.IsBW():
		return nil, errors.New("-b: bidirectional mode is for the bandwidth tests")
	case c.bidi && c.duration > 0:
		return nil, errors.New("-b with -D is not supported; use -n")
	case c.duration > 0 && c.all:
		return nil, errors.New("-D and -a cannot be combined")
	case c.qps < 1 || c.qps > oob.MaxPerfQPs:
		return nil, fmt.Errorf("-q %d: number of QPs must be between 1 and %d", c.qps, oob.MaxPerfQPs)
	case c.qps != 1 && !t.IsBW():
		return nil, fmt.Errorf("-q %d: multiple QPs only available on bw tests (as perftest)", c.qps)
	case c.txDepth < 1 || c.txDepth > 15000:
		return nil, fmt.Errorf("-t %d: tx depth must be between 1 and 15000", c.txDepth)
	case c.rxDepth < 1 || c.rxDepth > 16384:
		return nil, fmt.Errorf("-r %d: rx depth must be between 1 and 16384", c.rxDepth)
	case c.qpTimeout < 0 || c.qpTimeout > 31:
		return nil, fmt.Errorf("-u %d: QP timeout must be between 0 and 31", c.qpTimeout)
	case c.port < 1 || c.port > 65535:
		return nil, fmt.Errorf("-p %d: port out of range 1..65535", c.port)
	case c.ibPort != 1:
		return nil, fmt.Errorf("-i %d: rocev2d devices have one port, 1", c.ibPort)
	case c.gidIdx < -1 || c.gidIdx > 64:
		return nil, fmt.Errorf("-x %d: GID index must be between 0 and 64", c.gidIdx)
	case c.connTimeout <= 0:
		return nil, fmt.Errorf("--connect-timeout %v: must be positive", c.connTimeout)
	case c.timeout < 0:
		return nil, fmt.Errorf("--timeout %v: negative", c.timeout)
	case c.useSRQ && t != oob.SendBW && t != oob.SendLat:
		// perftest: "Using SRQ only avavilible in SEND tests."
		return nil, errors.New("--use-srq: a shared receive queue is only available in the SEND tests (as perftest)")
	case c.useSRQ && c.qps > c.rxDepth:
		// perftest: "Using SRQ depth should be greater than number of QPs."
		return nil, fmt.Errorf("--use-srq with -q %d: the SRQ depth (-r %d) must be at least the number of QPs (as perftest)", c.qps, c.rxDepth)
	case flagSet(fs, "I", "inline_size") && (c.inline < 0 || c.inline > perfMaxInline):
		return nil, fmt.Errorf("-I %d: inline size must be between 0 and %d (as perftest)", c.inline, perfMaxInline)
	case flagSet(fs, "I", "inline_size") && (t == oob.ReadBW || t == oob.ReadLat || t == oob.AtomicBW || t == oob.AtomicLat):
		// perftest: " Inline feature not available on READ/Atomic verbs".
		return nil, fmt.Errorf("-I %d: inline data is not available in the READ and atomic tests (as perftest)", c.inline)
	case c.output != "" && c.output != "bandwidth" && c.output != "message_rate" && c.output != "latency":
		return nil, fmt.Errorf("--output=%s: must be bandwidth, latency or message_rate (as perftest)", c.output)
	case c.output == "latency" && t.IsBW():
		// perftest: "Output verbosity level for BW can be: bandwidth, message_rate".
		return nil, errors.New("--output=latency: the bandwidth tests' output can be bandwidth or message_rate (as perftest)")
	case c.output != "" && c.output != "latency" && !t.IsBW():
		// perftest: "Output verbosity level for LAT can be: latency".
		return nil, fmt.Errorf("--output=%s: the latency tests' output can be latency (as perftest)", c.output)
	case c.tclass < 0 || c.tclass > 255:
		return nil, fmt.Errorf("--tclass %d: traffic class must be between 0 and 255", c.tclass)
	case c.tclass != 0 && c.rdmaCM:
		// perftest gives --tclass only to QPs it connects itself (not
		// -R's; their TOS is -T, --tos).
		return nil, fmt.Errorf("--tclass %d with -R: perftest sets it only on QPs it connects without rdma_cm (with -R it takes -T/--tos, which rocev2d does not support)", c.tclass)
	case c.sl < 0 || c.sl > 15:
		// perftest: " Only 15 Service levels".
		return nil, fmt.Errorf("-S %d: service level must be between 0 and 15", c.sl)
	case c.unsorted && t.IsBW():
		// perftest: " is Available only on Latency tests".
		return nil, errors.New("-U/--report-unsorted: available only in the latency tests (as perftest)")
	case c.histogram && t.IsBW():
		// perftest: " Available only on Latency tests".
		return nil, errors.New("-H/--report-histogram: available only in the latency tests (as perftest)")
	case c.snaplen < 0:
		return nil, fmt.Errorf("--snaplen %d: must be 0 (whole frames) or more", c.snaplen)
	case c.snaplen > 0 && c.pcap == "":
		return nil, fmt.Errorf("--snaplen %d needs --pcap", c.snaplen)
	}
	if err := c.setCQMod(fs); err != nil {
		return nil, err
	}
	if t.IsBW() && c.duration == 0 && c.iters > perfNoPeakIters {
		c.noPeak = true // perftest: no peak above 20000 iterations
	}
	if c.bind, err = cli.ParseBind(bind); err != nil {
		return nil, err
	}
	if c.server != "" {
		if c.server, err = cli.PeerArg("server", c.server, "-p"); err != nil {
			return nil, err
		}
	}
	if c.rdmaCM && c.server == "" && !c.bind.IsValid() {
		return nil, errors.New("-R as a server needs --bind IP: the local address to accept rdma_cm connections and run RoCEv2 on")
	}
	return c, nil
}

// perftest's CQ moderation: DEF_CQ_MOD, MAX_CQ_MOD and
// MSG_SIZE_CQ_MOD_LIMIT, above which it signals every WR unless -Q is given.
const (
	perfDefCQMod       = 100
	perfMaxCQMod       = 1024
	perfCQModSizeLimit = 8192
)

// setCQMod checks -Q and -l and sets the CQ moderation perftest 4.5 runs
// with (force_dependecies): -Q, by default 100, but 1 for messages over
// 8 KiB unless -Q, -a or -e is given; at most the TX depth; with -l and
// without -Q the post list's size. It refuses what perftest refuses, in
// its words.
func (c *perfConfig) setCQMod(fs *flag.FlagSet) error {
	reqQ := flagSet(fs, "Q", "cq-mod")
	durationMode := flagSet(fs, "D", "duration")
	switch {
	case c.cqMod < 1 || c.cqMod > perfMaxCQMod:
		return fmt.Errorf("-Q %d: CQ moderation must be between 1 and %d", c.cqMod, perfMaxCQMod)
	case c.postList < 1:
		return fmt.Errorf("-l %d: the post list size must be at least 1", c.postList)
	case c.postList > 1 && !c.test.IsBW():
		return fmt.Errorf("-l %d: post lists are supported in the bandwidth tests only (as perftest)", c.postList)
	case c.postList > 1 && !durationMode && c.iters%c.postList != 0:
		return fmt.Errorf("-l %d: the number of iterations (-n %d) must be a multiple of the post list size (as perftest)", c.postList, c.iters)
	case c.postList > 1 && reqQ && c.postList%c.cqMod != 0:
		return fmt.Errorf("-l %d with -Q %d: the post list size must be a multiple of the CQ moderation (as perftest)", c.postList, c.cqMod)
	case c.postList > c.sendWindow():
		// perftest would never post: a list must fit in the TX window.
		return fmt.Errorf("-l %d: larger than the TX depth (-t %d, at most -n), no list would fit in the send queue", c.postList, c.txDepth)
	}
	if c.size > perfCQModSizeLimit && !c.all && !c.events {
		if !reqQ {
			c.cqMod = 1
		} else if c.cqMod > 1 {
			c.notes = append(c.notes, strings.TrimSuffix(perfLine, "\n"),
				"Warning: Large message requested and CQ moderation enabled",
				"Warning: It can lead to inaccurate results")
		}
	}
	c.cqMod = min(c.cqMod, c.sendWindow())
	if c.postList > 1 && !reqQ {
		c.cqMod = c.postList
		c.notes = append(c.notes, strings.TrimSuffix(perfLine, "\n"),
			"Post List requested - CQ moderation will be the size of the post list")
	}
	return nil
}

// sendWindow is the bandwidth tests' TX depth: -t, at most -n (perftest
// lowers -t to -n, rocev2d with -D too).
func (c *perfConfig) sendWindow() int {
	if c.test.IsBW() {
		return min(c.txDepth, c.iters)
	}
	return 1
}

// perfMaxInline is perftest's MAX_INLINE, the largest -I.
const perfMaxInline = 912

// perfInlineDisabled is what perftest 4.5 says, with -I, on a device it
// does not know to send inline (rxe among them), before it runs with no
// inline data: rocev2d does the same (its sends read the data when they
// go out; perftest's buffers do not change during a run, so the wire is
// the same either way).
const perfInlineDisabled = "Device not recognized to implement inline feature. Disabling it"

// perfNoPeakIters is the -n above which perftest 4.5's bandwidth tests
// compute no peak, as with -N (force_dependecies).
const perfNoPeakIters = 20000

// perfDefaultDuration is perftest's DEF_DURATION: the period of
// --run_infinitely without -D.
const perfDefaultDuration = 5

// checkRunInfinitely refuses what perftest 4.5's --run_infinitely refuses
// (the latency tests, -e, send-bw -b) and what rocev2d does not run
// infinitely, and sets the period: -D, perftest's 5 s without it.
func (c *perfConfig) checkRunInfinitely(fs *flag.FlagSet) error {
	switch {
	case !c.test.IsBW():
		// perftest: "run_infinitely exists only in BW tests for now".
		return errors.New("--run_infinitely: exists only in the bandwidth tests (as perftest)")
	case c.events:
		// perftest: "run_infinitely does not support events feature yet".
		return errors.New("--run_infinitely with -e: perftest's run_infinitely does not support events")
	case c.bidi && c.test == oob.SendBW:
		// perftest: "run_infinitely mode is not supported in SEND
		// Bidirectional BW test".
		return errors.New("--run_infinitely with -b: not supported in the SEND bidirectional test (as perftest)")
	case c.bidi:
		return errors.New("--run_infinitely with -b is not supported by rocev2d")
	case c.all:
		return errors.New("--run_infinitely with -a: one size runs infinitely; drop -a")
	case c.rdmaCM:
		return errors.New("--run_infinitely with -R is not supported by rocev2d")
	case c.check:
		return errors.New("--run_infinitely with --check: the data is checked at the end of a run, which never comes")
	}
	if !flagSet(fs, "D", "duration") {
		c.duration = perfDefaultDuration
	}
	return nil
}

// perftestOnlyFlags are perftest 4.5 options rocev2d does not take, by the
// name flag reports: refused naming them as perftest's, not as unknown.
var perftestOnlyFlags = map[string]string{
	"g":                  "multicast (UD SEND tests)",
	"mcg":                "multicast (UD SEND tests)",
	"M":                  "multicast group GID",
	"MGID":               "multicast group GID",
	"T":                  "type of service of rdma_cm QPs (-T is --tos in perftest 4.5; --tclass sets the traffic class)",
	"dont_xchg_versions": "no version exchange (perftest 4.5 refuses it itself)",
	"use_old_post_send":  "the old ibv_post_send API",
	"C":                  "report cycles instead of microseconds",
	"report-cycles":      "report cycles instead of microseconds",
	"O":                  "dual port",
	"dualport":           "dual port",
	"odp":                "on-demand paging",
	"cpu_util":           "CPU utilisation",
	"report-both":        "both directions' reports",
	"reversed":           "reversed traffic direction",
	"inline_recv":        "inline receive",
	"latency_gap":        "a delay between posts",
	"retry_count":        "the QP retry count",
	"rate_limit":         "rate limiting",
	"burst_size":         "rate limiting burst size",
	"rate_units":         "rate limiting units",
	"rate_limit_type":    "rate limiting type",
	"ipv6":               "an IPv6 GID (rocev2d: --bind an IPv6 address)",
	"pkey_index":         "a P_Key index",
	"use_hugepages":      "huge pages",
	"use-null-mr":        "a null memory region",
	"tos":                "type of service of rdma_cm QPs (--tclass sets the traffic class)",
}

// perftestOnlyFlag rewrites flag's "flag provided but not defined" for an
// option perftest has and rocev2d does not.
func perftestOnlyFlag(err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	what, ok := perftestOnlyFlags[name]
	if !ok {
		return err
	}
	dash := "--"
	if len(name) == 1 {
		dash = "-"
	}
	return fmt.Errorf("%s%s: perftest's %s, not supported by rocev2d", dash, name, what)
}

// sizes returns the message sizes of the run.
func (c *perfConfig) sizes() []int {
	if !c.all {
		return []int{c.size}
	}
	var s []int
	for n := 2; n <= perfMaxSize; n <<= 1 {
		s = append(s, n)
	}
	return s
}

func (c *perfConfig) role() oob.Role {
	if c.server == "" {
		return oob.Server
	}
	return oob.Client
}

// flagSet reports whether any of names was given on the command line.
func flagSet(fs *flag.FlagSet, names ...string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		for _, n := range names {
			set = set || f.Name == n
		}
	})
	return set
}
