package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/transport"
)

// The session runner: one ping-pong of any kind, from the endpoint and the
// out-of-band connection to the result lines. What differs between the
// kinds is a side: its endpoint and buffers (ppContext for RC, UC and UD
// on one QP, srqContext for srq-pingpong's QPs on one SRQ), its exchange
// and connection, its loop and its -c check.

// side is one end of a ping-pong as the session runner drives it.
type side interface {
	// device is the side's device (its counters for -v and SIGUSR1).
	device() *transport.Device
	// exchange prints the local address lines, swaps them with the peer
	// over conn (the client sends first), connects the QPs, closes conn
	// and prints the remote address lines.
	exchange(ctx context.Context, c *pingpongConfig, conn net.Conn, stdout io.Writer) error
	// loop runs the tool's main loop: c.iters sends and receives.
	loop(ctx context.Context, c *pingpongConfig) error
	// check validates the buffer after the run (-c).
	check(c *pingpongConfig) error
	// Close closes the device and frees the memory.
	Close()
}

// openSide checks what the tool checks before it starts (ud-pingpong:
// the size against the port MTU; srq-pingpong: -q against -r) and creates
// the side of c's kind on local, its receives posted.
func openSide(local netip.Addr, c *pingpongConfig) (side, error) {
	if c.kind == ppSRQ {
		sc, err := srqInit(local, c)
		if err != nil {
			return nil, err
		}
		return sc, nil
	}
	pc, err := ppInit(local, c)
	if err != nil {
		return nil, err
	}
	return pc, nil
}

// precheck applies the tools' own checks of their flags, made before they
// listen or connect.
func precheck(c *pingpongConfig) error {
	switch c.kind {
	case ppUD:
		if c.size > c.mtu.Bytes() {
			// ibv_ud_pingpong's check, before it listens or connects.
			return fmt.Errorf("requested size %d larger than port MTU (%d); -m sets the port MTU", c.size, c.mtu.Bytes())
		}
	case ppSRQ:
		return checkSRQPingpong(c)
	}
	return nil
}

// runSession runs one ping-pong of c's kind as server (c.server empty) or
// client.
func runSession(ctx context.Context, c *pingpongConfig, stdout io.Writer, usr1 *cli.USR1Watch) error {
	if err := precheck(c); err != nil {
		return err
	}
	var s side
	var err error
	if ppEarlyInit(c) {
		if s, err = openSide(c.bind, c); err != nil {
			return err
		}
	}
	conn, local, end, err := ppSession(ctx, c)
	if err != nil {
		if s != nil {
			s.Close()
		}
		return err
	}
	defer end()
	if s == nil {
		if s, err = openSide(local, c); err != nil {
			return err
		}
	}
	if c.verbose {
		// Printed after close: the counters then include everything the
		// device did, not a moment while it still answers the peer.
		defer cli.PrintCounters(stdout, local.String(), s.device())
	}
	defer s.Close()
	usr1.Add(local.String(), s.device())

	if err := s.exchange(ctx, c, conn, stdout); err != nil {
		return err
	}
	start := time.Now()
	lctx, stopIdle := watchIdle(ctx, s.device(), c.idleTimeout(), c.kind, c.iters)
	err = s.loop(lctx, c)
	if idle := stopIdle(); err != nil {
		if idle != nil && ctx.Err() == nil {
			return fmt.Errorf("%w\n  (%s)", err, ppVerboseHint(c))
		}
		return ppCtxErr(ctx, err)
	}
	printPingpongResult(stdout, c, time.Since(start))
	if c.chk {
		return s.check(c)
	}
	return nil
}

// oobErr is an error of the out-of-band exchange over conn.
func oobErr(ctx context.Context, conn net.Conn, err error) error {
	return ppCtxErr(ctx, fmt.Errorf("out-of-band exchange with %s: %w", conn.RemoteAddr(), err))
}

// printPingpongResult prints the tools' two result lines for a run of
// c.iters exchanges of c.size bytes each way that took el.
func printPingpongResult(w io.Writer, c *pingpongConfig, el time.Duration) {
	usec := float64(el.Nanoseconds()) / 1e3
	if usec <= 0 {
		usec = 1e-3
	}
	bytes := int64(c.size) * int64(c.iters) * 2
	fmt.Fprintf(w, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec/1e6, float64(bytes)*8/usec)
	fmt.Fprintf(w, "%d iters in %.2f seconds = %.2f usec/iter\n", c.iters, usec/1e6, usec/float64(c.iters))
}

// ppPageSize is the page size ibv_rc_pingpong uses for its -c marks.

// ppCtxErr names the timeout or cancellation when ctx ended the run.
func ppCtxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) && !errors.Is(err, context.Cause(ctx)) {
		return fmt.Errorf("%w (%v)", err, context.Cause(ctx))
	}
	return err
}

// ppWaitErr is the error of a wait for completions that failed with err:
// the cause of ctx when ctx ended it (an interrupt, --timeout, the idle
// watch), so that the message says why rather than "context canceled".
func ppWaitErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
	}
	return err
}

// ppVerboseHint points at -v when it was not given.
func ppVerboseHint(c *pingpongConfig) string {
	if c.verbose {
		return "the device's counters are above"
	}
	return "-v prints the device's counters"
}

// ppDestString formats a destination like the tools' address lines.
func ppDestString(d oob.PingpongDest) string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", d.LID, d.QPN, d.PSN, netip.AddrFrom16(d.GID))
}

// ppEarlyInit reports whether a ping-pong sets up its endpoint before the

// ppSession opens a ping-pong's out-of-band connection (ppOOBConnect),
// cut short when ctx ends, and finds the local RoCEv2 address it implies;
// end closes it.
func ppSession(ctx context.Context, c *pingpongConfig) (conn net.Conn, local netip.Addr, end func(), err error) {
	conn, err = ppOOBConnect(ctx, c)
	if err != nil {
		return nil, netip.Addr{}, nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	end = func() { stop(); conn.Close() }
	if local, err = cli.LocalAddr(c.bind, conn); err != nil {
		end()
		return nil, netip.Addr{}, nil, err
	}
	return conn, local, end, nil
}

// ppOOBConnect opens the out-of-band TCP connection: the client dials the
// server, the server accepts one client on every address.
func ppOOBConnect(ctx context.Context, c *pingpongConfig) (net.Conn, error) {
	port := strconv.Itoa(c.port)
	if c.server != "" {
		addr := net.JoinHostPort(c.server, port)
		d := net.Dialer{Timeout: 20 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("couldn't connect to %s: %w", addr, err)
		}
		return conn, nil
	}
	return cli.AcceptOne(ctx, c.port, func(err error) error {
		return fmt.Errorf("couldn't listen on TCP port %d: port in use: %w", c.port, err)
	}, nil)
}
