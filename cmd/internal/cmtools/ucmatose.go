package cmtools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

// ucmatose is librdmacm's cmatose example (rdma-core 44, installed as
// ucmatose): -c RC connections through the CM; the server sends -C
// messages of -S bytes on each, the client answers with as many, and the
// server disconnects them all.

func init() {
	commands.Register("ucmatose", "rdma_cm connections with SEND traffic, compatible with librdmacm's ucmatose", ucmatoseUsage, runUcmatose)
}

const ucmatoseUsage = `usage: rocev2d ucmatose [-s server_address] [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-p port_number] [-t tos] [-a ack_timeout]

librdmacm's cmatose example (rdma-core 44, the ucmatose binary) on rocev2.
Without -s it is the server: it accepts -c connections (each an RC QP with
-C receives of -S bytes posted before the REP), and once all are
established it sends -C messages of -S bytes on each, waits for their
completions, then for -C messages from each client, and disconnects every
connection (a DREQ each) and waits for their DREPs. With -s it is the
client: it connects -c connections at once (receives posted before the
REQ), waits for -C messages on each, sends -C back on each, and waits for
the server's disconnects. -C 0 or -S 0: no messages, only connect and
disconnect. Either side may be the real ucmatose.

options:
  -s addr        the server's address (client mode)
  -b addr        local address (the RoCEv2 address; the server needs it or --bind)
  -c n           connections (default 1)
  -C n           messages each way per connection (default 10)
  -S n           message size in bytes (default 100)
  -p port        rdma_cm port (default 7471)
  -t tos         IP type of service of the MADs and the QPs
  -a n           the QPs' local ACK timeout exponent (0..31), as cmatose's
                 rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT): the client's
                 (default 14) goes in its REQ; a server's overrides the REQ's
                 (without -a a server takes the REQ's)
  -P tcp, -f ip|name, -m   accepted (TCP port space, IP addresses; -m only
                 prints cmatose's "migrating to new event channel")
      --bind=IP  same as -b
      --timeout=DUR  give up when the whole run takes longer (default 0 = no limit)
      --counters print the device's and the CM's counters at the end
` + cli.SocketUsage + `
Output as cmatose's: its progress lines, "test complete", "return status N";
a refused or failed connection prints "cmatose: event: RDMA_CM_EVENT_REJECTED,
error: REASON" (or RDMA_CM_EVENT_UNREACHABLE, error: -110 / -111) and N is
that status. rocev2d also checks what cmatose does not: every completion's
status and that every message received is -S bytes (a failure prints what
and ends with -1). Exit status: N & 0xff (255 for -1); 1 for bad usage.
`

type ucmatoseConfig struct {
	server     string
	bind       netip.Addr
	conns      int
	count      int
	size       int
	port       int
	tos        uint8
	ackTimeout int // -1: not set
	migrate    bool
	timeout    time.Duration
	counters   bool
	sock       cli.SocketFlags
}

var ucmatoseOptLetters = map[byte]bool{'s': true, 'b': true, 'f': true, 'P': true, 'c': true, 'C': true, 'S': true, 't': true, 'p': true, 'a': true}

// ucmatoseMaxSize bounds -S: one registered buffer per connection.
const ucmatoseMaxSize = 1 << 30

func parseUcmatoseFlags(args []string) (*ucmatoseConfig, error) {
	c := &ucmatoseConfig{ackTimeout: -1}
	fs := cli.NewFlagSet("ucmatose")
	var bindB, bind, port, tos, ack, ps, format string
	fs.StringVar(&c.server, "s", "", "")
	fs.StringVar(&bindB, "b", "", "")
	fs.StringVar(&format, "f", "", "")
	fs.StringVar(&ps, "P", "", "")
	fs.IntVar(&c.conns, "c", 1, "")
	fs.IntVar(&c.count, "C", 10, "")
	fs.IntVar(&c.size, "S", 100, "")
	fs.StringVar(&tos, "t", "", "")
	fs.StringVar(&port, "p", "7471", "")
	fs.StringVar(&ack, "a", "", "")
	fs.BoolVar(&c.migrate, "m", false, "")
	fs.StringVar(&bind, "bind", "", "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.counters, "counters", false, "")
	cli.AddSocketFlags(fs, &c.sock)
	if err := fs.Parse(splitGetopt(args, ucmatoseOptLetters)); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.conns < 1:
		return nil, fmt.Errorf("-c %d: at least one connection", c.conns)
	case c.conns > cmtimeMaxConns:
		return nil, fmt.Errorf("-c %d: at most %d connections (one QP each on one device)", c.conns, cmtimeMaxConns)
	case c.count < 0:
		return nil, fmt.Errorf("-C %d: negative", c.count)
	case c.count > 65536:
		return nil, fmt.Errorf("-C %d: at most 65536 messages (a QP's work requests and CQ entries)", c.count)
	case c.size < 0 || c.size > ucmatoseMaxSize:
		return nil, fmt.Errorf("-S %d: out of range 0..%d", c.size, ucmatoseMaxSize)
	case c.timeout < 0:
		return nil, fmt.Errorf("--timeout=%v: negative (0: no limit)", c.timeout)
	case ps != "" && !strings.HasPrefix(strings.ToLower(ps), "tcp"):
		return nil, fmt.Errorf("-P %s: rocev2d ucmatose serves the TCP port space only", ps)
	case format != "" && !strings.EqualFold(format, "ip") && !strings.EqualFold(format, "name"):
		return nil, fmt.Errorf("-f %s: IP addresses (or names) only", format)
	}
	if c.size == 0 {
		c.count = 0 // as cmatose's create_message
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return nil, fmt.Errorf("-p %q: port out of range 1..65535", port)
	}
	c.port = p
	if tos != "" {
		v, err := strconv.ParseUint(tos, 0, 8)
		if err != nil {
			return nil, fmt.Errorf("-t %s: not a type of service 0..255", tos)
		}
		c.tos = uint8(v)
	}
	if ack != "" {
		v, err := strconv.ParseUint(ack, 0, 8)
		if err != nil || v > 31 {
			return nil, fmt.Errorf("-a %s: not an ACK timeout exponent 0..31", ack)
		}
		c.ackTimeout = int(v)
	}
	if c.bind, err = bindFor(bind, bindB, c.server == ""); err != nil {
		return nil, err
	}
	return c, nil
}

// ucmatoseListening, when set (by tests), is called once the server listens.
var ucmatoseListening func(addr netip.AddrPort)

func runUcmatose(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseUcmatoseFlags(args)
	if code, done := flagOutcome("ucmatose", ucmatoseUsage, err, stdout, stderr); done {
		return code
	}
	ctx, cancel := runTimeout(ctx, c.timeout)
	defer cancel()
	u := &ucmatose{c: c, stdout: stdout, stderr: stderr}
	ret := u.run(ctx)
	fmt.Fprintf(stdout, "test complete\n")
	fmt.Fprintf(stdout, "return status %d\n", ret)
	return ret & 0xff
}

type ucmatose struct {
	c              *ucmatoseConfig
	stdout, stderr io.Writer
	e              *cli.Endpoint

	mu   sync.Mutex            // e.Alloc, bufs
	bufs map[uint32]*memreg.MR // each QP's message buffer, by QPN
	out  sync.Mutex            // stdout lines from connection goroutines
}

// fail prints what went wrong (cmatose's perror lines) and returns -1.
func (u *ucmatose) fail(format string, args ...any) int {
	fmt.Fprintf(u.stderr, "cmatose: "+format+"\n", args...)
	return -1
}

// options are a connection's: its own CQs and QP of max(-C, 1) entries
// on the shared PD, -C receives of -S bytes into its buffer posted in
// INIT, before the REQ or REP (cmatose's init_node and post_recvs).
func (u *ucmatose) options() rdmacm.Options {
	cqe := max(u.c.count, 1)
	o := rdmacm.Options{PD: u.e.PD, CQDepth: cqe, MaxSendWR: cqe, MaxRecvWR: cqe,
		ResponderResources: 1, InitiatorDepth: 1, TrafficClass: u.c.tos, KeepAlive: -1,
		Prepare: func(qp *transport.QP) error {
			if u.c.count == 0 {
				return nil
			}
			u.mu.Lock()
			_, mr, err := u.e.Alloc(u.c.size, memreg.AccessLocalWrite)
			if err == nil {
				u.bufs[qp.QPN()] = mr
			}
			u.mu.Unlock()
			if err != nil {
				return fmt.Errorf("failed to reg MR: %v", err)
			}
			for i := 0; i < u.c.count; i++ {
				if err := qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{mr.SGE(0, uint32(u.c.size))}}); err != nil {
					return fmt.Errorf("failed to post receives: %v", err)
				}
			}
			return nil
		}}
	if u.c.ackTimeout >= 0 {
		rt := transport.DefaultRetry
		rt.Timeout = uint8(u.c.ackTimeout)
		rt.RetryCnt = 5 // cmatose's conn_param.retry_count
		o.Retry = &rt
		// A server's -a is rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)
		// on the request's ID (cmatose's connect_handler): its QP's ACK
		// timeout, not the client's from the REQ.
		o.OwnACKTimeout = true
	} else {
		rt := transport.DefaultRetry
		rt.RetryCnt = 5
		o.Retry = &rt
	}
	return o
}

func (u *ucmatose) run(ctx context.Context) int {
	c := u.c
	client := c.server != ""
	if client {
		fmt.Fprintf(u.stdout, "cmatose: starting client\n")
	} else {
		fmt.Fprintf(u.stdout, "cmatose: starting server\n")
	}
	local := c.bind
	var peer netip.Addr
	var err error
	if client {
		if peer, err = resolveAddr(ctx, c.server); err != nil {
			fmt.Fprintf(u.stdout, "cmatose: getaddrinfo error: %v\n", err)
			return -1
		}
		if !local.IsValid() {
			if local, err = routeSource(peer); err != nil {
				return u.fail("%v", err)
			}
		}
	}
	// The connections make their own CQs; the endpoint's two are unused.
	if u.e, err = cmEndpoint(local, &c.sock, 1, "pick another address with -b"); err != nil {
		return u.fail("%v", err)
	}
	defer u.e.Close()
	u.bufs = map[uint32]*memreg.MR{}
	if c.counters {
		defer func() {
			cli.PrintCounters(u.stdout, local.String(), u.e.Dev)
			printCMStats(u.stdout, local.String(), rdmacm.StatsOf(u.e.Dev))
		}()
	}
	if client {
		return u.client(ctx, netip.AddrPortFrom(peer, uint16(c.port)))
	}
	return u.server(ctx)
}

// connectEvent prints cmatose's line for a connection that failed and
// returns its status.
func (u *ucmatose) connectEvent(err error) int {
	ev, st := cmEvent(err)
	u.out.Lock()
	fmt.Fprintf(u.stdout, "cmatose: event: %s, error: %d\n", ev, st)
	u.out.Unlock()
	fmt.Fprintf(u.stderr, "rocev2d ucmatose: %v\n", err)
	return st
}

func (u *ucmatose) client(ctx context.Context, addr netip.AddrPort) int {
	c := u.c
	fmt.Fprintf(u.stdout, "cmatose: connecting\n")
	conns := make([]*rdmacm.Conn, c.conns)
	errs := make([]error, c.conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := u.options()
			conns[i], errs[i] = rdmacm.Dial(ctx, u.e.Dev, addr, &o)
		}()
	}
	wg.Wait()
	ret := 0
	var live []*rdmacm.Conn
	for i, err := range errs {
		if err != nil {
			if st := u.connectEvent(err); ret == 0 {
				ret = st
			}
			continue
		}
		live = append(live, conns[i])
	}
	defer func() {
		for _, conn := range live {
			conn.Close()
		}
	}()
	if ret == 0 && c.count > 0 {
		fmt.Fprintf(u.stdout, "receiving data transfers\n")
		if err := u.poll(ctx, live, false); err != nil {
			return u.fail("%v", err)
		}
		fmt.Fprintf(u.stdout, "sending replies\n")
		for _, conn := range live {
			if err := u.post(conn); err != nil {
				return u.fail("%v", err)
			}
		}
		fmt.Fprintf(u.stdout, "data transfers complete\n")
	}
	if c.migrate && ret == 0 {
		fmt.Fprintf(u.stdout, "migrating to new event channel\n")
	}
	// disconnect_events: the server disconnects every connection.
	for _, conn := range live {
		select {
		case <-conn.Done():
		case <-ctx.Done():
			return u.fail("waiting for the server's disconnects: %v", context.Cause(ctx))
		}
		if err := conn.Err(); !errors.Is(err, rdmacm.ErrDisconnected) {
			if ret == 0 {
				ret = -1
			}
			fmt.Fprintf(u.stderr, "cmatose: connection to %v ended otherwise than by the server's disconnect: %v\n", addr, err)
		}
	}
	return ret
}

func (u *ucmatose) server(ctx context.Context) int {
	c := u.c
	o := u.options()
	l, err := rdmacm.Listen(u.e.Dev, uint16(c.port), &rdmacm.ListenOptions{Options: o, Backlog: cmBacklog})
	if err != nil {
		return u.fail("failure trying to listen: %v", err)
	}
	defer l.Close()
	if ucmatoseListening != nil {
		ucmatoseListening(l.Addr())
	}
	var conns []*rdmacm.Conn
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	// cmatose's connect_handler: the first -c requests are accepted;
	// every later one while the server runs is refused with rdma_reject
	// (REJ "consumer reject", 28: Linux's ucma_reject reason) and
	// "cmatose: failing connection request". Before, the listener closed
	// after -c and a later client got REJ "invalid service ID" (8).
	type accepted struct {
		conn *rdmacm.Conn
		err  error
	}
	results := make(chan accepted, c.conns)
	intakeCtx, stopIntake := context.WithCancel(ctx)
	var intake sync.WaitGroup
	intake.Add(1)
	go func() {
		defer intake.Done()
		taken := 0
		for {
			r, err := l.Next(intakeCtx)
			if err != nil {
				return
			}
			if taken == c.conns {
				u.out.Lock()
				fmt.Fprintf(u.stdout, "cmatose: failing connection request\n")
				u.out.Unlock()
				r.Reject(nil)
				continue
			}
			taken++
			intake.Add(1)
			go func() {
				defer intake.Done()
				o := u.options()
				conn, err := r.Accept(intakeCtx, &o)
				results <- accepted{conn, err}
			}()
		}
	}()
	defer func() {
		stopIntake()
		l.Close()
		intake.Wait()
		for len(results) > 0 { // accepted after the run gave up
			if a := <-results; a.conn != nil {
				a.conn.Close()
			}
		}
	}()
	for n := 0; n < c.conns; n++ {
		select {
		case a := <-results:
			if a.err != nil { // cmatose's connect_error: one connection fewer
				u.out.Lock()
				fmt.Fprintf(u.stdout, "cmatose: failing connection request\n")
				u.out.Unlock()
				fmt.Fprintf(u.stderr, "rocev2d ucmatose: %v\n", a.err)
				continue
			}
			conns = append(conns, a.conn)
		case <-ctx.Done():
			return u.fail("waiting for connection %d of %d: %v", len(conns)+1, c.conns, context.Cause(ctx))
		}
	}
	if c.count > 0 {
		fmt.Fprintf(u.stdout, "initiating data transfers\n")
		for _, conn := range conns {
			if err := u.post(conn); err != nil {
				return u.fail("%v", err)
			}
		}
		fmt.Fprintf(u.stdout, "completing sends\n")
		if err := u.poll(ctx, conns, true); err != nil {
			return u.fail("%v", err)
		}
		fmt.Fprintf(u.stdout, "receiving data transfers\n")
		if err := u.poll(ctx, conns, false); err != nil {
			return u.fail("%v", err)
		}
		fmt.Fprintf(u.stdout, "data transfers complete\n")
	}
	if c.migrate {
		fmt.Fprintf(u.stdout, "migrating to new event channel\n")
	}
	fmt.Fprintf(u.stdout, "cmatose: disconnecting\n")
	// Every DREQ goes out at once; each Close waits for its DREP.
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = conn.Close()
			if err := conn.Err(); !errors.Is(err, rdmacm.ErrClosed) || errors.Is(err, rdmacm.ErrDisconnected) {
				errs[i] = errors.Join(errs[i], fmt.Errorf("ended before the server's disconnect: %w", err))
			}
		}()
	}
	wg.Wait()
	conns = nil
	fmt.Fprintf(u.stdout, "disconnected\n")
	for _, err := range errs {
		if err != nil {
			return u.fail("disconnect: %v", err)
		}
	}
	return 0
}

// post posts -C SENDs of -S bytes from the connection's buffer (all
// signalled: cmatose's QPs have sq_sig_all).
func (u *ucmatose) post(conn *rdmacm.Conn) error {
	u.mu.Lock()
	mr := u.bufs[conn.QP().QPN()]
	u.mu.Unlock()
	for i := 0; i < u.c.count; i++ {
		if err := conn.QP().PostSend(transport.SendWR{WRID: uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{mr.SGE(0, uint32(u.c.size))}}); err != nil {
			return fmt.Errorf("failed to post sends: %v", err)
		}
	}
	return nil
}

// poll waits for -C completions on each connection's send or receive CQ
// (cmatose's poll_cqs), checking their status and, for receives, that
// each message is -S bytes.
func (u *ucmatose) poll(ctx context.Context, conns []*rdmacm.Conn, send bool) error {
	var wc [8]transport.WC
	for i, conn := range conns {
		cq, what := conn.RecvCQ(), "receive"
		if send {
			cq, what = conn.SendCQ(), "send"
		}
		for done := 0; done < u.c.count; {
			n, err := cq.Wait(ctx, wc[:min(len(wc), u.c.count-done)])
			if err != nil {
				return fmt.Errorf("connection %d: %d of %d %s completions: %v", i, done, u.c.count, what, context.Cause(ctx))
			}
			for _, w := range wc[:n] {
				if err := w.Err(); err != nil {
					return fmt.Errorf("connection %d: %s %d: %v", i, what, done, err)
				}
				if !send && int(w.ByteLen) != u.c.size {
					return fmt.Errorf("connection %d: message %d is %d bytes, not %d (-S)", i, done, w.ByteLen, u.c.size)
				}
				done++
			}
		}
	}
	return nil
}
