package cmtools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

func init() {
	commands.Register("udaddy", "UD datagrams through rdma_cm's SIDR, compatible with librdmacm's udaddy", udaddyUsage, runUdaddy)
}

const udaddyUsage = `usage: rocev2d udaddy [-s server_address] [-b bind_address] [-C message_count] [-S message_size] [-t tos]

librdmacm's udaddy example (rdma-core 44) on rocev2, one connection: UD queue
pairs with rdma_cm's Q_Key (0x01234567), the server's QP number resolved
through SIDR (SIDR_REQ/SIDR_REP MADs to QP1 for the UDP port space, port
7174). Without -s it is the server: it posts message_count receives, answers
the resolution, waits for message_count datagrams, then sends as many back to
the QP named in their immediate data. With -s it is the client: it posts its
receives, resolves the server, sends message_count SEND_WITH_IMM datagrams of
message_size bytes (immediate = its QP number) and waits for the replies.
Either side may be the real udaddy.

options:
  -s addr        the server's address (client mode)
  -b addr        local address (the RoCEv2 address; the server needs it or --bind)
  -C count       datagrams each way (default 10; at least 1)
  -S size        datagram size (default 100), at most the port MTU (1024)
  -t tos         IP type of service of the MADs and datagrams
  -c 1, -P udp, -p 0x111, -f ip|name   accepted (one connection, UDP port space,
                 IP addresses only)
      --port=N   rdma_cm port (default 7174, the one udaddy always uses)
      --bind=IP  same as -b
      --timeout=DUR  give up when the whole run takes longer (default 0 = no limit)
      --counters print the device's and the CM's counters at the end
` + cli.SocketUsage + `
Output as udaddy's (its progress lines, "test complete", "return status N").
Exit status: N as udaddy's main returns it: 0, the SIDR_REP status for a
refused resolution ("udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1" when
nothing serves the port), -111 (exit 145) when the network bounces the
request at once (ICMP port or host unreachable), -110 (exit 146) when the
server never answers, -1 (255) for other failures; 1 for bad usage.
`

// udaddyConfig holds the parsed flags of `rocev2d udaddy`.
type udaddyConfig struct {
	server   string // -s: client mode
	bind     netip.Addr
	count    int
	size     int
	tos      uint8
	port     int
	timeout  time.Duration
	counters bool
	sock     cli.SocketFlags
}

var udaddyOptLetters = map[byte]bool{'s': true, 'b': true, 'c': true, 'C': true, 'S': true, 't': true, 'p': true, 'P': true, 'f': true}

func parseUdaddyFlags(args []string) (*udaddyConfig, error) {
	c := &udaddyConfig{}
	fs := cli.NewFlagSet("udaddy")
	var bindB, bind, tos, ps, psName, format string
	var conns int
	fs.StringVar(&c.server, "s", "", "")
	fs.StringVar(&bindB, "b", "", "")
	fs.IntVar(&conns, "c", 1, "")
	fs.IntVar(&c.count, "C", 10, "")
	fs.IntVar(&c.size, "S", 100, "")
	fs.StringVar(&tos, "t", "", "")
	fs.StringVar(&ps, "p", "", "")
	fs.StringVar(&psName, "P", "", "")
	fs.StringVar(&format, "f", "", "")
	fs.IntVar(&c.port, "port", 7174, "")
	fs.StringVar(&bind, "bind", "", "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.counters, "counters", false, "")
	cli.AddSocketFlags(fs, &c.sock)
	if err := fs.Parse(splitGetopt(args, udaddyOptLetters)); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case conns != 1:
		return nil, fmt.Errorf("-c %d: rocev2d udaddy makes one connection", conns)
	case c.count < 1:
		return nil, fmt.Errorf("-C %d: at least one datagram (a rocev2d server cannot tell a resolution without data)", c.count)
	case c.size < 1:
		return nil, fmt.Errorf("-S %d: at least one byte", c.size)
	case c.port <= 0 || c.port > 65535:
		return nil, fmt.Errorf("--port %d: out of range 1..65535", c.port)
	case c.timeout < 0:
		return nil, fmt.Errorf("--timeout=%v: negative (0: no limit)", c.timeout)
	case psName != "" && !strings.HasPrefix(strings.ToLower(psName), "udp"):
		return nil, fmt.Errorf("-P %s: rocev2d udaddy serves the UDP port space only", psName)
	case format != "" && !strings.EqualFold(format, "ip") && !strings.EqualFold(format, "name"):
		return nil, fmt.Errorf("-f %s: IP addresses (or names) only", format)
	}
	if ps != "" {
		v, err := strconv.ParseInt(ps, 0, 32)
		if err != nil || v != 0x111 {
			return nil, fmt.Errorf("-p %s: rocev2d udaddy serves the UDP port space (0x111) only", ps)
		}
	}
	if tos != "" {
		v, err := strconv.ParseUint(tos, 0, 8)
		if err != nil {
			return nil, fmt.Errorf("-t %s: not a type of service 0..255", tos)
		}
		c.tos = uint8(v)
	}
	var err error
	if c.bind, err = bindFor(bind, bindB, c.server == ""); err != nil {
		return nil, err
	}
	return c, nil
}

// udaddyListening, when set (by tests), is called once the server answers
// resolutions.
var udaddyListening func(addr netip.AddrPort)

func runUdaddy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseUdaddyFlags(args)
	if code, done := flagOutcome("udaddy", udaddyUsage, err, stdout, stderr); done {
		return code
	}
	ctx, cancel := runTimeout(ctx, c.timeout)
	defer cancel()
	ret := udaddy(ctx, c, stdout, stderr)
	fmt.Fprintf(stdout, "test complete\n")
	fmt.Fprintf(stdout, "return status %d\n", ret)
	return ret & 0xff
}

// udaddy runs one side and returns udaddy's status.
func udaddy(ctx context.Context, c *udaddyConfig, stdout, stderr io.Writer) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "rocev2d udaddy: "+format+"\n", args...)
		return -1
	}
	client := c.server != ""
	if client {
		fmt.Fprintf(stdout, "udaddy: starting client\n")
	} else {
		fmt.Fprintf(stdout, "udaddy: starting server\n")
	}
	var peer netip.Addr
	local := c.bind
	var err error
	if client {
		if peer, err = resolveAddr(ctx, c.server); err != nil {
			fmt.Fprintf(stdout, "udaddy: getaddrinfo error: %v\n", err)
			return -1
		}
		if !local.IsValid() {
			if local, err = routeSource(peer); err != nil {
				return fail("%v", err)
			}
		}
		fmt.Fprintf(stdout, "udaddy: connecting\n")
	}
	link, err := cli.ListenSocket(local, c.sock.Options(true, 0), "pick another address with -b")
	if err != nil {
		return fail("%v", err)
	}
	mtu := transport.MTU1024
	if c.size > mtu.Bytes() {
		link.Close()
		fmt.Fprintf(stdout, "udaddy: message_size %d is larger than active mtu %d\n", c.size, mtu.Bytes())
		return -22 // -EINVAL
	}
	e, err := cli.NewEndpoint(link, cli.EndpointConfig{SendCQ: 2 * c.count, MaxSendWR: c.count, MaxRecvWR: c.count,
		UD: true, QKey: rdmacm.UDPQKey, PortMTU: mtu, CC: c.sock.CC.Config()})
	if err != nil {
		return fail("%v", err)
	}
	defer e.Close()
	if c.counters {
		defer func() {
			cli.PrintCounters(stdout, local.String(), e.Dev)
			printCMStats(stdout, local.String(), rdmacm.StatsOf(e.Dev))
		}()
	}
	if err := e.QP.ReadyUD(rdmacm.UDPQKey, e.PSN); err != nil {
		return fail("udaddy: unable to create QP: %v", err)
	}
	buf, mr, err := e.Alloc(c.size+transport.GRHSize, memreg.AccessLocalWrite)
	if err != nil {
		return fail("failed to reg MR: %v", err)
	}
	for i := 0; i < c.count; i++ {
		if err := e.QP.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{mr.SGE(0, uint32(len(buf)))}}); err != nil {
			fmt.Fprintf(stdout, "failed to post receives: %v\n", err)
			return -1
		}
	}
	var ah *transport.AH
	var remoteQPN, remoteQKey uint32
	sends := func(signaled bool) error {
		var flags transport.SendFlags
		if signaled {
			flags = transport.SendSignaled
		}
		for i := 0; i < c.count; i++ {
			if err := e.QP.PostSend(transport.SendWR{WRID: 2, Opcode: transport.WRSendImm, Flags: flags, Imm: e.QP.QPN(),
				SGEs: []memreg.SGE{mr.SGE(0, uint32(c.size))}, AH: ah, RemoteQPN: remoteQPN, RemoteQKey: remoteQKey}); err != nil {
				return fmt.Errorf("failed to post sends: %v", err)
			}
		}
		return nil
	}
	// poll waits for count completions (udaddy's poll_cqs); the first
	// one on a server without a peer yet makes the reply AH from the GRH
	// and the immediate data (create_reply_ah).
	poll := func(what string) error {
		var wc [8]transport.WC
		for done := 0; done < c.count; {
			n, err := e.SCQ.Wait(ctx, wc[:min(8, c.count-done)])
			if err != nil {
				return fmt.Errorf("%s: after %d of %d completions: %v", what, done, c.count, context.Cause(ctx))
			}
			for _, w := range wc[:n] {
				if err := w.Err(); err != nil {
					return fmt.Errorf("%s: %v", what, err)
				}
			}
			if ah == nil {
				a, err := transport.AHFromGRH(buf[:transport.GRHSize])
				if err != nil {
					return fmt.Errorf("udaddy: failed to create reply AH: %v", err)
				}
				a.TrafficClass = c.tos
				if ah, err = e.Dev.CreateAH(a); err != nil {
					return fmt.Errorf("udaddy: failed to create reply AH: %v", err)
				}
				if wc[0].Flags&transport.WCWithImm == 0 {
					return fmt.Errorf("udaddy: the first datagram carries no immediate data (the sender's QP number)")
				}
				remoteQPN, remoteQKey = wc[0].Imm, rdmacm.UDPQKey
			}
			done += n
		}
		return nil
	}
	if client {
		p, err := rdmacm.ResolveUD(ctx, e.Dev, netip.AddrPortFrom(peer, uint16(c.port)), &rdmacm.UDOptions{TrafficClass: c.tos})
		if err != nil {
			var rej *rdmacm.RejectError
			switch {
			case errors.As(err, &rej):
				fmt.Fprintf(stdout, "udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: %d\n", uint8(rej.SIDRStatus))
				if errors.Is(err, rdmacm.ErrRefused) {
					fmt.Fprintf(stderr, "rocev2d udaddy: %v:%d refused the resolution: nothing serves UDP-space port %d there (%v)\n", peer, c.port, c.port, rej.SIDRStatus)
				}
				return int(rej.SIDRStatus)
			case errors.Is(err, rdmacm.ErrUnreachable):
				// The network said so at once (ICMP port or host
				// unreachable): as rping and rdma-client.
				fmt.Fprintf(stdout, "udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: -111\n")
				fmt.Fprintf(stderr, "rocev2d udaddy: %v\n", unreachableError(netip.AddrPortFrom(peer, uint16(c.port)), err))
				return -111
			case errors.Is(err, rdmacm.ErrTimeout):
				fmt.Fprintf(stdout, "udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: -110\n")
				fmt.Fprintf(stderr, "rocev2d udaddy: no answer from %v: the host is down or frozen, or nothing runs a connection manager there\n", peer)
				return -110
			}
			return fail("%v", context.Cause(ctx))
		}
		if ah, err = e.Dev.CreateAH(transport.AHAttr{Addr: peer, TrafficClass: c.tos}); err != nil {
			fmt.Fprintf(stdout, "udaddy: failure creating address handle\n")
			return -1
		}
		remoteQPN, remoteQKey = p.QPN, p.QKey
		fmt.Fprintf(stdout, "initiating data transfers\n")
		if err := sends(false); err != nil {
			return fail("%v", err)
		}
		fmt.Fprintf(stdout, "receiving data transfers\n")
		if err := poll("receiving"); err != nil {
			return fail("%v", err)
		}
		fmt.Fprintf(stdout, "data transfers complete\n")
		return 0
	}
	ul, err := rdmacm.ListenUD(e.Dev, uint16(c.port), e.QP, rdmacm.UDPQKey, nil)
	if err != nil {
		return fail("udaddy: failure trying to listen: %v", err)
	}
	defer ul.Close()
	if udaddyListening != nil {
		udaddyListening(netip.AddrPortFrom(local, uint16(c.port)))
	}
	fmt.Fprintf(stdout, "receiving data transfers\n")
	if err := poll("receiving"); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(stdout, "sending replies\n")
	if err := sends(true); err != nil {
		return fail("%v", err)
	}
	if err := poll("sending"); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(stdout, "data transfers complete\n")
	return 0
}
