package cmtools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

// rdma-server and rdma-client are librdmacm's rdma_server and rdma_client
// examples (rdma-core 44): one 16-byte SEND each way over an RC connection
// made through the CM, then both sides disconnect.

func init() {
	commands.Register("rdma-server", "rdma_cm SEND/RECV server, compatible with librdmacm's rdma_server", rdmaServerUsage, runRdmaServer)
	commands.Register("rdma-client", "rdma_cm SEND/RECV client, compatible with librdmacm's rdma_client", rdmaClientUsage, runRdmaClient)
}

const rdmaServerUsage = `usage: rocev2d rdma-server [-s server_address] [-p port_number]

librdmacm's rdma_server example (rdma-core 44) on rocev2: listen on the rdma_cm
port (default 7471), accept one connection with a receive posted, wait for the
client's 16-byte SEND, SEND 16 bytes back, disconnect. Either side may be the
real rdma_client.

options:
  -s addr        address to listen on, also the local RoCEv2 address (the
                 real tool's default 0.0.0.0 needs --bind here)
  -p port        rdma_cm port (default 7471)
      --bind=IP  local RoCEv2 address (overrides -s)
      --timeout=DUR  give up when the whole run takes longer (default 0 = no limit)
      --counters print the device's and the CM's counters at the end
` + idleUsage + cli.SocketUsage + `
Output as rdma_server's: "rdma_server: start", "rdma_server: end RET" (RET 0,
or -1 after a failure, whose perror-style line precedes it). Exit status: RET
(0, 255 for -1), 1 for bad usage, as rdma_server.
`

const rdmaClientUsage = `usage: rocev2d rdma-client [-s server_address] [-p port_number]

librdmacm's rdma_client example (rdma-core 44) on rocev2: connect to the
rdma_cm port (default 7471) of the server (default 127.0.0.1) with a receive
posted, SEND 16 bytes, wait for the server's 16 bytes, disconnect. Either side
may be the real rdma_server.

options:
  -s addr        the server's address (default 127.0.0.1)
  -p port        rdma_cm port (default 7471)
      --bind=IP  local RoCEv2 address (default: the address the kernel routes
                 the server's address from)
      --timeout=DUR  give up when the whole run takes longer (default 0 = no limit)
      --counters print the device's and the CM's counters at the end
` + idleUsage + cli.SocketUsage + `
Output as rdma_client's: "rdma_client: start", "rdma_client: end RET"; a
refused connection prints "rdma_connect: Connection refused" (rdma_cm's
ECONNREFUSED for a REJ) and ends with -1. Exit status: RET (0, 255 for -1), 1
for bad usage, as rdma_client.
`

const idleUsage = `      --idle=DUR     once connected, stay idle that long before the exchange,
                     watching the connection; it ends with -1 and "connection
                     lost after ..." when the peer is found dead meanwhile
      --keepalive=DUR, --keepalive-timeout=DUR
                     the connection's keep-alive interval and probe timeout
                     (rdmacm.Options.KeepAlive/KeepAliveTimeout; default 15s
                     and 10s; --keepalive=-1s turns it off)
`

// rdmaExConfig holds the flags of rdma-server and rdma-client.
type rdmaExConfig struct {
	server   bool
	addr     string
	port     int
	bind     netip.Addr
	timeout  time.Duration
	counters bool
	sock     cli.SocketFlags

	idle, keepAlive, keepAliveTimeout time.Duration
}

func parseRdmaExFlags(name string, server bool, args []string) (*rdmaExConfig, error) {
	c := &rdmaExConfig{server: server}
	fs := cli.NewFlagSet(name)
	def := "127.0.0.1"
	if server {
		def = ""
	}
	var bind, port string
	fs.StringVar(&c.addr, "s", def, "")
	fs.StringVar(&port, "p", "7471", "")
	fs.StringVar(&bind, "bind", "", "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.counters, "counters", false, "")
	fs.DurationVar(&c.idle, "idle", 0, "")
	fs.DurationVar(&c.keepAlive, "keepalive", 0, "")
	fs.DurationVar(&c.keepAliveTimeout, "keepalive-timeout", 0, "")
	cli.AddSocketFlags(fs, &c.sock)
	if err := fs.Parse(splitGetopt(args, map[byte]bool{'s': true, 'p': true})); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case c.timeout < 0:
		return nil, fmt.Errorf("--timeout=%v: negative (0: no limit)", c.timeout)
	case c.idle < 0:
		return nil, fmt.Errorf("--idle=%v: negative", c.idle)
	case c.keepAliveTimeout < 0:
		return nil, fmt.Errorf("--keepalive-timeout=%v: negative (0: the default, 10s)", c.keepAliveTimeout)
	case c.keepAliveTimeout > 0 && c.keepAliveTimeout < time.Millisecond:
		return nil, fmt.Errorf("--keepalive-timeout=%v: below 1ms a live peer cannot answer a probe in time", c.keepAliveTimeout)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return nil, fmt.Errorf("-p %q: port out of range 1..65535", port)
	}
	c.port = p
	if c.bind, err = cli.ParseBind(bind); err != nil {
		return nil, err
	}
	if server && c.addr == "" && !c.bind.IsValid() {
		return nil, errors.New("the server needs -s addr or --bind=IP: rocev2d listens on one address, not on every one")
	}
	return c, nil
}

func runRdmaServer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runRdmaEx(ctx, "rdma-server", rdmaServerUsage, true, args, stdout, stderr)
}

func runRdmaClient(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runRdmaEx(ctx, "rdma-client", rdmaClientUsage, false, args, stdout, stderr)
}

// rdmaExListening, when set (by tests), is called once rdma-server listens.
var rdmaExListening func(addr netip.AddrPort)

func runRdmaEx(ctx context.Context, name, usage string, server bool, args []string, stdout, stderr io.Writer) int {
	c, err := parseRdmaExFlags(name, server, args)
	if code, done := flagOutcome(name, usage, err, stdout, stderr); done {
		return code
	}
	ctx, cancel := runTimeout(ctx, c.timeout)
	defer cancel()
	tool := "rdma_client"
	if server {
		tool = "rdma_server"
	}
	fmt.Fprintf(stdout, "%s: start\n", tool)
	ret := 0
	if err := rdmaEx(ctx, c, stdout); err != nil {
		fmt.Fprintln(stderr, err)
		ret = -1
	}
	fmt.Fprintf(stdout, "%s: end %d\n", tool, ret)
	return ret & 0xff
}

// rdmaEx runs one rdma_server or rdma_client; its errors read like the
// tools' perror lines.
func rdmaEx(ctx context.Context, c *rdmaExConfig, stdout io.Writer) error {
	var local, peer netip.Addr
	var err error
	if c.server {
		if local = c.bind; !local.IsValid() {
			if local, err = resolveAddr(ctx, c.addr); err != nil {
				return fmt.Errorf("rdma_getaddrinfo: %v", err)
			}
		}
	} else {
		if peer, err = resolveAddr(ctx, c.addr); err != nil {
			return fmt.Errorf("rdma_getaddrinfo: %v", err)
		}
		if local = c.bind; !local.IsValid() {
			if local, err = routeSource(peer); err != nil {
				return fmt.Errorf("rdma_create_ep: %v", err)
			}
		}
	}
	link, err := cli.ListenSocket(local, c.sock.Options(true, 0), "pick another address with --bind")
	if err != nil {
		return fmt.Errorf("rdma_create_ep: %v", err)
	}
	// max_send_wr = max_recv_wr = 1, sq_sig_all.
	e, err := cli.NewEndpoint(link, cli.EndpointConfig{SendCQ: 2, RecvCQ: 2, MaxSendWR: 1, MaxRecvWR: 1, SigAll: true,
		Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead, CC: c.sock.CC.Config()})
	if err != nil {
		return fmt.Errorf("rdma_create_ep: %v", err)
	}
	defer e.Close()
	if c.counters {
		defer func() {
			cli.PrintCounters(stdout, local.String(), e.Dev)
			printCMStats(stdout, local.String(), rdmacm.StatsOf(e.Dev))
		}()
	}
	_, recvMR, err := e.Alloc(16, memreg.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("rdma_reg_msgs for recv_msg: %v", err)
	}
	_, sendMR, err := e.Alloc(16, 0)
	if err != nil {
		return fmt.Errorf("rdma_reg_msgs for send_msg: %v", err)
	}
	opts := rdmacm.Options{QP: e.QP, PD: e.PD, SendCQ: e.SCQ, RecvCQ: e.RCQ,
		KeepAlive: c.keepAlive, KeepAliveTimeout: c.keepAliveTimeout,
		Prepare: func(qp *transport.QP) error {
			if err := qp.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{recvMR.SGE(0, 16)}}); err != nil {
				return fmt.Errorf("rdma_post_recv: %v", err)
			}
			return nil
		}}
	var conn *rdmacm.Conn
	if c.server {
		l, err := rdmacm.Listen(e.Dev, uint16(c.port), &rdmacm.ListenOptions{Options: opts})
		if err != nil {
			return fmt.Errorf("rdma_listen: %v", err)
		}
		if rdmaExListening != nil {
			rdmaExListening(l.Addr())
		}
		req, err := l.Next(ctx)
		if err != nil {
			l.Close()
			return fmt.Errorf("rdma_get_request: %v", context.Cause(ctx))
		}
		conn, err = req.Accept(ctx, &opts)
		l.Close()
		if err != nil {
			return fmt.Errorf("rdma_accept: %v", err)
		}
	} else {
		conn, err = rdmacm.Dial(ctx, e.Dev, netip.AddrPortFrom(peer, uint16(c.port)), &opts)
		if err != nil {
			if errors.Is(err, rdmacm.ErrRejected) {
				// rdma_cm turns a REJ into ECONNREFUSED.
				return fmt.Errorf("rdma_connect: Connection refused (%v)", err)
			}
			if errors.Is(err, rdmacm.ErrTimeout) {
				return fmt.Errorf("rdma_connect: Connection timed out (%v)", err)
			}
			if errors.Is(err, rdmacm.ErrUnreachable) {
				return fmt.Errorf("rdma_connect: %v", unreachableError(netip.AddrPortFrom(peer, uint16(c.port)), err))
			}
			return fmt.Errorf("rdma_connect: %v", err)
		}
	}
	defer conn.Close() // rdma_disconnect
	if c.idle > 0 {
		tool := map[bool]string{true: "rdma_server", false: "rdma_client"}[c.server]
		fmt.Fprintf(stdout, "%s: connected, idle for %v\n", tool, c.idle)
		t0 := time.Now()
		select {
		case <-conn.Done():
			return fmt.Errorf("connection lost after %.2fs idle: %v", time.Since(t0).Seconds(), conn.Err())
		case <-ctx.Done():
			return fmt.Errorf("idle: %v", context.Cause(ctx))
		case <-time.After(c.idle):
			fmt.Fprintf(stdout, "%s: connection alive after %v idle\n", tool, c.idle)
		}
	}
	send := func() error {
		if err := e.QP.PostSend(transport.SendWR{WRID: 2, Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{sendMR.SGE(0, 16)}}); err != nil {
			return fmt.Errorf("rdma_post_send: %v", err)
		}
		return nil
	}
	comp := func(cq *transport.CQ, what string) error {
		var wc [1]transport.WC
		if _, err := cq.Wait(ctx, wc[:]); err != nil {
			return fmt.Errorf("%s: %v", what, context.Cause(ctx))
		}
		if err := wc[0].Err(); err != nil {
			return fmt.Errorf("%s: %v", what, err)
		}
		return nil
	}
	if c.server {
		if err := comp(e.RCQ, "rdma_get_recv_comp"); err != nil {
			return err
		}
		if err := send(); err != nil {
			return err
		}
		return comp(e.SCQ, "rdma_get_send_comp")
	}
	if err := send(); err != nil {
		return err
	}
	if err := comp(e.SCQ, "rdma_get_send_comp"); err != nil {
		return err
	}
	return comp(e.RCQ, "rdma_get_recv_comp")
}
