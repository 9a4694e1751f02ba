package cmtools

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

func init() {
	commands.Register("rping", "RDMA ping through the CM, flag- and wire-compatible with librdmacm's rping", rpingUsage, runRping)
}

const rpingUsage = `usage: rocev2d rping -s [-vVdP] [-S size] [-C count] [-a addr] [-p port]
       rocev2d rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]

rping of rdma-core's librdmacm examples (rdma-core 44), on rocev2: the
connection is made through the IB connection manager (CM MADs to QP1 with
rdma_cm's header, package rdmacm), so either side may be the real rping (on
rxe or an RNIC). Per ping the client SENDs its start buffer's address, rkey
and size (16 bytes, big-endian), the server RDMA READs it and SENDs a "go
ahead", the client SENDs its rdma buffer's address, the server RDMA WRITEs
the data there and SENDs another "go ahead". The data is "rdma-ping-N: "
followed by rping's rotating ASCII pattern, NUL-terminated. At the end the
client disconnects (DREQ).

options (getopt style: -vV, -C50 and -C 50 all work):
  -s             server side
  -P             persistent server: serve every client that connects, one
                 after another or at once (each on a QP, CQ and buffers of
                 its own), until interrupted
  -c             client side
  -a addr        server: address to listen on (also the local RoCEv2 address);
                 client: the server's address (required)
  -I addr        client: source address (the local RoCEv2 address)
  -p port        rdma_cm port (default 7174)
  -C count       pings (client; default 0 = until interrupted). The server
                 serves until the client disconnects; a server that
                 disconnects first fails a counted client (exit 255;
                 rping's exits 0)
  -S size        ping data size, 23..65535 (default 64); the server's must
                 be at least the client's
  -v             print the ping data ("ping data: ..." on the client,
                 "server ping data: ..." on the server)
  -V             client: check that the data came back unchanged
  -d             debug output
  -q             accepted (rocev2d always creates and moves its own QP)
      --bind=IP  local address for RoCEv2 (UDP 4791); overrides -a (server)
                 and -I (client). A client without either uses the address
                 the kernel routes the server's address from
      --timeout=DUR  give up when the whole run takes longer (default 0 = no limit)
      --counters print the device's counters (rxe's names) and the CM's at
                 the end; SIGUSR1 prints the device's while running
      --keepalive=DUR, --keepalive-timeout=DUR
                     the connection's keep-alive interval and probe timeout
                     (rdmacm.Options.KeepAlive/KeepAliveTimeout; default 15s
                     and 10s; --keepalive=-1s turns it off): a peer found
                     dead ends the run with "connection lost: ..." and 255
` + cli.SocketUsage + `
Output, stdout and stderr, as rping's. Exit status, as rping's: 0 done (also
when the peer disconnected first), 22 bad usage (EINVAL), 255 failed: the
connection was refused or rejected ("cma event RDMA_CM_EVENT_REJECTED, error
REASON"), the peer never answered (RDMA_CM_EVENT_UNREACHABLE, error -110), a
completion failed, the peer stopped answering (keep-alive; not a disconnect:
Linux's rdma_cm reports DISCONNECTED only for the peer's DREQ), the data did
not match (-V), or the run was interrupted
(SIGINT, SIGTERM, --timeout: the current ping may finish, for up to 3 s, so
that the DREQ does not race a message the peer has yet to take in — which
makes the real rping fail — then rocev2d disconnects).
`

// rping's exit statuses: main returns its ret, EINVAL for bad usage and -1
// for every failure of the test.
const (
	rpingExitUsage = 22  // EINVAL
	rpingExitFail  = 255 // -1
)

// rpingInfo is struct rping_rdma_info: buf, rkey, size, big-endian.
const rpingInfoSize = 16

// rping's size limits: RPING_MIN_BUFSIZE is sizeof(stringify(INT_MAX)) +
// sizeof(RPING_MSG_FMT), 8 + 15 (INT_MAX is not defined where rping.c
// expands it, so the string is "INT_MAX"; rdma-core 44 on Debian says
// "valid range is 23 to 65536"); RPING_BUFSIZE 64 KiB.
const (
	rpingMinSize = 23
	rpingBufSize = 64 * 1024
)

// rping's test_state values that its messages print.
const (
	rpingStDisconnected = 10
	rpingStError        = 11
)

const (
	rpingDefaultPort = 7174
	rpingSQDepth     = 16 // RPING_SQ_DEPTH: max_send_wr; the CQ holds twice that
	// Work request IDs (rping's are 0; only the opcode matters).
	rpingWRIDRecv, rpingWRID = 1, 2
)

// rpingConfig holds the parsed flags of `rocev2d rping`.
type rpingConfig struct {
	server   bool
	addr     string // -a
	source   string // -I
	port     int
	count    int
	size     int
	verbose  int
	validate bool
	debug    bool
	bind     netip.Addr
	timeout  time.Duration
	counters bool
	sock     cli.SocketFlags
	// persistent: -P, the server serves clients until interrupted.
	persistent bool
	// keepAlive, keepAliveTimeout: --keepalive, --keepalive-timeout.
	keepAlive, keepAliveTimeout time.Duration
}

// rpingOptLetters are rping's getopt letters ("a:I:Pp:C:S:t:scvVdq"): true
// for those that take an argument.
var rpingOptLetters = map[byte]bool{'a': true, 'I': true, 'p': true, 'C': true, 'S': true,
	's': false, 'c': false, 'v': false, 'V': false, 'd': false, 'q': false, 'P': false}

// splitGetopt rewrites getopt-style clusters for the flag package: "-vVd"
// becomes "-v -V -d" and "-C50" "-C 50". An argument with a letter that is
// not one of letters is left alone (a long option such as -bind).
func splitGetopt(args []string, letters map[byte]bool) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) <= 2 || a[0] != '-' || a[1] == '-' || strings.Contains(a, "=") {
			out = append(out, a)
			continue
		}
		var parts []string
		ok := true
		for j := 1; j < len(a); j++ {
			arg, known := letters[a[j]]
			if !known {
				ok = false
				break
			}
			parts = append(parts, "-"+a[j:j+1])
			if arg {
				if j+1 < len(a) {
					parts = append(parts, a[j+1:])
				}
				break
			}
		}
		if !ok {
			out = append(out, a)
			continue
		}
		out = append(out, parts...)
	}
	return out
}

// countFlag counts how often a boolean flag is given (-v -v).
type countFlag int

func (c *countFlag) String() string   { return strconv.Itoa(int(*c)) }
func (c *countFlag) IsBoolFlag() bool { return true }
func (c *countFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	if v {
		*c++
	}
	return nil
}

// errRpingUsage marks a usage error that prints rping's usage text.
var errRpingUsage = errors.New("rping usage")

// parseRpingFlags parses rping's flags. A usage error wraps errUsage.
func parseRpingFlags(args []string) (*rpingConfig, error) {
	c := &rpingConfig{port: rpingDefaultPort, size: 64}
	fs := cli.NewFlagSet("rping")
	var srv, client, persistent, selfQP bool
	var bind string
	var verbose countFlag
	fs.BoolVar(&srv, "s", false, "")
	fs.BoolVar(&client, "c", false, "")
	fs.StringVar(&c.addr, "a", "", "")
	fs.StringVar(&c.source, "I", "", "")
	fs.IntVar(&c.port, "p", rpingDefaultPort, "")
	fs.IntVar(&c.count, "C", 0, "")
	fs.IntVar(&c.size, "S", 64, "")
	fs.Var(&verbose, "v", "")
	fs.BoolVar(&c.validate, "V", false, "")
	fs.BoolVar(&c.debug, "d", false, "")
	fs.BoolVar(&selfQP, "q", false, "")
	fs.BoolVar(&persistent, "P", false, "")
	fs.StringVar(&bind, "bind", "", "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.counters, "counters", false, "")
	fs.DurationVar(&c.keepAlive, "keepalive", 0, "")
	fs.DurationVar(&c.keepAliveTimeout, "keepalive-timeout", 0, "")
	cli.AddSocketFlags(fs, &c.sock)
	if err := fs.Parse(splitGetopt(args, rpingOptLetters)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w: %v", cli.ErrUsage, errRpingUsage, err)
	}
	c.verbose = int(verbose)
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("%w: %w: unexpected argument %q", cli.ErrUsage, errRpingUsage, fs.Arg(0))
	case !srv && !client:
		return nil, fmt.Errorf("%w: %w: -s (server) or -c (client) is required", cli.ErrUsage, errRpingUsage)
	case c.size < rpingMinSize || c.size > rpingBufSize-1:
		// rping's own message.
		return nil, fmt.Errorf("%w: Invalid size %d (valid range is %d to %d)", cli.ErrUsage, c.size, rpingMinSize, rpingBufSize)
	case c.count < 0:
		return nil, fmt.Errorf("%w: Invalid count %d", cli.ErrUsage, c.count)
	case c.port <= 0 || c.port > 65535:
		return nil, fmt.Errorf("%w: -p %d: port out of range 1..65535", cli.ErrUsage, c.port)
	case c.timeout < 0:
		return nil, fmt.Errorf("%w: --timeout %v: negative", cli.ErrUsage, c.timeout)
	case c.keepAliveTimeout < 0:
		return nil, fmt.Errorf("%w: --keepalive-timeout=%v: negative (0: the default, 10s)", cli.ErrUsage, c.keepAliveTimeout)
	case c.keepAliveTimeout > 0 && c.keepAliveTimeout < time.Millisecond:
		return nil, fmt.Errorf("%w: --keepalive-timeout=%v: below 1ms a live peer cannot answer a probe in time", cli.ErrUsage, c.keepAliveTimeout)
	}
	// getopt: the last of -s and -c wins; rping takes the later one too.
	c.server = srv
	c.persistent = persistent
	if srv && client {
		c.server = lastOf(args, "-s", "-c") == "-s"
	}
	var err error
	if c.bind, err = cli.ParseBind(bind); err != nil {
		return nil, fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	if !c.server && c.addr == "" {
		return nil, fmt.Errorf("%w: %w: the client needs the server's address (-a addr)", cli.ErrUsage, errRpingUsage)
	}
	if c.server && c.addr == "" && !c.bind.IsValid() {
		return nil, fmt.Errorf("%w: the server needs -a addr or --bind=IP: rocev2d listens on one address, not on every one", cli.ErrUsage)
	}
	return c, nil
}

// lastOf returns which of a and b comes last among the single-letter
// options of args.
func lastOf(args []string, a, b string) string {
	last := ""
	for _, x := range splitGetopt(args, rpingOptLetters) {
		if x == a || x == b {
			last = x
		}
	}
	return last
}

// rpingUsageText is rping's usage, printed on stdout for a usage error.
const rpingUsageText = `rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
	-c		client side
	-I		Source address to bind to for client.
	-s		server side.  To bind to any address with IPv6 use -a ::0
	-v		display ping data to stdout
	-V		validate ping data
	-d		debug printfs
	-S size 	ping data size
	-C count	ping count times
	-a addr		address
	-p port		port
	-P		persistent server mode allowing multiple connections
	-q		use self-created, self-modified QP
`

func runRping(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseRpingFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, rpingUsage)
		return cli.ExitOK
	}
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), cli.ErrUsage.Error()+": ")
		msg = strings.TrimPrefix(msg, errRpingUsage.Error()+": ")
		fmt.Fprintf(stderr, "rocev2d rping: %s\n", msg)
		if errors.Is(err, errRpingUsage) {
			fmt.Fprint(stdout, rpingUsageText)
		}
		return rpingExitUsage
	}
	ctx, cancel := runTimeout(ctx, c.timeout)
	defer cancel()
	usr1 := cli.WatchSIGUSR1(stderr)
	defer usr1.Stop()
	r := &rping{c: c, stdout: stdout, stderr: stderr, usr1: usr1}
	if err := r.run(ctx); err != nil {
		if err != errReported {
			fmt.Fprintf(stderr, "rocev2d rping: %v\n", err)
		}
		return rpingExitFail
	}
	return cli.ExitOK
}

// rpingListening, when set (by tests), is called once the server listens.
var rpingListening func(addr netip.AddrPort)

// rping is one run of rping: an endpoint (device, PD, one CQ for both
// queues, an RC QP in INIT), its four buffers and the connection.
type rping struct {
	c              *rpingConfig
	stdout, stderr io.Writer
	usr1           *cli.USR1Watch

	e                *cli.Endpoint
	conn             *rdmacm.Conn
	recvBuf, sendBuf []byte // struct rping_rdma_info each
	recvMR, sendMR   *memreg.MR
	rdmaBuf          []byte // the server's READ sink and WRITE source; the client's WRITE sink
	rdmaMR           *memreg.MR
	startBuf         []byte // the client's READ source
	startMR          *memreg.MR
	peerDone         bool // the peer disconnected (RDMA_CM_EVENT_DISCONNECTED)
}

func (r *rping) debugf(format string, args ...any) {
	if r.c.debug {
		fmt.Fprintf(r.stdout, format, args...)
	}
}

// run is rping's main: resolve, set up, connect or accept, ping, disconnect.
func (r *rping) run(ctx context.Context) error {
	c := r.c
	var peer, local netip.Addr
	var err error
	if c.server {
		if local = c.bind; !local.IsValid() {
			if local, err = resolveAddr(ctx, c.addr); err != nil {
				return err
			}
		}
	} else {
		if peer, err = resolveAddr(ctx, c.addr); err != nil {
			return err
		}
		switch {
		case c.bind.IsValid():
			local = c.bind
		case c.source != "":
			if local, err = resolveAddr(ctx, c.source); err != nil {
				return err
			}
		default:
			if local, err = routeSource(peer); err != nil {
				return err
			}
		}
		if local.Is4() != peer.Is4() {
			return fmt.Errorf("local address %v and server address %v are of different families", local, peer)
		}
	}
	link, err := cli.ListenSocket(local, c.sock.Options(true, 0), "pick another address with --bind")
	if err != nil {
		return err
	}
	r.e, err = cli.NewEndpoint(link, cli.EndpointConfig{SendCQ: rpingSQDepth * 2, MaxSendWR: rpingSQDepth, MaxRecvWR: 2,
		Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead, CC: c.sock.CC.Config()})
	if err != nil {
		return err
	}
	defer r.e.Close()
	r.debugf("created pd, cq and qp %#x on %v\n", r.e.QP.QPN(), local)
	r.usr1.Add(local.String(), r.e.Dev)
	if err := r.setupBuffers(); err != nil {
		return err
	}
	if c.counters {
		defer func() {
			cli.PrintCounters(r.stdout, local.String(), r.e.Dev)
			printCMStats(r.stdout, local.String(), rdmacm.StatsOf(r.e.Dev))
		}()
	}
	opts := rdmacm.Options{QP: r.e.QP, PD: r.e.PD, SendCQ: r.e.SCQ, RecvCQ: r.e.RCQ,
		ResponderResources: 1, InitiatorDepth: 1, // rping_init_conn_param
		Retry:     &transport.Retry{Timeout: transport.DefaultRetry.Timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: transport.DefaultRetry.MinRNRTimer},
		KeepAlive: c.keepAlive, KeepAliveTimeout: c.keepAliveTimeout,
		Prepare: func(qp *transport.QP) error { return r.postRecv() }}
	if c.server {
		return r.runServer(ctx, &opts)
	}
	return r.runClient(ctx, netip.AddrPortFrom(peer, uint16(c.port)), &opts)
}

// resolveAddr is rping's get_addr: an IP address or a host name. An
// address in brackets is taken, one with a port or a link-local one
// without its zone is refused, saying why, before any name lookup.
func resolveAddr(ctx context.Context, s string) (netip.Addr, error) {
	s, err := cli.PeerArg("address", s, "-p")
	if err != nil {
		return netip.Addr{}, fmt.Errorf("getaddrinfo failed (%v) - invalid hostname or IP address", err)
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), nil
	}
	as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", s)
	if err != nil || len(as) == 0 {
		return netip.Addr{}, fmt.Errorf("getaddrinfo failed (%v) - invalid hostname or IP address", err)
	}
	for _, a := range as {
		if a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	return as[0], nil
}

// routeSource is the local address the kernel routes peer from, the source
// rdma_resolve_addr picks when it is given none.
func routeSource(peer netip.Addr) (netip.Addr, error) {
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, 4791)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %v: %w (give the local address with -I or --bind)", peer, err)
	}
	defer conn.Close()
	return conn.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// setupBuffers registers rping's buffers (rping_setup_buffers): the receive
// and send messages, the rdma buffer (LOCAL_WRITE|REMOTE_READ|REMOTE_WRITE)
// and, on the client, the start buffer (the same rights).
func (r *rping) setupBuffers() error {
	var err error
	if r.recvBuf, r.recvMR, err = r.e.Alloc(rpingInfoSize, memreg.AccessLocalWrite); err != nil {
		return fmt.Errorf("recv_buf reg_mr failed: %w", err)
	}
	if r.sendBuf, r.sendMR, err = r.e.Alloc(rpingInfoSize, 0); err != nil {
		return fmt.Errorf("send_buf reg_mr failed: %w", err)
	}
	rights := memreg.AccessLocalWrite | memreg.AccessRemoteRead | memreg.AccessRemoteWrite
	if r.rdmaBuf, r.rdmaMR, err = r.e.Alloc(r.c.size, rights); err != nil {
		return fmt.Errorf("rdma_buf reg_mr failed: %w", err)
	}
	if !r.c.server {
		if r.startBuf, r.startMR, err = r.e.Alloc(r.c.size, rights); err != nil {
			return fmt.Errorf("start_buf reg_mr failed: %w", err)
		}
	}
	r.debugf("allocated & registered buffers...\n")
	return nil
}

func (r *rping) postRecv() error {
	err := r.e.QP.PostRecv(transport.RecvWR{WRID: rpingWRIDRecv, SGEs: []memreg.SGE{r.recvMR.SGE(0, rpingInfoSize)}})
	if err != nil {
		return fmt.Errorf("ibv_post_recv failed: %w", err)
	}
	return nil
}

// postInfo SENDs the send buffer (rping's sq_wr, signalled).
func (r *rping) postInfo() error {
	return r.post(transport.SendWR{WRID: rpingWRID, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{r.sendMR.SGE(0, rpingInfoSize)}})
}

// post posts one send work request; a refusal is rping's "post send
// error" (errReported).
func (r *rping) post(wr transport.SendWR) error {
	if err := r.e.QP.PostSend(wr); err != nil {
		fmt.Fprintf(r.stderr, "post send error %v\n", err)
		return errReported
	}
	return nil
}

// formatSend is rping_format_send: the buffer's address, rkey and the
// ping size into the send buffer.
func (r *rping) formatSend(mr *memreg.MR) {
	binary.BigEndian.PutUint64(r.sendBuf[0:8], mr.IOVA())
	binary.BigEndian.PutUint32(r.sendBuf[8:12], mr.RKey())
	binary.BigEndian.PutUint32(r.sendBuf[12:16], uint32(r.c.size))
	r.debugf("RDMA addr %x rkey %x len %d\n", mr.IOVA(), mr.RKey(), r.c.size)
}

// rpingEvent is what the completion and CM handlers tell the main loop.
type rpingEvent int

const (
	evRecv rpingEvent = iota
	evReadDone
	evWriteDone
	evDisconnected
	evError // a completion failed (rping's ERROR state); already reported
)

// errReported is a failure rping has already described on stderr.
var errReported = errors.New("rping failed")

// rpingGrace is how long an interrupted test loop may run on to reach the
// point where it disconnects without racing the peer (see loopContexts).
const rpingGrace = 3 * time.Second

// loopContexts returns the contexts of a test loop's waits. gctx ends
// rpingGrace after ctx (an interrupt or --timeout): the loop checks ctx
// itself at the one point of a ping where the peer has no message of ours
// still to take in — the client before it advertises the next ping, the
// server once that advertisement has arrived — and disconnects there. A
// DREQ right behind a SEND makes the real rping fail: its CM thread and
// its CQ thread race, and the receive completion processed after the
// DISCONNECTED event turns its state back ("wait for RDMA_WRITE_ADV state
// 9", exit 255). cctx also ends when the connection does (the peer's
// DREQ).
func (r *rping) loopContexts(ctx context.Context) (gctx, cctx context.Context, cancel func()) {
	gctx, gcancel := context.WithCancelCause(context.WithoutCancel(ctx))
	var mu sync.Mutex // grace is set by the AfterFunc goroutine, read by cancel
	var grace *time.Timer
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		grace = time.AfterFunc(rpingGrace, func() { gcancel(context.Cause(ctx)) })
		mu.Unlock()
	})
	cctx, ccancel := context.WithCancel(gctx)
	go func() {
		select {
		case <-r.conn.Done():
			ccancel()
		case <-cctx.Done():
		}
	}()
	return gctx, cctx, func() {
		if !stop() {
			mu.Lock()
			if grace != nil {
				grace.Stop()
			}
			mu.Unlock()
		}
		ccancel()
		gcancel(nil)
	}
}

// next waits for the next event that moves rping's state: a receive (the
// buffer is reposted, as rping's handler does), a READ or WRITE
// completion, the peer's disconnect, or a failed completion (reported as
// rping's handler does). Send completions only log. cctx is watchConn's
// context; an error is ctx's.
func (r *rping) next(ctx, cctx context.Context) (rpingEvent, error) {
	done := r.conn.Done()
	var wc [1]transport.WC
	for {
		if r.e.SCQ.Poll(wc[:]) == 0 {
			if _, err := r.e.SCQ.Wait(cctx, wc[:]); err != nil {
				if ctx.Err() != nil {
					return 0, ctx.Err()
				}
				select {
				case <-done:
					return r.ended(), nil
				default:
				}
				fmt.Fprintf(r.stderr, "poll error %v\n", err)
				return evError, nil
			}
		}
		w := wc[0]
		if w.Status != transport.WCSuccess {
			if w.Status == transport.WCWRFlushErr {
				// The QP went to ERR: the peer disconnected (its DREQ
				// moved it) or the QP failed; the CM says which.
				select {
				case <-done:
					return r.ended(), nil
				case <-time.After(2 * time.Second):
					fmt.Fprintf(r.stderr, "cq completion failed status %d (%v) without a disconnect\n", uint8(w.Status), w.Status)
					return evError, nil
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			fmt.Fprintf(r.stderr, "cq completion failed status %d (%v)\n", uint8(w.Status), w.Status)
			return evError, nil
		}
		switch w.Opcode {
		case transport.WCSend:
			r.debugf("send completion\n")
		case transport.WCRDMAWrite:
			r.debugf("rdma write completion\n")
			return evWriteDone, nil
		case transport.WCRDMARead:
			r.debugf("rdma read completion\n")
			return evReadDone, nil
		case transport.WCRecv:
			r.debugf("recv completion\n")
			if w.ByteLen != rpingInfoSize {
				fmt.Fprintf(r.stderr, "Received bogus data, size %d\nrecv wc error: -1\n", w.ByteLen)
				return evError, nil
			}
			if err := r.postRecv(); err != nil {
				fmt.Fprintf(r.stderr, "post recv error: %v\n", err)
				return evError, nil
			}
			return evRecv, nil
		default:
			r.debugf("unknown!!!!! completion\n")
			return evError, nil
		}
	}
}

// ended reports why the connection ended once its Done channel has
// closed: the peer's disconnect (its DREQ) as rping's CM handler reports
// RDMA_CM_EVENT_DISCONNECTED, anything else — keep-alive found the peer
// dead, the QP failed — as the error it is (rping's ERROR state, exit
// 255): Linux's rdma_cm raises DISCONNECTED only for a DREQ or DREP,
// never for a peer that died silently.
func (r *rping) ended() rpingEvent {
	err := r.conn.Err()
	if err == nil || errors.Is(err, rdmacm.ErrDisconnected) || errors.Is(err, rdmacm.ErrClosed) {
		return r.disconnected()
	}
	fmt.Fprintf(r.stderr, "connection lost: %v\n", err)
	r.peerDone = true // its end is reported: no DISCONNECT EVENT line at the finish
	return evError
}

// disconnected reports the peer's disconnect as rping's CM handler does.
func (r *rping) disconnected() rpingEvent {
	if !r.peerDone {
		r.peerDone = true
		who := "client"
		if r.c.server {
			who = "server"
		}
		fmt.Fprintf(r.stderr, "%s DISCONNECT EVENT...\n", who)
	}
	return evDisconnected
}

// expect waits for the event that moves rping to the state called name;
// anything else is rping's "wait for NAME state N" failure (errReported) —
// unless the peer disconnected, which ends the loop with success, as
// rping's "return (cb->state == DISCONNECTED) ? 0 : ret". stop says the
// loop ends; err is then nil, errReported or ctx's error.
func (r *rping) expect(ctx, cctx context.Context, want rpingEvent, name string) (stop bool, err error) {
	ev, err := r.next(ctx, cctx)
	if err != nil {
		return true, err
	}
	if ev == want {
		return false, nil
	}
	state := rpingStError
	if ev == evDisconnected {
		state = rpingStDisconnected
	}
	fmt.Fprintf(r.stderr, "wait for %s state %d\n", name, state)
	if ev == evDisconnected {
		return true, nil
	}
	return true, errReported
}

// interrupted ends a run whose context ended (SIGINT, SIGTERM, --timeout):
// disconnect, then say why.
func (r *rping) interrupted(ctx context.Context) error {
	if r.conn != nil {
		r.conn.Close()
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return fmt.Errorf("%v; disconnected", cause)
	}
	return errors.New("interrupted; disconnected")
}

// unreachableWhy is what an rdmacm.ErrUnreachable (the network bounced
// the CM message: ICMP port unreachable) says of the peer. Either no
// RoCEv2 device holds UDP 4791 there, or the address is shared
// (udp/share) by processes none of which runs a connection manager: the
// group's steering program drops the CM message, and the kernel answers
// as if nothing listened.
const unreachableWhy = "nothing answered on UDP 4791 there: no RoCEv2 device, or none there runs a connection manager"

// unreachableError is every tool's explanation of an
// rdmacm.ErrUnreachable from peer: rping's, rdma-client's and udaddy's.
// Another bounce than port unreachable (host unreachable: nothing has the
// address) is not explained as one.
func unreachableError(peer netip.AddrPort, err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%v unreachable: %s (`rocev2d share status %v` there lists a shared address's processes): %w",
			peer, unreachableWhy, peer.Addr(), err)
	}
	return fmt.Errorf("%v unreachable: %w", peer, err)
}

// cmError prints rping's CM event line for a failed connect and returns
// rocev2d's explanation.
func (r *rping) cmError(err error, peer netip.AddrPort) error {
	var rej *rdmacm.RejectError
	switch {
	case errors.As(err, &rej):
		fmt.Fprintf(r.stderr, "cma event RDMA_CM_EVENT_REJECTED, error %d\n", uint16(rej.Reason))
		if errors.Is(err, rdmacm.ErrRefused) {
			return fmt.Errorf("connection to %v refused: nothing listens on rdma_cm port %d there (REJ: %v)", peer, peer.Port(), rej.Reason)
		}
		return fmt.Errorf("connection to %v rejected: %v", peer, rej.Reason)
	case errors.Is(err, rdmacm.ErrUnreachable):
		// The network said so at once (ICMP port or host unreachable).
		fmt.Fprintf(r.stderr, "cma event RDMA_CM_EVENT_UNREACHABLE, error -111\n")
		return unreachableError(peer, err)
	case errors.Is(err, rdmacm.ErrTimeout):
		fmt.Fprintf(r.stderr, "cma event RDMA_CM_EVENT_UNREACHABLE, error -110\n")
		return fmt.Errorf("no answer from %v: the host is down or frozen, or nothing runs a connection manager there (no RoCEv2 device, or UDP 4791 filtered)", peer)
	}
	fmt.Fprintf(r.stderr, "connect error -1\n")
	return err
}

// finish ends a test loop as rping_run_client/server do: on a failure
// "rping client failed: -1" (or server), then rping_disconnect (a DREQ,
// or after the peer's nothing).
func (r *rping) finish(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return r.interrupted(ctx)
	}
	if err != nil {
		who := "client"
		if r.c.server {
			who = "server"
		}
		fmt.Fprintf(r.stderr, "rping %s failed: -1\n", who)
	}
	r.conn.Close()
	if !r.c.server && !r.peerDone {
		// The client's own disconnect completes with the DREP.
		r.disconnected()
	}
	if err != nil {
		return errReported
	}
	return nil
}

// runClient is rping_run_client: connect, ping, disconnect.
func (r *rping) runClient(ctx context.Context, peer netip.AddrPort, opts *rdmacm.Options) error {
	r.debugf("rdma_resolve_addr - rdma_resolve_route successful\n")
	conn, err := rdmacm.Dial(ctx, r.e.Dev, peer, opts)
	if err != nil {
		if ctx.Err() != nil {
			return r.interrupted(ctx)
		}
		return r.cmError(err, peer)
	}
	r.conn = conn
	r.debugf("rdma_connect successful\n")
	return r.finish(ctx, r.testClient(ctx))
}

// testClient is rping_test_client.
func (r *rping) testClient(ctx context.Context) error {
	c := r.c
	gctx, cctx, cancel := r.loopContexts(ctx)
	defer cancel()
	start := byte(65)
	for ping := 0; c.count == 0 || ping < c.count; ping++ {
		if ctx.Err() != nil {
			return ctx.Err() // between pings: the server waits for our next advertisement
		}
		rpingFill(r.startBuf, ping, start)
		start++
		if start > 122 {
			start = 65
		}
		r.formatSend(r.startMR)
		if err := r.postInfo(); err != nil {
			return err
		}
		// Wait for the server to ACK.
		if stop, err := r.expect(gctx, cctx, evRecv, "RDMA_WRITE_ADV"); stop {
			return r.cutShort(ctx, ping, err)
		}
		r.formatSend(r.rdmaMR)
		if err := r.postInfo(); err != nil {
			return err
		}
		// Wait for the server to say the RDMA Write is complete.
		if stop, err := r.expect(gctx, cctx, evRecv, "RDMA_WRITE_COMPLETE"); stop {
			return r.cutShort(ctx, ping, err)
		}
		if c.validate && string(r.startBuf) != string(r.rdmaBuf) {
			fmt.Fprintf(r.stderr, "data mismatch!\n")
			return errReported
		}
		if c.verbose > 0 {
			fmt.Fprintf(r.stdout, "ping data: %s\n", cString(r.rdmaBuf))
		}
	}
	return nil
}

// cutShort is the end of a client loop that expect stopped after done
// pings with err: rping ends with success when the server disconnects,
// whatever -C asked for ("return (cb->state == DISCONNECTED) ? 0 :
// ret"); rocev2d does so only for -C 0 (until the server ends) and says
// that a counted run was cut short, exit 255: a client that asked for
// -C 3 and got none (the server failed and disconnected) exited 0.
func (r *rping) cutShort(ctx context.Context, done int, err error) error {
	if err != nil || r.c.count == 0 || done >= r.c.count || ctx.Err() != nil {
		return err
	}
	fmt.Fprintf(r.stderr, "rocev2d rping: the server disconnected after %d of -C %d pings (its output says why)\n", done, r.c.count)
	return errReported
}

// rpingFill writes ping's data into buf as rping_test_client does: the
// message "rdma-ping-N: " (cut to the buffer), then the ASCII characters
// from start upward, 'A' after 'z', and a NUL in the last byte.
func rpingFill(buf []byte, ping int, start byte) {
	msg := fmt.Sprintf("rdma-ping-%d: ", ping)
	cc := copy(buf, msg)
	if len(msg) >= len(buf) {
		// snprintf cut the message and wrote its NUL in the last byte.
		cc = len(msg)
	}
	ch := start
	for i := cc; i < len(buf); i++ {
		buf[i] = ch
		ch++
		if ch > 122 {
			ch = 65
		}
	}
	buf[len(buf)-1] = 0
}

// cString is the bytes of b up to its first NUL, as printf's %s reads them.
func cString(b []byte) []byte {
	for i, x := range b {
		if x == 0 {
			return b[:i]
		}
	}
	return b
}

// runServer is rping_run_server: listen, accept one client, serve it
// until it disconnects.
func (r *rping) runServer(ctx context.Context, opts *rdmacm.Options) error {
	backlog := 3
	if r.c.persistent {
		backlog = 64
	}
	l, err := rdmacm.Listen(r.e.Dev, uint16(r.c.port), &rdmacm.ListenOptions{Options: *opts, Backlog: backlog})
	if err != nil {
		return fmt.Errorf("rdma_listen: %w", err)
	}
	r.debugf("rdma_bind_addr successful\nrdma_listen\n")
	if rpingListening != nil {
		rpingListening(l.Addr())
	}
	if r.c.persistent {
		return r.runPersistentServer(ctx, l, opts)
	}
	req, err := l.Next(ctx)
	if err != nil {
		l.Close()
		if ctx.Err() != nil {
			return r.interrupted(ctx)
		}
		return fmt.Errorf("waiting for a connection request: %w", err)
	}
	r.debugf("accepting client connection request\n")
	conn, err := req.Accept(ctx, opts)
	// rping serves one client: later requests are refused.
	l.Close()
	if err != nil {
		if ctx.Err() != nil {
			return r.interrupted(ctx)
		}
		fmt.Fprintf(r.stderr, "wait for CONNECTED state %d\nconnect error -1\n", rpingStError)
		return fmt.Errorf("accepting %v: %w", req.RemoteAddr(), err)
	}
	r.conn = conn
	return r.finish(ctx, r.testServer(ctx))
}

// testServer is rping_test_server.
func (r *rping) testServer(ctx context.Context) error {
	gctx, cctx, cancel := r.loopContexts(ctx)
	defer cancel()
	var remoteAddr uint64
	var remoteRKey, remoteLen uint32
	readInfo := func() {
		remoteAddr = binary.BigEndian.Uint64(r.recvBuf[0:8])
		remoteRKey = binary.BigEndian.Uint32(r.recvBuf[8:12])
		remoteLen = binary.BigEndian.Uint32(r.recvBuf[12:16])
		r.debugf("Received rkey %x addr %x len %d from peer\n", remoteRKey, remoteAddr, remoteLen)
	}
	for {
		// Wait for the client's start STAG/TO/Len.
		if stop, err := r.expect(gctx, cctx, evRecv, "RDMA_READ_ADV"); stop {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err() // the client took in our last go-ahead: it sent this
		}
		readInfo()
		r.debugf("server received sink adv\n")
		if int(remoteLen) > len(r.rdmaBuf) {
			// rping posts the READ anyway and fails on its completion
			// (a local protection or length error): say why instead.
			fmt.Fprintf(r.stderr, "rocev2d rping: the client pings with %d bytes, more than this server's -S %d: the server READs the client's data into its own buffer; give both sides the same -S\n",
				remoteLen, len(r.rdmaBuf))
			return errReported
		}
		// The RDMA READ of the client's start buffer into the rdma buffer.
		if err := r.post(transport.SendWR{WRID: rpingWRID, Opcode: transport.WRRead, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{r.rdmaMR.SGE(0, remoteLen)}, RemoteAddr: remoteAddr, RKey: remoteRKey}); err != nil {
			return err
		}
		r.debugf("server posted rdma read req \n")
		if stop, err := r.expect(gctx, cctx, evReadDone, "RDMA_READ_COMPLETE"); stop {
			return err
		}
		r.debugf("server received read complete\n")
		if r.c.verbose > 0 {
			fmt.Fprintf(r.stdout, "server ping data: %s\n", cString(r.rdmaBuf))
		}
		// Tell the client to continue.
		if err := r.postInfo(); err != nil {
			return err
		}
		r.debugf("server posted go ahead\n")
		// Wait for the client's rdma buffer STAG/TO/Len.
		if stop, err := r.expect(gctx, cctx, evRecv, "RDMA_WRITE_ADV"); stop {
			return err
		}
		readInfo()
		r.debugf("server received sink adv\n")
		// The RDMA WRITE of the data (up to its NUL) back.
		n := min(uint32(len(cString(r.rdmaBuf))+1), uint32(len(r.rdmaBuf)))
		r.debugf("rdma write from lkey %x laddr %x len %d\n", r.rdmaMR.LKey(), r.rdmaMR.IOVA(), n)
		if err := r.post(transport.SendWR{WRID: rpingWRID, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{r.rdmaMR.SGE(0, n)}, RemoteAddr: remoteAddr, RKey: remoteRKey}); err != nil {
			return err
		}
		if stop, err := r.expect(gctx, cctx, evWriteDone, "RDMA_WRITE_COMPLETE"); stop {
			return err
		}
		r.debugf("server rdma write complete \n")
		// Tell the client to begin again.
		if err := r.postInfo(); err != nil {
			return err
		}
		r.debugf("server posted go ahead\n")
	}
}

// printCMStats prints the counters of a device's connection manager.
func printCMStats(w io.Writer, label string, s rdmacm.Stats) {
	fmt.Fprintf(w, "cm %s:\n", label)
	for _, kv := range []struct {
		n string
		v uint64
	}{{"cm_mads_in", s.MADsIn}, {"cm_mads_out", s.MADsOut}, {"cm_retransmits", s.Retransmits},
		{"cm_duplicates", s.Duplicates}, {"cm_malformed", s.Malformed}, {"cm_unknown", s.Unknown},
		{"cm_rej_no_listener", s.RejNoListener}, {"cm_rej_backlog", s.RejBacklog}, {"cm_rej_stale", s.RejStale},
		{"cm_established", s.Established}, {"cm_disconnected", s.Disconnected},
		{"cm_lost_qp", s.QPFailed}, {"cm_keepalive_probes", s.KeepAliveProbes}, {"cm_keepalive_dead", s.KeepAliveFailed},
		{"cm_unreachable", s.Unreachable}, {"cm_shed", s.Shed}, {"cm_backlog_dropped", s.BacklogDropped},
		{"cm_acceptq_full", s.AcceptQueueFull},
		{"cm_acceptq_dropped", s.AcceptQueueDropped}, {"cm_acceptq_evicted", s.AcceptQueueEvicted},
		{"cm_spoof_dropped", s.SpoofDropped}, {"cm_stray_dreq", s.StrayDREQ},
		{"cm_farewell_dreqs", s.FarewellDREQs}, {"cm_dreq_for_dead", s.DREQForDead}, {"cm_drep_for_dead", s.DREPForDead}} {
		fmt.Fprintf(w, "  %-24s %d\n", kv.n, kv.v)
	}
	// REJs by reason and ends by cause, those that happened, in order.
	for _, set := range []struct {
		prefix string
		m      map[cm.RejectReason]uint64
	}{{"cm_rej_sent_", s.RejSent}, {"cm_rej_rcvd_", s.RejRecv}} {
		for r := cm.RejectReason(0); r < 64; r++ {
			if v := set.m[r]; v != 0 {
				fmt.Fprintf(w, "  %-24s %d\n", fmt.Sprintf("%s%d", set.prefix, r), v)
			}
		}
	}
	for c := rdmacm.Cause(1); c < 16; c++ {
		if v := s.Ended[c]; v != 0 {
			fmt.Fprintf(w, "  %-24s %d\n", "cm_ended_"+c.String(), v)
		}
	}
}

// runPersistentServer is rping -P (rping_run_persistent_server): every
// connection request is served on a goroutine of its own, with a QP, CQ
// and buffers of its own on the server's device and PD, while the
// listener takes the next; it ends when interrupted, disconnecting the
// clients it serves then.
func (r *rping) runPersistentServer(ctx context.Context, l *rdmacm.Listener, opts *rdmacm.Options) error {
	var wg sync.WaitGroup
	out, errOut := &syncWriter{w: r.stdout}, &syncWriter{w: r.stderr}
	r.stdout, r.stderr = out, errOut
	defer wg.Wait()
	for {
		req, err := l.Next(ctx)
		if err != nil {
			l.Close()
			wg.Wait()
			if ctx.Err() != nil {
				return r.interrupted(ctx)
			}
			return fmt.Errorf("waiting for a connection request: %w", err)
		}
		r.debugf("accepting client connection request\n")
		child, err := r.child()
		if err != nil {
			fmt.Fprintf(r.stderr, "setting up a connection for %v: %v\n", req.RemoteAddr(), err)
			req.Reject(nil)
			continue
		}
		o := *opts
		o.QP, o.SendCQ, o.RecvCQ = child.e.QP, child.e.SCQ, child.e.RCQ
		o.Prepare = func(*transport.QP) error { return child.postRecv() }
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer child.releaseChild()
			conn, err := req.Accept(ctx, &o)
			if err != nil {
				if ctx.Err() == nil {
					fmt.Fprintf(child.stderr, "wait for CONNECTED state %d\nconnect error -1\n", rpingStError)
					// rping says no more; say why (the connection is
					// this client's alone: the server goes on).
					fmt.Fprintf(child.stderr, "rocev2d rping: accepting %v: %v\n", req.RemoteAddr(), err)
				}
				return
			}
			child.conn = conn
			child.finish(ctx, child.testServer(ctx))
		}()
	}
}

// child makes the resources of one connection of a persistent server: a
// CQ, an RC QP in INIT and rping's buffers, on r's device and PD.
func (r *rping) child() (*rping, error) {
	p := r.e
	e := &cli.Endpoint{Link: p.Link, Dev: p.Dev, PD: p.PD, Access: p.Access, PSN: p.PSN}
	ch := &rping{c: r.c, stdout: r.stdout, stderr: r.stderr, usr1: r.usr1, e: e}
	var err error
	if e.SCQ, err = p.Dev.CreateCQ(rpingSQDepth * 2); err != nil {
		return nil, fmt.Errorf("couldn't create CQ: %w", err)
	}
	e.RCQ = e.SCQ
	if e.QP, err = e.NewQP(cli.EndpointConfig{MaxSendWR: rpingSQDepth, MaxRecvWR: 2, Access: p.Access}); err != nil {
		ch.releaseChild()
		return nil, err
	}
	if err := ch.setupBuffers(); err != nil {
		ch.releaseChild()
		return nil, err
	}
	return ch, nil
}

// releaseChild frees what child made: the QP, the CQ, the buffers.
func (r *rping) releaseChild() {
	e := r.e
	if e.QP != nil {
		e.QP.Destroy()
	}
	if e.SCQ != nil {
		e.SCQ.Destroy()
	}
	e.ReleaseMemory()
}

// syncWriter serializes the writes of a persistent server's connections.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
