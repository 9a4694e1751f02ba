package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

func init() {
	for _, t := range []oob.PerfTest{oob.WriteBW, oob.ReadBW, oob.SendBW, oob.AtomicBW, oob.WriteLat, oob.ReadLat, oob.SendLat, oob.AtomicLat} {
		t := t
		title := perfTitle(t, "")
		title = strings.ReplaceAll(title, "  ", " ")
		register(t.String(), "perftest-compatible "+title+" (ib_"+strings.ReplaceAll(t.String(), "-", "_")+")",
			perfUsage(t), func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
				return runPerf(ctx, t, args, stdout, stderr)
			})
	}
}

// perfUsage is the help text of one perftest subcommand.
func perfUsage(t oob.PerfTest) string {
	tool := "ib_" + strings.ReplaceAll(t.String(), "-", "_")
	defSize, defIters, defTx := 65536, 5000, 128
	if !t.IsBW() {
		defSize, defIters, defTx = 2, 1000, 1
	}
	return fmt.Sprintf(`usage: rocev2d %[1]s [options] [server]

Compatible with perftest 4.5's %[2]s: the same flags, the same out-of-band
exchange on TCP (default port 18515) and the same result table, so either
side may be rocev2d or the real tool. Without a server argument it waits for
a client (the server); with one it connects to it (the client). RoCEv2 runs
over a UDP socket on port 4791 of the local address.

options:
  -s, --size=BYTES        message size (default %[3]d; atomics always 8)
  -n, --iters=N           iterations (default %[4]d, at least 5)
  -a, --all               run sizes 2, 4, ... 8388608 (not for atomics)
  -D, --duration=SEC      run for SEC seconds instead of -n (bandwidth tests)
  -m, --mtu=MTU           path MTU 256..4096 (default 1024; the smaller of both sides wins)
  -t, --tx-depth=N        outstanding send work requests (default %[5]d)
  -r, --rx-depth=N        receives posted (SEND tests, default 512)
  -u, --qp-timeout=T      local ACK timeout exponent (default 14)
  -A, --atomic_type=TYPE  CMP_AND_SWAP or FETCH_AND_ADD (default FETCH_AND_ADD)
  -p, --port=PORT         out-of-band TCP port (default 18515)
  -x, --gid-index=IDX     accepted for compatibility (the GID is the local address)
  -d, --ib-dev=DEV        accepted for compatibility
  -i, --ib-port=PORT      accepted, must be 1
  -F, --CPU-freq          accepted (no CPU frequency check is made)
  -e, --events            sleep until packets arrive; without it the latency tests poll
                          their socket for up to 100 µs per wait (--busy-poll sets how
                          long), as perftest polls its CQ
      --bind=IP           local IP for RoCEv2 (default: the local end of the TCP connection)
      --pcap=FILE         write every RoCEv2 packet sent and received to FILE (pcap)
      --check             fill the source with a pattern and verify the data at the end
                          (both sides must be rocev2d with the same flags)
      --connect-timeout=D how long a client keeps trying to reach the server (default 10s)
      --timeout=D         give up when the whole run takes longer (default 0 = no limit)
  -v                      print the device counters at the end (also on SIGUSR1)
`, t, tool, defSize, defIters, defTx)
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
	connTimeout time.Duration
	timeout     time.Duration
	verbose     bool
	events      bool
	server      string
}

// perfMaxSize is perftest's MAX_SIZE, the largest size of -a.
const perfMaxSize = 1 << 23

func parsePerfFlags(t oob.PerfTest, args []string) (*perfConfig, error) {
	c := &perfConfig{test: t}
	fs := flag.NewFlagSet(t.String(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	intFlag := func(p *int, short, long string, def int) {
		fs.IntVar(p, short, def, "")
		fs.IntVar(p, long, def, "")
	}
	boolFlag := func(p *bool, short, long string) {
		fs.BoolVar(p, short, false, "")
		fs.BoolVar(p, long, false, "")
	}
	defSize, defIters, defTx := 65536, 5000, 128
	if !t.IsBW() {
		defSize, defIters, defTx = 2, 1000, 1
	}
	var mtu int
	var bind string
	intFlag(&c.size, "s", "size", defSize)
	intFlag(&c.iters, "n", "iters", defIters)
	boolFlag(&c.all, "a", "all")
	intFlag(&c.duration, "D", "duration", 0)
	intFlag(&mtu, "m", "mtu", 1024)
	intFlag(&c.txDepth, "t", "tx-depth", defTx)
	intFlag(&c.rxDepth, "r", "rx-depth", 512)
	boolFlag(&c.events, "e", "events")
	intFlag(&c.qpTimeout, "u", "qp-timeout", 14)
	fs.StringVar(&c.atomicType, "A", "FETCH_AND_ADD", "")
	fs.StringVar(&c.atomicType, "atomic_type", "FETCH_AND_ADD", "")
	intFlag(&c.port, "p", "port", oob.DefaultPort)
	intFlag(&c.gidIdx, "x", "gid-index", -1)
	fs.StringVar(&c.dev, "d", "", "")
	fs.StringVar(&c.dev, "ib-dev", "", "")
	intFlag(&c.ibPort, "i", "ib-port", 1)
	boolFlag(&c.cpuFreq, "F", "CPU-freq")
	fs.StringVar(&bind, "bind", "", "")
	fs.BoolVar(&c.check, "check", false, "")
	fs.StringVar(&c.pcap, "pcap", "", "")
	fs.DurationVar(&c.connTimeout, "connect-timeout", 10*time.Second, "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.verbose, "v", false, "")
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if c.server != "" {
			return nil, fmt.Errorf("unexpected argument %q after server %q", rest[0], c.server)
		}
		c.server, args = rest[0], rest[1:]
	}
	var ok bool
	if c.mtu, ok = oob.MTUFromBytes(mtu); !ok {
		return nil, errMTUFlag(mtu)
	}
	isAtomic := t == oob.AtomicBW || t == oob.AtomicLat
	if isAtomic {
		c.size = 8
		if c.all {
			return nil, errors.New("-a: atomic tests have one size (8 bytes)")
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
	case c.duration < 0:
		return nil, fmt.Errorf("-D %d: duration must be positive", c.duration)
	case c.duration > 0 && !t.IsBW():
		return nil, fmt.Errorf("-D: duration mode is implemented for the bandwidth tests only")
	case c.duration > 0 && c.all:
		return nil, errors.New("-D and -a cannot be combined")
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
	}
	if bind != "" {
		a, err := netip.ParseAddr(bind)
		if err != nil {
			return nil, fmt.Errorf("--bind %q: not an IP address", bind)
		}
		c.bind = a.Unmap()
	}
	return c, nil
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

func runPerf(ctx context.Context, t oob.PerfTest, args []string, stdout, stderr io.Writer) int {
	c, err := parsePerfFlags(t, args)
	if code, done := flagsResult(t.String(), perfUsage(t), err, stdout, stderr); done {
		return code
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("--timeout %v reached", c.timeout))
		defer cancel()
	}
	if err := perfRun(ctx, c, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "rocev2d %s: %v\n", t, err)
		return exitFail
	}
	return exitOK
}

// perfConnect opens the out-of-band TCP connection. The client retries
// until connTimeout; the server accepts one client.
func perfConnect(ctx context.Context, c *perfConfig) (net.Conn, error) {
	port := strconv.Itoa(c.port)
	if c.server != "" {
		addr := net.JoinHostPort(c.server, port)
		deadline := time.Now().Add(c.connTimeout)
		var lastErr error
		for delay := 20 * time.Millisecond; ; delay = min(delay*2, 500*time.Millisecond) {
			d := net.Dialer{Deadline: deadline}
			if c.bind.IsValid() {
				d.LocalAddr = &net.TCPAddr{IP: c.bind.AsSlice()}
			}
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				return conn, nil
			}
			lastErr = err
			if ctx.Err() != nil || time.Now().Add(delay).After(deadline) {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("couldn't connect to %s (server %s, TCP port %d): %v (%v)", addr, c.server, c.port, lastErr, context.Cause(ctx))
		}
		return nil, fmt.Errorf("couldn't connect to server %s on TCP port %d within %v (is `%s` running there as a server?): %v",
			c.server, c.port, c.connTimeout, c.test, lastErr)
	}
	return acceptOne(ctx, c.port, func(err error) error {
		return fmt.Errorf("TCP port %d is in use (another server running?); pick another with -p: %w", c.port, err)
	})
}

// perfSide is one side of a perftest run: device, memory, CQs and QP.
type perfSide struct {
	c       *perfConfig
	dev     *transport.Device
	pd      *memreg.PD
	mem     []byte // mmap'd: [0, half) source, [half, 2*half+cycle) target
	half    int
	mr      *memreg.MR
	scq     *transport.CQ
	rcq     *transport.CQ
	qp      *transport.QP
	psn     uint32
	params  oob.Params // negotiated
	remote  oob.PerfDest
	local   oob.PerfDest
	capture *pcaptap.Writer
	posted  int // receives outstanding
	results []perfResult
	srvRecv perfResult // send-bw server's own measurement
}

// perfResult is the measurement of one size.
type perfResult struct {
	size      int
	iters     int
	tposted   []time.Time
	tcomplete []time.Time
	start     time.Time
	end       time.Time
	recvd     uint64
}

const perfCycle = 4096 // cycle buffer: the page size, as perftest

func (s *perfSide) recvBase() uint64 { return s.mr.IOVA() + uint64(s.half) }

// inc is perftest's INC(size, cache line): the step between slots.
func perfInc(size, line int) int { return (size + line - 1) / line * line }

// slotOff is the offset of iteration i's message in the source and target
// regions: messages cycle through the cycle buffer when they fit in half of
// it (perftest's increase_loc_addr / increase_rem_addr).
func (s *perfSide) slotOff(size int, i uint64) uint64 {
	cycle := int(s.params.CycleBuffer)
	if cycle == 0 {
		cycle = perfCycle
	}
	if size > cycle/2 || !s.c.test.IsBW() {
		return 0 // latency tests use one address, as perftest
	}
	inc := perfInc(size, int(max(s.params.CacheLine, 1)))
	return (i % uint64(cycle/inc)) * uint64(inc)
}

func newPerfSide(c *perfConfig, local netip.Addr) (*perfSide, error) {
	opts := linkOptions(!c.test.IsBW() && !c.events)
	link, err := udp.ListenSocket(local, &opts)
	if err != nil {
		hint := ""
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			hint = " (port 4791 on that address is taken — by a kernel rxe device or another rocev2d; use --bind with another address)"
		case errors.Is(err, syscall.EADDRNOTAVAIL):
			hint = " (address not configured here; pass --bind with a local address)"
		}
		return nil, fmt.Errorf("RoCEv2 on %s: %w%s", netip.AddrPortFrom(local, udp.Port), err, hint)
	}
	var dlink udp.Link = link
	var capture *pcaptap.Writer
	if c.pcap != "" {
		f, err := os.Create(c.pcap)
		if err != nil {
			link.Close()
			return nil, fmt.Errorf("--pcap: %w", err)
		}
		if capture, err = pcaptap.NewWriter(f); err != nil {
			f.Close()
			link.Close()
			return nil, fmt.Errorf("--pcap %s: %w", c.pcap, err)
		}
		dlink = pcaptap.New(link, capture, pcaptap.Both)
	}
	dev, err := transport.NewDevice(dlink, transport.DeviceConfig{})
	if err != nil {
		link.Close()
		if capture != nil {
			capture.Close()
		}
		return nil, err
	}
	s := &perfSide{c: c, dev: dev, capture: capture, psn: rand.Uint32() & 0xffffff}
	maxSize := slices.Max(c.sizes())
	s.half = (max(maxSize, perfCycle) + 4095) &^ 4095
	s.mem, err = unix.Mmap(-1, 0, 2*s.half+perfCycle, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("allocating %d bytes: %w", 2*s.half+perfCycle, err)
	}
	if s.pd, err = dev.AllocPD(); err != nil {
		s.close()
		return nil, err
	}
	access := memreg.AccessLocalWrite | memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic
	if s.mr, err = s.pd.RegisterMR(s.mem, access); err != nil {
		s.close()
		return nil, fmt.Errorf("couldn't register MR: %w", err)
	}
	depth := c.txDepth + c.rxDepth + 16
	if s.scq, err = dev.CreateCQ(c.txDepth + 16); err != nil {
		s.close()
		return nil, err
	}
	if s.rcq, err = dev.CreateCQ(depth); err != nil {
		s.close()
		return nil, err
	}
	s.qp, err = dev.CreateQP(s.pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: s.scq, RecvCQ: s.rcq,
		MaxSendWR: c.txDepth + 1, MaxRecvWR: c.rxDepth + 1, MaxSGE: 1})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("couldn't create QP: %w", err)
	}
	a := transport.QPAttr{State: transport.QPSInit, Port: 1, AccessFlags: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic}
	if err := s.qp.Modify(&a, transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags); err != nil {
		s.close()
		return nil, fmt.Errorf("failed to modify QP to INIT: %w", err)
	}
	outReads := uint16(1)
	if c.test == oob.ReadBW || c.test == oob.ReadLat || c.test == oob.AtomicBW || c.test == oob.AtomicLat {
		outReads = 16
	}
	s.local = oob.PerfDest{OutReads: outReads, QPN: s.qp.QPN(), PSN: s.psn, RKey: s.mr.RKey(),
		VAddr: s.recvBase(), GID: dev.GID()}
	return s, nil
}

func (s *perfSide) close() error {
	if s.dev != nil {
		s.dev.Close()
	}
	var err error
	if s.capture != nil {
		err = s.capture.Close()
		s.capture = nil
	}
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
	return err
}

// perfPattern is the byte at offset off of a --check source region.
func perfPattern(off int) byte { return byte(off*131 + off>>8 + 7) }

func fillPattern(b []byte) {
	for i := range b {
		b[i] = perfPattern(i)
	}
}

// perfRun runs one perftest-compatible test.
func perfRun(ctx context.Context, c *perfConfig, stdout, stderr io.Writer) error {
	usr1 := watchSIGUSR1(stderr)
	defer usr1.Stop()
	conn, err := perfConnect(ctx, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	local, err := localAddr(c.bind, conn)
	if err != nil {
		return err
	}
	s, err := newPerfSide(c, local)
	if err != nil {
		return err
	}
	defer s.close()
	if perfTweakLocal != nil {
		perfTweakLocal(&s.local)
	}

	usr1.Add(local.String(), s.dev)

	if c.check {
		fillPattern(s.mem[:s.half])
		fillPattern(s.mem[s.half : 2*s.half])
		if c.test == oob.ReadBW || c.test == oob.ReadLat {
			// READs land in the source region: it must be filled by them.
			clear(s.mem[:s.half])
		} else {
			// The target must be filled by the traffic, not by us.
			clear(s.mem[s.half:])
		}
	}
	role := c.role()
	sizes := c.sizes()
	plan, err := oob.Plan(c.test, role, len(sizes))
	if err != nil {
		return err
	}
	sess := oob.NewPerfSession(conn, role)
	sess.StepTimeout = 30 * time.Second
	if role == oob.Server {
		fmt.Fprintln(stdout, "\n************************************\n* Waiting for client to connect... *\n************************************")
	}
	hooks := oob.Hooks{
		Connect: func(ctx context.Context, remote oob.PerfDest, neg oob.Params) error {
			return s.connect(remote, neg, stdout)
		},
		Prepare: func(ctx context.Context, i int) error { return s.prepare(sizes[i]) },
		Traffic: func(ctx context.Context, i int) (oob.Report, error) {
			return s.traffic(ctx, i, sizes, role, stdout, stderr)
		},
	}
	params := oob.DefaultParams
	params.MTU = c.mtu
	res, err := sess.Run(ctx, plan, params, s.local, hooks)
	if err != nil {
		if errors.Is(err, oob.ErrIncompatibleVersion) {
			return fmt.Errorf("peer %s speaks an incompatible perftest version: %w", conn.RemoteAddr(), err)
		}
		if errors.Is(err, oob.ErrMalformed) {
			return fmt.Errorf("malformed out-of-band message from %s: %w", conn.RemoteAddr(), err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("out-of-band exchange with %s: %w (%v)", conn.RemoteAddr(), err, context.Cause(ctx))
		}
		return fmt.Errorf("out-of-band exchange with %s: %w", conn.RemoteAddr(), err)
	}
	if c.test.IsBW() {
		switch {
		case c.test == oob.SendBW && role == oob.Server:
			printBWLine(stdout, s.srvRecv)
		case role == oob.Server && res.HasReport:
			writeBWLine(stdout, res.RemoteReport)
		}
		fmt.Fprint(stdout, perfLine)
	} else if role == oob.Server && (c.test == oob.ReadLat || c.test == oob.AtomicLat) {
		fmt.Fprint(stdout, perfLine)
	}
	if c.check {
		if err := s.verify(role, sizes); err != nil {
			return fmt.Errorf("--check: %w", err)
		}
		fmt.Fprintln(stdout, " data check: ok")
	}
	if c.verbose {
		printCounters(stdout, local.String(), s.dev)
	}
	if s.capture != nil {
		n := s.capture.Packets()
		if err := s.close(); err != nil {
			return fmt.Errorf("--pcap %s: %w", c.pcap, err)
		}
		fmt.Fprintf(stdout, " wrote %d packets to %s\n", n, c.pcap)
	}
	return nil
}

// usr1Watch prints the counters of its devices whenever the process
// receives SIGUSR1 (so that a long run can be inspected), from the moment
// it is created — before any device exists it says so, instead of letting
// SIGUSR1 terminate the process.
type usr1Watch struct {
	w        io.Writer
	mu       sync.Mutex
	names    []string
	devs     []*transport.Device
	sig      chan os.Signal
	done     chan struct{}
	finished chan struct{}
}

// watchSIGUSR1 starts printing counters to w on SIGUSR1.
func watchSIGUSR1(w io.Writer) *usr1Watch {
	u := &usr1Watch{w: w, sig: make(chan os.Signal, 1), done: make(chan struct{}), finished: make(chan struct{})}
	signal.Notify(u.sig, syscall.SIGUSR1)
	go func() {
		defer close(u.finished)
		for {
			select {
			case <-u.sig:
				u.mu.Lock()
				if len(u.devs) == 0 {
					fmt.Fprintln(u.w, "counters: no device yet (waiting for the peer)")
				}
				for i, d := range u.devs {
					printCounters(u.w, u.names[i], d)
				}
				u.mu.Unlock()
			case <-u.done:
				return
			}
		}
	}()
	return u
}

// Add includes a device in the SIGUSR1 output.
func (u *usr1Watch) Add(name string, d *transport.Device) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.names = append(u.names, name)
	u.devs = append(u.devs, d)
}

// Stop stops watching (SIGUSR1 gets its default action again).
func (u *usr1Watch) Stop() {
	signal.Stop(u.sig)
	close(u.done)
	<-u.finished
}

// perfTweakLocal, if set (by tests), changes the QP data a side announces,
// to provoke errors at the peer.
var perfTweakLocal func(*oob.PerfDest)

// perfLine is perftest's RESULT_LINE.
const perfLine = "---------------------------------------------------------------------------------------\n"

// perfTitle is the test's title line text.
func perfTitle(t oob.PerfTest, atomicType string) string {
	switch t {
	case oob.WriteBW:
		return "RDMA_Write BW Test"
	case oob.ReadBW:
		return "RDMA_Read BW Test"
	case oob.SendBW:
		return "Send BW Test"
	case oob.AtomicBW:
		return "Atomic " + atomicType + " BW Test"
	case oob.WriteLat:
		return "RDMA_Write Latency Test"
	case oob.ReadLat:
		return "RDMA_Read Latency Test"
	case oob.SendLat:
		return "Send Latency Test"
	case oob.AtomicLat:
		return "Atomic " + atomicType + " Latency Test"
	}
	return t.String()
}

// cHex formats like C's "%#0*x": zero is printed without the 0x prefix.
func cHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return "0x" + fmt.Sprintf("%0*x", max(width-2, 0), v)
}

// printDest prints a perftest address line and its GID line.
func (s *perfSide) printDest(w io.Writer, side string, d oob.PerfDest) {
	writePerfDest(w, s.c.test, side, d)
}

// writePerfDest prints d as perftest's ctx_print_pingpong_data does for t.
func writePerfDest(w io.Writer, t oob.PerfTest, side string, d oob.PerfDest) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s", side, cHex(uint64(d.LID), 4), cHex(uint64(d.QPN), 6), cHex(uint64(d.PSN), 6))
	switch t {
	case oob.ReadBW, oob.ReadLat:
		fmt.Fprintf(w, " OUT %s", cHex(uint64(d.OutReads), 4))
		fallthrough
	case oob.WriteBW, oob.WriteLat:
		fmt.Fprintf(w, " RKey %s VAddr %s", cHex(uint64(d.RKey), 8), cHex(d.VAddr, 16))
	}
	fmt.Fprintln(w)
	parts := make([]string, 16)
	for i, b := range d.GID {
		parts[i] = fmt.Sprintf("%02d", b)
	}
	fmt.Fprintf(w, " GID: %s\n", strings.Join(parts, ":"))
}

// printHeader prints perftest's test description block.
func (s *perfSide) printHeader(w io.Writer) {
	c := s.c
	gid := c.gidIdx
	if gid < 0 {
		gid = 1
	}
	writePerfHeader(w, perfHeader{test: c.test, atomicType: c.atomicType, dev: c.dev, role: c.role(),
		txDepth: s.txDepth(), rxDepth: c.rxDepth, mtu: s.params.MTU.Bytes(), gidIdx: gid, outReads: int(s.local.OutReads)})
}

// perfHeader are the values of perftest's description block.
type perfHeader struct {
	test       oob.PerfTest
	atomicType string
	dev        string
	role       oob.Role
	txDepth    int
	rxDepth    int
	mtu        int
	gidIdx     int
	outReads   int
}

// writePerfHeader prints the block in perftest 4.5's layout. CQ moderation
// is 1: rocev2d requests a completion for every work request.
func writePerfHeader(w io.Writer, h perfHeader) {
	fmt.Fprint(w, perfLine)
	fmt.Fprintf(w, "                    %s\n", perfTitle(h.test, h.atomicType))
	dev := h.dev
	if dev == "" {
		dev = "rocev2"
	}
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : %s\n", dev)
	fmt.Fprintf(w, " Number of qps   : 1\t\tTransport type : IB\n")
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	fmt.Fprintf(w, " PCIe relax order: OFF\n")
	fmt.Fprintf(w, " ibv_wr* API     : OFF\n")
	send := h.test == oob.SendBW || h.test == oob.SendLat
	if h.role == oob.Client || !h.test.IsBW() {
		fmt.Fprintf(w, " TX depth        : %d\n", h.txDepth)
	}
	if h.role == oob.Server && send {
		fmt.Fprintf(w, " RX depth        : %d\n", h.rxDepth)
	}
	if h.test.IsBW() {
		fmt.Fprintf(w, " CQ Moderation   : 1\n")
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", h.mtu)
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	fmt.Fprintf(w, " GID index       : %d\n", h.gidIdx)
	reads := h.test == oob.ReadBW || h.test == oob.AtomicBW || h.test == oob.ReadLat || h.test == oob.AtomicLat
	if reads {
		fmt.Fprintf(w, " Outstand reads  : %d\n", h.outReads)
	} else {
		fmt.Fprintf(w, " Max inline data : 0[B]\n")
	}
	fmt.Fprintf(w, " rdma_cm QPs\t : OFF\n")
	fmt.Fprintf(w, " Data ex. method : Ethernet\n")
	fmt.Fprint(w, perfLine)
}

func (s *perfSide) txDepth() int {
	if s.c.test.IsBW() {
		return min(s.c.txDepth, s.c.iters)
	}
	return 1
}

// connect brings the QP to RTR and RTS towards the peer (ctx_connect).
func (s *perfSide) connect(remote oob.PerfDest, neg oob.Params, stdout io.Writer) error {
	s.remote, s.params = remote, neg
	peer, err := peerFromGID(remote.GID, "-x")
	if err != nil {
		return err
	}
	mtu, ok := transport.MTUFromBytes(neg.MTU.Bytes())
	if !ok {
		return fmt.Errorf("negotiated MTU %d is invalid", neg.MTU)
	}
	rd := uint8(min(max(remote.OutReads, 1), 16))
	if err := connectRTS(s.qp, peer, remote.QPN, s.psn, remote.PSN, mtu, rd, uint8(s.c.qpTimeout)); err != nil {
		return err
	}
	s.printHeader(stdout)
	s.printDest(stdout, "local", s.local)
	s.printDest(stdout, "remote", remote)
	fmt.Fprint(stdout, perfLine)
	if s.c.test.IsBW() {
		fmt.Fprintln(stdout, " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]")
	} else {
		fmt.Fprintln(stdout, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
	}
	return nil
}

// prepare posts the receives a SEND test needs before the barrier.
func (s *perfSide) prepare(size int) error {
	c := s.c
	recvSide := c.test == oob.SendLat || (c.test == oob.SendBW && c.role() == oob.Server)
	if !recvSide {
		return nil
	}
	want := min(c.rxDepth, c.iters)
	if c.duration > 0 {
		want = c.rxDepth
	}
	for s.posted < want {
		if err := s.postRecv(); err != nil {
			return err
		}
	}
	return nil
}

func (s *perfSide) postRecv() error {
	// Each receive may take the largest message of the run, at its slot.
	wr := transport.RecvWR{WRID: 0, SGEs: []memreg.SGE{{Addr: s.recvBase(), Length: uint32(s.half), LKey: s.mr.LKey()}}}
	if err := s.qp.PostRecv(wr); err != nil {
		return fmt.Errorf("couldn't post receive: %w", err)
	}
	s.posted++
	return nil
}

// wcError describes a failed completion.
func wcError(wc transport.WC, what string) error {
	return fmt.Errorf("%s completion with error: %s (status %d, wr_id %d, opcode %v) — the peer or the path failed the operation",
		what, wc.Status, uint8(wc.Status), wc.WRID, wc.Opcode)
}

// traffic runs the data phase of size number i.
func (s *perfSide) traffic(ctx context.Context, i int, sizes []int, role oob.Role, stdout, stderr io.Writer) (oob.Report, error) {
	c := s.c
	size := sizes[i]
	switch c.test {
	case oob.WriteBW, oob.ReadBW, oob.AtomicBW:
		if role == oob.Server {
			return oob.Report{}, nil // passive
		}
		return s.bwClient(ctx, size, stdout, stderr)
	case oob.SendBW:
		if role == oob.Server {
			return oob.Report{}, s.sendBWServer(ctx, size)
		}
		return s.bwClient(ctx, size, stdout, stderr)
	case oob.ReadLat, oob.AtomicLat:
		if role == oob.Server {
			return oob.Report{}, nil
		}
		return oob.Report{}, s.latReadAtomic(ctx, size, stdout, newPerfProgress(stderr, size, c.iters))
	case oob.WriteLat:
		return oob.Report{}, s.latWrite(ctx, size, role, stdout, newPerfProgress(stderr, size, c.iters))
	case oob.SendLat:
		return oob.Report{}, s.latSend(ctx, size, role, stdout, newPerfProgress(stderr, size, c.iters))
	}
	return oob.Report{}, fmt.Errorf("unknown test %v", c.test)
}

// sendWR builds the work request for iteration n.
func (s *perfSide) sendWR(size int, n uint64) transport.SendWR {
	off := s.slotOff(size, n)
	wr := transport.SendWR{WRID: n, Flags: transport.SendSignaled,
		SGEs:       []memreg.SGE{{Addr: s.mr.IOVA() + off, Length: uint32(size), LKey: s.mr.LKey()}},
		RemoteAddr: s.remote.VAddr + off, RKey: s.remote.RKey}
	switch s.c.test {
	case oob.WriteBW, oob.WriteLat:
		wr.Opcode = transport.WRWrite
	case oob.ReadBW, oob.ReadLat:
		wr.Opcode = transport.WRRead
	case oob.SendBW, oob.SendLat:
		wr.Opcode = transport.WRSend
		wr.RemoteAddr, wr.RKey = 0, 0
		// Every message from the start of the source region, so that the
		// receiver (which receives at the start of its region) can check it.
		wr.SGEs[0].Addr = s.mr.IOVA()
	case oob.AtomicBW, oob.AtomicLat:
		wr.Opcode = transport.WRFetchAdd
		wr.CompareAdd = 1
		if s.c.atomicType == "CMP_AND_SWAP" {
			wr.Opcode = transport.WRCompareSwap
			wr.CompareAdd, wr.Swap = 0, 0
		}
	}
	return wr
}

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
	writeBWLine(stdout, rep)
	return rep, nil
}

// bwReport computes perftest's bandwidth report: the average over the run
// (first post to last completion) and the peak, the best time per message
// (tcompleted[j]-tposted[i])/(j-i+1) over runs of consecutive messages (up to
// max(window, 1024) long, and the whole run).
func bwReport(r perfResult, window int) oob.Report {
	rep := oob.Report{Size: uint64(r.size), Iters: uint64(r.iters)}
	dur := r.end.Sub(r.start)
	if len(r.tcomplete) > 0 && len(r.tposted) > 0 {
		dur = r.tcomplete[len(r.tcomplete)-1].Sub(r.tposted[0])
	}
	if dur <= 0 {
		dur = time.Nanosecond
	}
	usec := float64(dur.Nanoseconds()) / 1e3
	rep.BWAvg = float64(r.size) * float64(r.iters) / (usec / 1e6) / (1 << 20)
	rep.MsgRate = float64(r.iters) / usec
	if n := min(len(r.tposted), len(r.tcomplete)); n > 0 {
		// The whole run is one candidate, so the peak is never below the
		// average.
		best := float64(r.tcomplete[n-1].Sub(r.tposted[0]).Nanoseconds()) / float64(n)
		span := max(window, 1024)
		for i := 0; i < n; i++ {
			for j := i; j < n && j < i+span; j++ {
				d := float64(r.tcomplete[j].Sub(r.tposted[i]).Nanoseconds()) / float64(j-i+1)
				if d > 0 && d < best {
					best = d
				}
			}
		}
		if !math.IsInf(best, 1) {
			rep.BWPeak = float64(r.size) / (best / 1e9) / (1 << 20)
		}
	}
	return rep
}

// printBWLine prints the send-bw server's own measurement.
func printBWLine(w io.Writer, r perfResult) {
	rep := bwReport(r, 1)
	rep.BWPeak = 0 // perftest's server reports no peak
	writeBWLine(w, rep)
}

// writeBWLine prints a bandwidth result line (perftest's REPORT_FMT).
func writeBWLine(w io.Writer, r oob.Report) {
	fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
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

// checkPattern verifies that b equals the pattern starting at offset off.
func checkPattern(b []byte, off int) error {
	for i, v := range b {
		if want := perfPattern(off + i); v != want {
			return fmt.Errorf("byte %d is 0x%02x, want 0x%02x", off+i, v, want)
		}
	}
	return nil
}

// latReadAtomic is the client of read-lat / atomic-lat: one operation at a
// time.
func (s *perfSide) latReadAtomic(ctx context.Context, size int, stdout io.Writer, prog *perfProgress) error {
	c := s.c
	ts := make([]time.Time, 0, c.iters+1)
	var wc [1]transport.WC
	for n := 0; n < c.iters; n++ {
		prog.tick(n)
		ts = append(ts, time.Now())
		if err := s.postSendWait(ctx, s.sendWR(size, uint64(n)), wc[:], n, "completion", n); err != nil {
			return err
		}
	}
	s.latDone(stdout, size, ts, 1)
	return nil
}

// postSendWait posts wr and waits for its completion on the send CQ, using
// wc[0]. postN, waitWhat and waitN word the errors.
func (s *perfSide) postSendWait(ctx context.Context, wr transport.SendWR, wc []transport.WC, postN int, waitWhat string, waitN int) error {
	if err := s.qp.PostSend(wr); err != nil {
		return fmt.Errorf("couldn't post send %d: %w", postN, err)
	}
	if _, err := s.scq.Wait(ctx, wc[:1]); err != nil {
		return fmt.Errorf("waiting for %s %d: %w", waitWhat, waitN, err)
	}
	if wc[0].Status != transport.WCSuccess {
		return wcError(wc[0], "send")
	}
	return nil
}

// latDone ends a latency run: it stamps the end of the last iteration,
// records the result and prints the latency line.
func (s *perfSide) latDone(stdout io.Writer, size int, ts []time.Time, rtt float64) {
	ts = append(ts, time.Now())
	s.results = append(s.results, perfResult{size: size, iters: s.c.iters})
	printLat(stdout, size, s.c.iters, ts, rtt)
}

// perfProgressEvery is the interval between progress lines on stderr of a
// long run (a variable so tests can shorten it).
var perfProgressEvery = 2 * time.Second

// perfProgress prints a line to stderr every two seconds of a long latency
// run.
type perfProgress struct {
	w           io.Writer
	size, iters int
	start, last time.Time
}

func newPerfProgress(w io.Writer, size, iters int) *perfProgress {
	now := time.Now()
	return &perfProgress{w: w, size: size, iters: iters, start: now, last: now}
}

// tick reports that n iterations are done.
func (p *perfProgress) tick(n int) {
	if n&63 != 0 {
		return
	}
	now := time.Now()
	if now.Sub(p.last) < perfProgressEvery {
		return
	}
	p.last = now
	fmt.Fprintf(p.w, " ... %d bytes: %d of %d iterations in %.1fs\n", p.size, n, p.iters, now.Sub(p.start).Seconds())
}

// pollByte spins until the byte at p equals v (the peer's RDMA WRITE lands
// in mmap'd memory, as a NIC's DMA would).
func pollByte(ctx context.Context, mem []byte, off int, v byte) error {
	word := (*uint32)(unsafe.Pointer(&mem[off&^3]))
	shift := uint(off&3) * 8
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		shift = uint(3-off&3) * 8
	}
	for spins := 0; ; spins++ {
		if byte(atomic.LoadUint32(word)>>shift) == v {
			return nil
		}
		if spins&1023 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
			time.Sleep(time.Microsecond)
		}
	}
}

// latWrite is write-lat: each side writes size bytes into the peer's buffer,
// whose last byte is the iteration count, and spins on its own buffer's last
// byte for the peer's write (perftest's run_iter_lat_write). The server
// waits for the client's first write before writing.
func (s *perfSide) latWrite(ctx context.Context, size int, role oob.Role, stdout io.Writer, prog *perfProgress) error {
	c := s.c
	ts := make([]time.Time, 0, c.iters+1)
	post := size - 1
	poll := s.half + size - 1
	var wc [1]transport.WC
	var scnt, rcnt int
	for scnt < c.iters || rcnt < c.iters {
		// The server writes first (perftest: the client polls first).
		if rcnt < c.iters && !(scnt < 1 && role == oob.Server) {
			rcnt++
			if err := pollByte(ctx, s.mem, poll, byte(rcnt)); err != nil {
				return fmt.Errorf("waiting for the peer's write %d: %w", rcnt, err)
			}
		}
		if scnt < c.iters {
			prog.tick(scnt)
			ts = append(ts, time.Now())
			scnt++
			s.mem[post] = byte(scnt)
			if err := s.postSendWait(ctx, s.sendWR(size, 0), wc[:], scnt, "completion", scnt); err != nil {
				return err
			}
		}
	}
	s.latDone(stdout, size, ts, 2)
	return nil
}

// latSend is send-lat: the client sends, the server answers each message
// with one of its own (perftest's run_iter_lat_send).
func (s *perfSide) latSend(ctx context.Context, size int, role oob.Role, stdout io.Writer, prog *perfProgress) error {
	c := s.c
	ts := make([]time.Time, 0, c.iters+1)
	var scnt, rcnt int
	wcs := make([]transport.WC, 4)
	waitRecv := func() error {
		n, err := s.rcq.Wait(ctx, wcs[:1])
		if err != nil {
			return fmt.Errorf("waiting for receive %d: %w", rcnt+1, err)
		}
		wc := wcs[0]
		_ = n
		if wc.Status != transport.WCSuccess {
			return wcError(wc, "receive")
		}
		if wc.ByteLen != uint32(size) {
			return fmt.Errorf("receive %d: %d bytes, want %d", rcnt, wc.ByteLen, size)
		}
		rcnt++
		s.posted--
		if s.posted < c.rxDepth && rcnt+s.posted < c.iters {
			return s.postRecv()
		}
		return nil
	}
	for scnt < c.iters || rcnt < c.iters {
		if rcnt < c.iters && !(scnt < 1 && role == oob.Client) {
			if err := waitRecv(); err != nil {
				return err
			}
		}
		if scnt < c.iters {
			prog.tick(scnt)
			ts = append(ts, time.Now())
			if err := s.postSendWait(ctx, s.sendWR(size, 0), wcs, scnt, "send completion", scnt+1); err != nil {
				return err
			}
			scnt++
		}
	}
	s.latDone(stdout, size, ts, 2)
	return nil
}

// printLat prints perftest's latency line from the post timestamps: the
// intervals between consecutive posts divided by rtt (2 for ping-pong
// tests), sorted, the two largest dropped (LAT_MEASURE_TAIL), then min, max,
// median, average, standard deviation and the 99% / 99.9% percentiles.
func printLat(w io.Writer, size, iters int, ts []time.Time, rtt float64) {
	var d []float64
	for i := 1; i < len(ts) && i <= iters; i++ {
		d = append(d, float64(ts[i].Sub(ts[i-1]).Nanoseconds())/1e3/rtt)
	}
	writeLatLine(w, size, iters, d)
	fmt.Fprint(w, perfLine)
}

// writeLatLine prints the latency row for the per-iteration latencies d
// (µs), which it sorts.
func writeLatLine(w io.Writer, size, iters int, d []float64) {
	slices.Sort(d)
	if len(d) > 4 {
		d = d[:len(d)-2] // LAT_MEASURE_TAIL
	}
	if len(d) == 0 {
		d = []float64{0}
	}
	n := len(d)
	var sum float64
	for _, v := range d {
		sum += v
	}
	avg := sum / float64(n)
	var vs float64
	for _, v := range d {
		vs += (v - avg) * (v - avg)
	}
	med := d[n/2]
	if n%2 == 0 {
		med = (d[n/2-1] + d[n/2]) / 2
	}
	pct := func(p float64) float64 { return d[min(int(math.Ceil(float64(n)*p)), n-1)] }
	fmt.Fprintf(w, " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		size, iters, d[0], d[n-1], med, avg, math.Sqrt(vs/float64(n)), pct(0.99), pct(0.999))
}

// verify checks the data of a --check run on this side.
func (s *perfSide) verify(role oob.Role, sizes []int) error {
	c := s.c
	target := s.mem[s.half : 2*s.half]
	switch {
	case c.test == oob.WriteBW && role == oob.Server:
		if c.duration > 0 {
			return nil
		}
		for _, size := range sizes {
			if err := s.checkSlots(target, size, c.iters); err != nil {
				return fmt.Errorf("size %d: %w", size, err)
			}
		}
	case c.test == oob.ReadBW && role == oob.Client:
		for _, r := range s.results {
			if err := s.checkSlots(s.mem[:s.half], r.size, r.iters); err != nil {
				return fmt.Errorf("size %d: %w", r.size, err)
			}
		}
	case (c.test == oob.AtomicBW || c.test == oob.AtomicLat) && role == oob.Server:
		if c.duration > 0 {
			return nil
		}
		cycle := int(s.params.CycleBuffer)
		inc := perfInc(8, int(s.params.CacheLine))
		slots := cycle / inc
		if c.test == oob.AtomicLat {
			slots = 1
		}
		for k := 0; k < slots; k++ {
			want := uint64(0)
			if c.atomicType == "FETCH_AND_ADD" {
				want = uint64(c.iters / slots)
				if k < c.iters%slots {
					want++
				}
			}
			if got := binary.NativeEndian.Uint64(target[k*inc:]); got != want {
				return fmt.Errorf("atomic target %d holds %d, want %d", k, got, want)
			}
		}
	case c.test == oob.ReadLat && role == oob.Client:
		for _, size := range sizes {
			if err := checkPattern(s.mem[:size], 0); err != nil {
				return fmt.Errorf("size %d: %w", size, err)
			}
		}
	case c.test == oob.SendLat:
		// The last (largest) message is in the receive buffer.
		if err := checkPattern(target[:sizes[len(sizes)-1]], 0); err != nil {
			return err
		}
	case c.test == oob.WriteLat:
		// The last (largest) write is in the target; the last byte of
		// every size carried an iteration count instead of the pattern.
		last := sizes[len(sizes)-1]
		for i, v := range target[:last] {
			if slices.Contains(sizes, i+1) {
				continue
			}
			if want := perfPattern(i); v != want {
				return fmt.Errorf("byte %d is 0x%02x, want 0x%02x", i, v, want)
			}
		}
		if got := target[last-1]; int(got) != c.iters&0xff {
			return fmt.Errorf("last byte is %d, want the iteration count %d", got, c.iters&0xff)
		}
	}
	return nil
}

// checkSlots checks that the slots iterations 0..iters-1 of size bytes hit
// hold the pattern.
func (s *perfSide) checkSlots(region []byte, size, iters int) error {
	seen := map[uint64]bool{}
	for n := 0; n < iters; n++ {
		off := s.slotOff(size, uint64(n))
		if seen[off] {
			break
		}
		seen[off] = true
		if err := checkPattern(region[off:off+uint64(size)], int(off)); err != nil {
			return err
		}
	}
	return nil
}
