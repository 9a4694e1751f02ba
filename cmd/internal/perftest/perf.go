package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// The perftest-compatible commands (write-bw, read-bw, send-bw, atomic-bw,
// write-lat, read-lat, send-lat, atomic-lat), one file per job:
//
//	perf.go         the run: out-of-band session, hooks, data phase per size
//	perf_flags.go   registration, help text, flag parsing
//	perf_setup.go   out-of-band connection, device, memory, QP, connect
//	perf_bw.go      the bandwidth tests' traffic
//	perf_lat.go     the latency tests' traffic
//	perf_report.go  perftest's header, address lines and result rows
//	perf_check.go   --check: the data pattern and its verification

// runPerf runs one perftest-compatible command.
func runPerf(ctx context.Context, t oob.PerfTest, args []string, stdout, stderr io.Writer) int {
	c, err := parsePerfFlags(t, args)
	if code, done := cli.FlagsResult(t.String(), perfUsage(t), err, stdout, stderr); done {
		return code
	}
	if c.pcap != "" {
		// A file that cannot be written is said at start-up (exit 2, as
		// every command's), not to the first client.
		if err := cli.CheckCapturePath(c.pcap); err != nil {
			fmt.Fprintf(stderr, "rocev2d %s: %v\n", t, err)
			return cli.ExitUsage
		}
	}
	for _, l := range c.notes {
		fmt.Fprintln(stdout, l)
	}
	if c.inline >= 0 {
		fmt.Fprint(stdout, perfLine)
		fmt.Fprintln(stderr, perfInlineDisabled)
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("--timeout %v reached", c.timeout))
		defer cancel()
	}
	if err := perfRun(ctx, c, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "rocev2d %s: %v\n", t, err)
		return cli.ExitFail
	}
	return cli.ExitOK
}

// perfRun runs one perftest-compatible test.
func perfRun(ctx context.Context, c *perfConfig, stdout, stderr io.Writer) error {
	usr1 := cli.WatchSIGUSR1(stderr)
	defer usr1.Stop()
	var (
		conn  net.Conn
		s     *perfSide
		local netip.Addr
		err   error
	)
	if c.rdmaCM {
		// -R: the device first; the exchange runs over an rdma_cm
		// connection on it.
		if local, err = cmLocalAddr(c); err != nil {
			return err
		}
		if s, err = newPerfSide(c, local); err != nil {
			return err
		}
		defer s.close()
		s.cm = &perfCM{c: c, s: s}
		defer s.cm.close() // before s.close: the DREQs need the device
		usr1.Add(local.String(), s.Dev)
		if conn, err = s.cm.connectComm(ctx, stdout); err != nil {
			return err
		}
	} else {
		if c.bind.IsValid() && c.role() == oob.Server {
			// A server with --bind opens its RoCEv2 socket before it
			// waits for a client, as perftest sets up its device first:
			// UDP 4791 taken on the address, or an address this host does
			// not have, fails at once, and a client on the same address
			// finds the port taken rather than taking it from the server.
			local = c.bind
			if s, err = newPerfSide(c, local); err != nil {
				return err
			}
			defer s.close()
			usr1.Add(local.String(), s.Dev)
			// A client with -R or -z (perftest's rdma_cm modes) sends a
			// CM REQ to this address. With UDP 4791 shared, a REQ for a
			// port nobody listens on is dropped (the kernel answers ICMP
			// port unreachable, which rxe ignores: perftest's client
			// retried for minutes); the volunteer answers it with a REJ
			// (invalid service ID), as the kernel's CM does for a perftest
			// server without -R, and the client stops at once.
			if err := s.Dev.VolunteerRejector(); err != nil {
				return err
			}
		}
		if conn, err = perfConnect(ctx, c, stdout); err != nil {
			return err
		}
		if s == nil {
			if local, err = cli.LocalAddr(c.bind, conn); err != nil {
				conn.Close()
				return err
			}
			if s, err = newPerfSide(c, local); err != nil {
				conn.Close()
				return err
			}
			defer s.close()
			usr1.Add(local.String(), s.Dev)
		}
	}
	defer conn.Close()
	if perfTweakLocal != nil {
		perfTweakLocal(&s.local)
	}

	if c.check {
		// Each QP's regions hold the pattern from their start, so that
		// every QP moves the same data as one QP alone.
		for i := range s.qps {
			fillPattern(s.src(i))
			fillPattern(s.dst(i))
		}
		if c.test == oob.ReadBW || c.test == oob.ReadLat {
			// READs land in the source regions: they must be filled by them.
			for i := range s.qps {
				clear(s.src(i))
			}
		} else {
			// The targets must be filled by the traffic, not by us.
			for i := range s.qps {
				clear(s.dst(i))
			}
		}
	}
	role := c.role()
	sizes := c.sizes()
	planFor, newSession := oob.Plan, oob.NewPerfSession
	if c.rdmaCM {
		planFor, newSession = oob.PlanRDMACM, oob.NewPerfSessionRDMACM
	}
	plan, err := planFor(c.test, role, len(sizes))
	if c.bidi {
		if plan, err = oob.PlanBidi(c.test, len(sizes)); c.rdmaCM && err == nil {
			plan = oob.RDMACM(plan)
		}
	}
	if err != nil {
		return err
	}
	var watched *oobWatchConn
	if !c.rdmaCM {
		// Over TCP the connection is watched during the data phase.
		watched = &oobWatchConn{Conn: conn, endless: c.runInf}
		conn = watched
	}
	sess := newSession(conn, role)
	sess.StepTimeout = 30 * time.Second
	hooks := oob.Hooks{
		ConnectQPs: func(ctx context.Context, remotes []oob.PerfDest, neg oob.Params) error {
			return s.connect(remotes, neg, stdout)
		},
		CMConnectQPs: func(ctx context.Context, neg oob.Params) ([]oob.PerfDest, error) {
			return s.cm.connect(ctx, neg)
		},
		Prepare: func(ctx context.Context, i int) error { return s.prepare(sizes[i]) },
		Traffic: func(ctx context.Context, i int) (oob.Report, error) {
			// The data phase gives up on a peer that has ended its own
			// (over TCP) or that posts no receives for SENDs.
			wctx, stops := ctx, []func(){}
			if watched != nil {
				var stop func()
				wctx, stop = watched.watch(wctx, s.packets)
				stops = append(stops, stop)
			}
			if c.test == oob.SendBW || c.test == oob.SendLat {
				var stop func()
				wctx, stop = watchRNR(wctx, s.Dev, c.test)
				stops = append(stops, stop)
			}
			rep, err := s.traffic(wctx, i, sizes, role, stdout, stderr)
			if err != nil && ctx.Err() == nil && wctx.Err() != nil {
				err = fmt.Errorf("%w (%v)", err, context.Cause(wctx))
			}
			for _, stop := range slices.Backward(stops) {
				stop()
			}
			return rep, err
		},
		Reported: func(local, remote oob.Report) error { return s.reported(local, remote, role, stdout) },
	}
	clampMTU(c, local, stdout, stderr)
	params := oob.DefaultParams
	params.MTU = c.mtu
	res, err := sess.RunQPs(ctx, plan, params, s.locals(), hooks)
	if c.runInf && errors.Is(err, errRunEnded) {
		// perftest dies of the SIGINT and prints nothing more; a peer
		// that went away is said on stderr.
		if ctx.Err() == nil {
			var se *oob.StepError
			if errors.As(err, &se) {
				err = se.Err
			}
			fmt.Fprintf(stderr, "rocev2d %s: %v\n", c.test, err)
		} else if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
			fmt.Fprintf(stderr, "rocev2d %s: --run_infinitely: %v\n", c.test, cause)
		}
		return nil
	}
	if err != nil {
		if errors.Is(err, oob.ErrQPCountMismatch) {
			return fmt.Errorf("peer %s: %w", conn.RemoteAddr(), err)
		}
		if errors.Is(err, oob.ErrIncompatibleVersion) {
			return fmt.Errorf("peer %s speaks an incompatible perftest version: %w", conn.RemoteAddr(), err)
		}
		if errors.Is(err, oob.ErrModeMismatch) {
			return fmt.Errorf("peer %s runs another perftest mode: %w", conn.RemoteAddr(), err)
		}
		if errors.Is(err, oob.ErrMalformed) {
			if c.test == oob.SendBW {
				// send-bw -b exchanges reports where send-bw without it
				// has none.
				return fmt.Errorf("malformed out-of-band message from %s: %w (%s)", conn.RemoteAddr(), err, bidiHint(c.bidi))
			}
			return fmt.Errorf("malformed out-of-band message from %s: %w", conn.RemoteAddr(), err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("out-of-band exchange with %s: %w (%v)", conn.RemoteAddr(), err, context.Cause(ctx))
		}
		var se *oob.StepError
		if s.peerTestNote != "" && (errors.Is(err, oob.ErrPeerClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			// The peer hung up after the QP data that made it suspect.
			return fmt.Errorf("out-of-band exchange with %s: %w (%s)", conn.RemoteAddr(), err, s.peerTestNote)
		}
		if !c.rdmaCM && errors.As(err, &se) && se.Step == oob.PerfStepVersion && errors.Is(err, oob.ErrPeerClosed) {
			return fmt.Errorf("out-of-band exchange with %s: %w (%s)", conn.RemoteAddr(), err, versionClosedHint(role, local, conn))
		}
		if c.test.IsBW() && errors.As(err, &se) && (se.Step == oob.PerfStepSync || strings.HasPrefix(se.Step, "report")) && errors.Is(err, oob.ErrPeerClosed) {
			// The peer went away after the data phase: it was killed, or
			// it failed and says why on its side. A side with -b against
			// one without ends this way too, and so may a peer running
			// another test.
			return fmt.Errorf("out-of-band exchange with %s: %w (the peer exited: it was killed, or it failed and says why on its side; a -b mismatch — both sides need -b, or neither — "+
				"or another test on the peer ends this way too)", conn.RemoteAddr(), err)
		}
		return fmt.Errorf("out-of-band exchange with %s: %w", conn.RemoteAddr(), err)
	}
	if s.cm != nil {
		// perftest disconnects (DREQ) once the exchange is over; so do we,
		// before the counters and the capture are final.
		s.cm.close()
	}
	if c.test.IsBW() {
		switch {
		case c.bidi: // each size's sum is printed after its report exchange
		case c.test == oob.SendBW && role == oob.Server:
			printBWLine(stdout, s.srvRecv, c)
		case role == oob.Server && res.HasReport:
			c.bwRow(stdout, res.RemoteReport)
		}
		if c.output == "" {
			fmt.Fprint(stdout, perfLine)
		}
	} else if role == oob.Server && (c.test == oob.ReadLat || c.test == oob.AtomicLat) && c.output == "" {
		fmt.Fprint(stdout, perfLine)
	}
	if c.check {
		if err := s.checkClientRun(role, res, sizes); err != nil {
			return fmt.Errorf("--check: %w", err)
		}
		if err := s.verify(role, sizes); err != nil {
			return fmt.Errorf("--check: %w\n  (%s)", err, checkHint)
		}
		fmt.Fprintln(stdout, " data check: ok")
	}
	if c.verbose {
		cli.PrintCounters(stdout, local.String(), s.Dev)
	}
	if perfAfterRun != nil {
		perfAfterRun(s)
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

// versionClosedHint says why a peer may hang up before it sends its
// version, for a side of role whose RoCEv2 address is local. A peer that
// cannot set up its own side (its RoCEv2 socket, say) hangs up there:
// perftest and rocev2d without --bind open their RoCEv2 socket once the
// out-of-band connection stands. So does a rocev2d client with -R that
// looks for a server without it; a rocev2d server with -R answers TCP
// clients with oob.RDMACMVersion instead, so a client is not told about
// -R here.
func versionClosedHint(role oob.Role, local netip.Addr, conn net.Conn) string {
	var peer netip.Addr
	if ap, err := netip.ParseAddrPort(conn.RemoteAddr().String()); err == nil {
		peer = ap.Addr().Unmap()
	}
	if role == oob.Client {
		hint := "the server hung up before the exchange: it could not set up its side, and its own output says why"
		if peer == local {
			hint += fmt.Sprintf("; this side runs RoCEv2 on %v, the server's address, and holds UDP port %d there, which a server "+
				"running RoCEv2 on that address needs too: give each side its own address with --bind (on one host, e.g. 127.0.0.N)",
				local, udp.Port)
		}
		return hint
	}
	hint := "the client hung up before the exchange: either it could not set up its side, which its own output explains"
	if peer == local {
		hint += fmt.Sprintf(" — it connected from %v, where this side holds UDP port %d, so it cannot run RoCEv2 there: "+
			"give it another address with --bind (on one host, e.g. 127.0.0.N) —", local, udp.Port)
	}
	return hint + " or it runs with -R and looked for a server without it: then add -R here too"
}

// perfTweakLocal, if set (by tests), changes the QP data a side announces,
// to provoke errors at the peer.
var perfTweakLocal func(*oob.PerfDest)

// perfAfterRun, if set (by tests), sees each side at the end of a run
// that succeeded.
var perfAfterRun func(*perfSide)

// traffic runs the data phase of size number i.
func (s *perfSide) traffic(ctx context.Context, i int, sizes []int, role oob.Role, stdout, stderr io.Writer) (oob.Report, error) {
	c := s.c
	size := sizes[i]
	if c.runInf {
		switch {
		case c.test == oob.SendBW && role == oob.Server:
			return oob.Report{}, s.sendBWServerInfinite(ctx, size, stdout)
		case role == oob.Server:
			// Passive, as perftest's server, which waits for the
			// client to exit: until interrupted or the client has gone
			// (the out-of-band watch).
			<-ctx.Done()
			return oob.Report{}, runEnded(ctx)
		}
		return oob.Report{}, s.bwClientInfinite(ctx, size, stdout)
	}
	switch c.test {
	case oob.WriteBW, oob.ReadBW, oob.AtomicBW:
		if role == oob.Server && !c.bidi {
			return oob.Report{}, nil // passive
		}
		return s.bwClient(ctx, size, stdout, stderr)
	case oob.SendBW:
		if c.bidi {
			return s.sendBidi(ctx, size, stdout, stderr)
		}
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

// sendWR builds the work request for iteration n of QP 0.
func (s *perfSide) sendWR(size int, n uint64) transport.SendWR { return s.sendWRQP(0, size, n) }

// perfWRIDShift places the QP index in a send's wr_id above the iteration.
const perfWRIDShift = 40

// sendWRQP builds the work request for iteration n of QP i: from its
// source region to the target the peer's QP i announced.
func (s *perfSide) sendWRQP(i, size int, n uint64) transport.SendWR {
	off := s.slotOff(size, n)
	q := s.qps[i]
	src := s.srcAddr(i)
	mr, _ := s.qpMR(i)
	wr := transport.SendWR{WRID: uint64(i)<<perfWRIDShift | n, Flags: transport.SendSignaled,
		SGEs:       []memreg.SGE{{Addr: src + off, Length: uint32(size), LKey: mr.LKey()}},
		RemoteAddr: q.remote.VAddr + off, RKey: q.remote.RKey}
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
		wr.SGEs[0].Addr = src
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

// bidiHint names the -b mismatch a broken exchange may reveal.
func bidiHint(bidi bool) string {
	if bidi {
		return "does the peer run without -b? both sides need -b"
	}
	return "does the peer run with -b? both sides need -b, or neither"
}

// reported checks the peer's bandwidth report against this side's mode and,
// with -b, prints the sum of both directions, as perftest's duplex
// print_full_bw_report(my, rem) does. The report reveals a -b mismatch: a
// side without -b that is a server measures nothing and reports zeros
// (perftest: whatever its memory held), a side with -b always reports its
// own run of the same size.
func (s *perfSide) reported(local, remote oob.Report, role oob.Role, stdout io.Writer) error {
	c := s.c
	peerRan := remote.Size == local.Size && remote.Iters > 0
	switch {
	case c.bidi && !peerRan:
		return fmt.Errorf("the peer's report (size %d, %d iterations) is not a run of %d bytes: it runs without -b (both sides need -b)", remote.Size, remote.Iters, local.Size)
	case !c.bidi && role == oob.Client && peerRan:
		return fmt.Errorf("the server reports a run of its own (%d bytes × %d): it runs with -b (both sides need -b, or neither)", remote.Size, remote.Iters)
	case !c.bidi:
		return nil
	}
	sum := local
	sum.BWPeak += remote.BWPeak
	sum.BWAvg += remote.BWAvg
	sum.MsgRate += remote.MsgRate
	c.bwRow(stdout, sum)
	return nil
}

// perfBidiStall is how long send-bw -b waits without any completion before
// it gives up: a peer without -b neither sends nor (as a client) posts
// receives, and the run would never end.
var perfBidiStall = 10 * time.Second

// sendBidi is send-bw -b's data phase (perftest's run_iter_bi): send
// iters messages while receiving the peer's iters.
func (s *perfSide) sendBidi(ctx context.Context, size int, stdout, stderr io.Writer) (oob.Report, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.lastWC.Store(time.Now().UnixNano())
	var stalled atomic.Value // error
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(perfBidiStall / 10)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if time.Since(time.Unix(0, s.lastWC.Load())) > perfBidiStall {
					err := fmt.Errorf("no completion for %v: %s", perfBidiStall, bidiHint(true))
					stalled.Store(err)
					cancel(err)
					return
				}
			}
		}
	}()
	recvErr := make(chan error, 1)
	go func() { recvErr <- s.sendBWServer(ctx, size) }()
	rep, err := s.bwClient(ctx, size, stdout, stderr)
	if err != nil {
		cancel(err) // stop receiving
	}
	if rerr := <-recvErr; err == nil {
		err = rerr
	}
	if e, ok := stalled.Load().(error); ok && err != nil {
		return rep, e
	}
	return rep, err
}

// perfLinkOf is cli.LinkOf (a variable for tests).
var perfLinkOf = cli.LinkOf

// clampMTU lowers c.mtu (-m) to what the interface holding local carries,
// as perftest lowers it to the port's active MTU, which rxe derives from
// its interface's MTU (cli.ActiveMTU): with -m 4096 on a 1500-byte link
// every full packet would be refused by the host (send_err) and the run
// would end in "transport retry counter exceeded". It prints perftest's
// two lines and, on stderr, why.
func clampMTU(c *perfConfig, local netip.Addr, stdout, stderr io.Writer) {
	name, linkMTU, ok := perfLinkOf(local)
	if !ok {
		return
	}
	active, ok := cli.ActiveMTU(linkMTU)
	if !ok {
		active = transport.MTU256
	}
	act, _ := oob.MTUFromBytes(active.Bytes())
	if c.mtu <= act {
		return
	}
	fmt.Fprintf(stdout, "Requested mtu is higher than active mtu \nChanging to active mtu - %d\n", act)
	fmt.Fprintf(stderr, "rocev2d %s: -m %d: %s (%v) has MTU %d, whose RoCEv2 packets carry at most %d bytes (the largest path MTU up to the interface's MTU - %d, as rxe's port): running with %d\n",
		c.test, c.mtu.Bytes(), name, local, linkMTU, act.Bytes(), cli.RXEHeaderRoom, act.Bytes())
	c.mtu = act
}
