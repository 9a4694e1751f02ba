package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

func init() {
	register("pingpong", "RC ping-pong, flag- and wire-compatible with ibv_rc_pingpong", pingpongUsage, runPingpong)
}

const pingpongUsage = `usage: rocev2d pingpong [options] [server]

An RC ping-pong compatible with rdma-core's ibv_rc_pingpong: the same flags,
the same out-of-band exchange on TCP (default port 18515) and the same result
lines, so either side may be rocev2d or the real tool. Without a server
argument it waits for a client; with one it connects to it.

Both sides post rx-depth receives; the client sends first and then each side
alternates: send size bytes, receive size bytes, iters times.

options:
  -p, --port=PORT        out-of-band TCP port (default 18515)
  -d, --ib-dev=DEV       device name (accepted for compatibility; rocev2d has one device per address)
  -i, --ib-port=PORT     port of the device (accepted, must be 1)
  -s, --size=SIZE        message size in bytes (default 4096)
  -m, --mtu=MTU          path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)
  -r, --rx-depth=DEP     receives to post (default 500)
  -n, --iters=ITERS      iterations (default 1000)
  -l, --sl=SL            service level (accepted, not used by RoCEv2)
  -e, --events           sleep until packets arrive; without it rocev2d polls its
                         socket for up to 100 µs per wait (--busy-poll sets how
                         long), as ibv_rc_pingpong polls its CQ
  -g, --gid-idx=IDX      local GID index (accepted; the GID is the --bind address)
  -c, --chk              validate the received buffer like ibv_rc_pingpong -c
      --bind=IP          local IP address for RoCEv2 (UDP 4791). Default: the address
                         of the out-of-band TCP connection's local end; a server
                         with --bind opens it before it waits for a client
      --timeout=DUR      give up when the whole run takes longer (default 0 = no limit)
  -v                     print the device counters (rxe's names) at the end; SIGUSR1
                         prints them while running
` + socketUsage + `
Output: the local and remote address lines, then
  N bytes in S seconds = M Mbit/sec
  N iters in S seconds = U usec/iter
`

// Work request ids, as in ibv_rc_pingpong (they double as pending bits).
const (
	ppRecvWRID = 1
	ppSendWRID = 2
)

// pingpongConfig holds the parsed flags of `rocev2d pingpong`.
type pingpongConfig struct {
	port    int
	dev     string
	ibPort  int
	size    int
	mtu     transport.MTU
	rxDepth int
	iters   int
	sl      int
	events  bool
	gidIdx  int
	chk     bool
	bind    netip.Addr
	timeout time.Duration
	verbose bool
	sock    socketFlags
	server  string // empty: run as server
	// kind is the QP type: ppRC (pingpong), ppUC (uc-pingpong) or ppUD
	// (ud-pingpong: mtu is the port MTU and bounds size, receive buffers
	// start with the GRH); or ppSRQ (srq-pingpong: numQP RC QPs on one
	// SRQ, srqpingpong.go).
	kind  ppKind
	numQP int // srq-pingpong's -q
}

// ppKind is the transport a ping-pong runs on, and so which command and
// which rdma-core tool it is.
type ppKind uint8

const (
	ppRC  ppKind = iota // pingpong, ibv_rc_pingpong
	ppUC                // uc-pingpong, ibv_uc_pingpong
	ppUD                // ud-pingpong, ibv_ud_pingpong
	ppSRQ               // srq-pingpong, ibv_srq_pingpong
)

// String returns the command name: "pingpong", "uc-pingpong",
// "ud-pingpong" or "srq-pingpong".
func (k ppKind) String() string {
	switch k {
	case ppUC:
		return "uc-pingpong"
	case ppUD:
		return "ud-pingpong"
	case ppSRQ:
		return "srq-pingpong"
	}
	return "pingpong"
}

// usage is the command's help text.
func (k ppKind) usage() string {
	switch k {
	case ppUC:
		return ucPingpongUsage
	case ppUD:
		return udPingpongUsage
	case ppSRQ:
		return srqPingpongUsage
	}
	return pingpongUsage
}

// parsePingpongFlags parses args like getopt_long does for the C tool: flags
// and the optional server argument may come in any order.
func parsePingpongFlags(args []string) (*pingpongConfig, error) {
	return parsePPFlags(args, ppRC)
}

// parsePPFlags parses the flags of pingpong, uc-pingpong (the same as
// ibv_uc_pingpong's), ud-pingpong (ibv_ud_pingpong's: message size 1024
// by default, -o accepted) or srq-pingpong (ibv_srq_pingpong's: -q, -o
// accepted; srqPingpong checks -q against -r before it starts, as the
// tool does after parsing).
func parsePPFlags(args []string, kind ppKind) (*pingpongConfig, error) {
	c := &pingpongConfig{kind: kind}
	var mtu int
	var bind string
	fs := newFlagSet(kind.String())
	defSize := 4096
	if kind == ppUD {
		// ibv_ud_pingpong's size is 1024 (its usage text says 2048).
		defSize = 1024
	}
	if kind == ppUD || kind == ppSRQ {
		var odp bool
		boolFlags(fs, &odp, "o", "odp") // accepted and ignored
	}
	if kind == ppSRQ {
		intFlags(fs, &c.numQP, "q", "num-qp", 16)
	}
	intFlags(fs, &c.port, "p", "port", 18515)
	stringFlags(fs, &c.dev, "d", "ib-dev", "")
	intFlags(fs, &c.ibPort, "i", "ib-port", 1)
	intFlags(fs, &c.size, "s", "size", defSize)
	intFlags(fs, &mtu, "m", "mtu", 1024)
	intFlags(fs, &c.rxDepth, "r", "rx-depth", 500)
	intFlags(fs, &c.iters, "n", "iters", 1000)
	intFlags(fs, &c.sl, "l", "sl", 0)
	boolFlags(fs, &c.events, "e", "events")
	intFlags(fs, &c.gidIdx, "g", "gid-idx", -1)
	boolFlags(fs, &c.chk, "c", "chk")
	fs.StringVar(&bind, "bind", "", "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.verbose, "v", false, "")
	addSocketFlags(fs, &c.sock)
	var err error
	if c.server, err = parseWithServer(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if c.mtu, err = parseMTUFlag(mtu); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	switch {
	case c.port <= 0 || c.port > 65535:
		return nil, fmt.Errorf("%w: -p %d: port out of range 1..65535", errUsage, c.port)
	case c.ibPort != 1:
		return nil, fmt.Errorf("%w: -i %d: rocev2d devices have one port, 1", errUsage, c.ibPort)
	case c.size <= 0 || c.size > 1<<30:
		return nil, fmt.Errorf("%w: -s %d: size out of range 1..%d", errUsage, c.size, 1<<30)
	case kind == ppSRQ && c.numQP <= 0:
		// The tool would wait for completions of no QP forever.
		return nil, fmt.Errorf("%w: -q %d: at least one QP", errUsage, c.numQP)
	case c.rxDepth <= 0 || c.rxDepth > 1<<16:
		return nil, fmt.Errorf("%w: -r %d: rx-depth out of range 1..%d", errUsage, c.rxDepth, 1<<16)
	case c.iters <= 0:
		return nil, fmt.Errorf("%w: -n %d: iters must be positive", errUsage, c.iters)
	case c.sl < 0 || c.sl > 15:
		return nil, fmt.Errorf("%w: -l %d: sl out of range 0..15", errUsage, c.sl)
	case c.timeout < 0:
		return nil, fmt.Errorf("%w: --timeout %v: negative", errUsage, c.timeout)
	}
	if c.bind, err = parseBind(bind); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return c, nil
}

func runPingpong(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runPPCmd(ctx, args, ppRC, stdout, stderr)
}

// runPPCmd runs pingpong, uc-pingpong, ud-pingpong or srq-pingpong.
func runPPCmd(ctx context.Context, args []string, kind ppKind, stdout, stderr io.Writer) int {
	name := kind.String()
	c, err := parsePPFlags(args, kind)
	if code, done := flagsResult(name, kind.usage(), err, stdout, stderr); done {
		return code
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	usr1 := watchSIGUSR1(stderr)
	defer usr1.Stop()
	run := pingpong
	if kind == ppSRQ {
		run = srqPingpong
	}
	if err := run(ctx, c, stdout, usr1); err != nil {
		fmt.Fprintf(stderr, "rocev2d %s: %v\n", name, err)
		return exitFail
	}
	return exitOK
}

// ppContext is one side of a ping-pong: an endpoint with one CQ and the
// message buffer.
type ppContext struct {
	*endpoint
	// buf is what receives land in: for UD the GRH space (grh bytes,
	// transport.GRHSize) and then the message; sends take buf[grh:].
	buf   []byte
	grh   int
	mr    *memreg.MR
	routs int // receives posted
	// UD: the peer's address handle and QP number.
	ah        *transport.AH
	remoteQPN uint32
}

// pingpong runs one ping-pong as server (c.server empty) or client.
func pingpong(ctx context.Context, c *pingpongConfig, stdout io.Writer, usr1 *usr1Watch) error {
	if c.kind == ppUD && c.size > c.mtu.Bytes() {
		// ibv_ud_pingpong's check, before it listens or connects.
		return fmt.Errorf("requested size %d larger than port MTU (%d); -m sets the port MTU", c.size, c.mtu.Bytes())
	}
	var pc *ppContext
	var err error
	if ppEarlyInit(c) {
		if pc, err = ppInit(c.bind, c); err != nil {
			return err
		}
	}
	conn, local, end, err := ppSession(ctx, c)
	if err != nil {
		if pc != nil {
			pc.Close()
		}
		return err
	}
	defer end()
	if pc == nil {
		if pc, err = ppInit(local, c); err != nil {
			return err
		}
	}
	if c.verbose {
		// Printed after close: the counters then include everything the
		// device did, not a moment while it still answers the peer.
		defer printCounters(stdout, local.String(), pc.Dev)
	}
	defer pc.Close()
	usr1.Add(local.String(), pc.Dev)

	me := oob.PingpongDest{QPN: pc.QP.QPN(), PSN: pc.PSN, GID: pc.Dev.GID()}
	line := ppDestString(me)
	if c.kind == ppUD {
		// ibv_ud_pingpong's local line has "PSN 0x...: GID".
		line = strings.Replace(line, ", GID ", ": GID ", 1)
	}
	fmt.Fprintf(stdout, "  local address:  %s\n", line)
	var rem oob.PingpongDest
	if c.server != "" {
		rem, err = oob.PingpongClient(ctx, conn, me)
		if err == nil {
			err = pc.connectTo(c, rem)
		}
	} else {
		rem, err = oob.PingpongServer(ctx, conn, func(r oob.PingpongDest) (oob.PingpongDest, error) {
			return me, pc.connectTo(c, r)
		})
	}
	if err != nil {
		return ppCtxErr(ctx, fmt.Errorf("out-of-band exchange with %s: %w", conn.RemoteAddr(), err))
	}
	conn.Close()
	fmt.Fprintf(stdout, "  remote address: %s\n", ppDestString(rem))

	start := time.Now()
	if err := pc.loop(ctx, c); err != nil {
		return ppCtxErr(ctx, err)
	}
	printPingpongResult(stdout, c, time.Since(start))
	if c.chk {
		// ibv_rc_pingpong -c: the client marks every page's first byte with
		// i/page_size % sizeof(char), i.e. 0, and the message bounces back
		// and forth, so both buffers must hold 0 there at the end.
		msg := pc.buf[pc.grh:]
		for i := 0; i < c.size; i += ppPageSize {
			if msg[i] != 0 {
				return fmt.Errorf("data validation failed at byte %d: got %#x, want 0", i, msg[i])
			}
		}
		if c.kind == ppUD {
			// The GRH of the last datagram names the peer.
			a, err := transport.AHFromGRH(pc.buf[:pc.grh])
			if err != nil || a.Addr != pc.ah.Addr() {
				return fmt.Errorf("data validation failed: the GRH of the last datagram (% x) does not name the peer %v (%v)",
					pc.buf[:pc.grh], pc.ah.Addr(), err)
			}
		}
	}
	return nil
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
const ppPageSize = 4096

// ppCtxErr names the timeout or cancellation when ctx ended the run.
func ppCtxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%v)", err, context.Cause(ctx))
	}
	return err
}

// ppDestString formats a destination like the tools' address lines.
func ppDestString(d oob.PingpongDest) string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", d.LID, d.QPN, d.PSN, netip.AddrFrom16(d.GID))
}

// ppEarlyInit reports whether a ping-pong sets up its endpoint before the
// out-of-band connection: a server with --bind does, as the tools create
// their context before they wait for a client, so that UDP 4791 taken on
// the address, or an address this host does not have, fails at once and a
// client on the same address finds the port taken rather than taking it.
// Without --bind the address is the connection's local end.
func ppEarlyInit(c *pingpongConfig) bool { return c.server == "" && c.bind.IsValid() }

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
	if local, err = localAddr(c.bind, conn); err != nil {
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
	return acceptOne(ctx, c.port, func(err error) error {
		return fmt.Errorf("couldn't listen on TCP port %d: port in use: %w", c.port, err)
	}, nil)
}

// ppInit creates the endpoint on local with one CQ, registers the buffer
// and posts rx-depth receives (pp_init_ctx + pp_post_recv).
func ppInit(local netip.Addr, c *pingpongConfig) (*ppContext, error) {
	link, err := listenSocket(local, c.sock.Options(!c.events, defaultBusyPoll), "pick another address with --bind")
	if err != nil {
		return nil, err
	}
	cfg := endpointConfig{SendCQ: c.rxDepth + 1, MaxSendWR: 1, MaxRecvWR: c.rxDepth, SigAll: true, CC: c.sock.CC.Config()}
	pc := &ppContext{}
	switch c.kind {
	case ppUD:
		cfg.UD, cfg.QKey, cfg.PortMTU = true, udQKey, c.mtu
		pc.grh = transport.GRHSize
	case ppUC:
		cfg.UC = true
	}
	e, err := newEndpoint(link, cfg)
	if err != nil {
		return nil, err
	}
	pc.endpoint = e
	if pc.buf, pc.mr, err = e.Alloc(pc.grh+c.size, memreg.AccessLocalWrite); err != nil {
		e.Close()
		return nil, err
	}
	for i := range pc.buf {
		pc.buf[i] = 0x7b // as ibv_rc_pingpong
	}
	if pc.routs = pc.postRecv(c.rxDepth); pc.routs < c.rxDepth {
		e.Close()
		return nil, fmt.Errorf("couldn't post receive (%d)", pc.routs)
	}
	return pc, nil
}

// postRecv posts up to n receives of the whole buffer and returns how many
// were posted.
func (pc *ppContext) postRecv(n int) int {
	wr := transport.RecvWR{WRID: ppRecvWRID, SGEs: []memreg.SGE{{Addr: pc.mr.IOVA(), Length: uint32(len(pc.buf)), LKey: pc.mr.LKey()}}}
	for i := 0; i < n; i++ {
		if pc.QP.PostRecv(wr) != nil {
			return i
		}
	}
	return n
}

// postSend posts one signalled SEND of the message (the buffer after the
// GRH space); on UD to the peer's AH, QP and the Q_Key udQKey.
func (pc *ppContext) postSend() error {
	return pc.QP.PostSend(transport.SendWR{WRID: ppSendWRID, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{{Addr: pc.mr.IOVA() + uint64(pc.grh), Length: uint32(len(pc.buf) - pc.grh), LKey: pc.mr.LKey()}},
		AH:   pc.ah, RemoteQPN: pc.remoteQPN, RemoteQKey: udQKey})
}

// connectTo takes the QP to RTS towards rem with ibv_rc_pingpong's
// attributes (pp_connect_ctx: one READ/atomic outstanding, timeout 14);
// a UC QP takes the same path, and Connect sets only what
// ibv_uc_pingpong's pp_connect_ctx does (path, MTU, peer QPN, PSNs); a
// UD QP goes to RTS and gets an address handle for rem, as
// ibv_ud_pingpong's pp_connect_ctx.
func (pc *ppContext) connectTo(c *pingpongConfig, rem oob.PingpongDest) error {
	peer, err := peerFromGID(rem.GID, "-g")
	if err != nil {
		return err
	}
	if c.kind != ppUD {
		return pc.Connect(peer, rem.QPN, rem.PSN, c.mtu, 1, 14)
	}
	if err := pc.QP.ReadyUD(udQKey, pc.PSN); err != nil {
		return err
	}
	if pc.ah, err = pc.Dev.CreateAH(transport.AHAttr{Addr: peer}); err != nil {
		return fmt.Errorf("failed to create AH: %w", err)
	}
	pc.remoteQPN = rem.QPN
	return nil
}

// loop is ibv_rc_pingpong's main loop: the client sends first; a side posts
// its next send once both its previous send and the peer's message have
// completed; receives are reposted when at most one is left.
func (pc *ppContext) loop(ctx context.Context, c *pingpongConfig) error {
	pending := ppRecvWRID
	if c.server != "" {
		if c.chk {
			for i := 0; i < c.size; i += ppPageSize {
				pc.buf[pc.grh+i] = 0
			}
		}
		if err := pc.postSend(); err != nil {
			return fmt.Errorf("couldn't post send: %w", err)
		}
		pending |= ppSendWRID
	}
	var wcs [2]transport.WC
	rcnt, scnt := 0, 0
	for rcnt < c.iters || scnt < c.iters {
		n, err := pc.SCQ.Wait(ctx, wcs[:])
		if err != nil {
			return fmt.Errorf("waiting for completions after %d sends and %d receives of %d: %w", scnt, rcnt, c.iters, err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return fmt.Errorf("failed status %s (%d) for wr_id %d", wc.Status, uint8(wc.Status), wc.WRID)
			}
			switch wc.WRID {
			case ppSendWRID:
				scnt++
			case ppRecvWRID:
				pc.routs--
				if pc.routs <= 1 {
					pc.routs += pc.postRecv(c.rxDepth - pc.routs)
					if pc.routs < c.rxDepth {
						return fmt.Errorf("couldn't post receive (%d)", pc.routs)
					}
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", wc.WRID)
			}
			pending &^= int(wc.WRID)
			if scnt < c.iters && pending == 0 {
				if err := pc.postSend(); err != nil {
					return fmt.Errorf("couldn't post send: %w", err)
				}
				pending = ppRecvWRID | ppSendWRID
			}
		}
	}
	return nil
}
