package pingpong

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"

	"github.com/gorocev2/rocev2/transport"
)

// udQKey is ibv_ud_pingpong's Q_Key: its QP's own, and the one its sends
// carry.
const udQKey = 0x11111111

// Commands are the four ping-pong commands, for rocev2d's dispatch.
func Commands() []cli.Command {
	cmds := make([]cli.Command, 0, 4)
	for _, k := range []ppKind{ppRC, ppUC, ppUD, ppSRQ} {
		cmds = append(cmds, cli.Command{Name: k.String(), Summary: k.summary(), Usage: k.usage(),
			Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
				return runPPCmd(ctx, args, k, stdout, stderr)
			}})
	}
	return cmds
}

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
	// idle is --idle-timeout: how long the loop waits while nothing
	// arrives (idleSet: given; 0 waits for ever). idleTimeout applies
	// the default.
	idle    time.Duration
	idleSet bool
	// qpTimeout is the RC QP's local ACK timeout exponent (4.096 µs ×
	// 2^T; ibv_rc_pingpong's is 14, about 67 ms, with 7 retries).
	qpTimeout int
	verbose   bool
	sock      cli.SocketFlags
	server    string // empty: run as server
	// kind is the QP type: ppRC (pingpong), ppUC (uc-pingpong) or ppUD
	// (ud-pingpong: mtu is the port MTU and bounds size, receive buffers
	// start with the GRH); or ppSRQ (srq-pingpong: numQP RC QPs on one
	// SRQ, srq.go).
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

// summary is the command's line in `rocev2d help`.
func (k ppKind) summary() string {
	switch k {
	case ppUC:
		return "UC ping-pong, flag- and wire-compatible with ibv_uc_pingpong"
	case ppUD:
		return "UD ping-pong, flag- and wire-compatible with ibv_ud_pingpong"
	case ppSRQ:
		return "RC ping-pong on several QPs sharing one SRQ, flag- and wire-compatible with ibv_srq_pingpong"
	}
	return "RC ping-pong, flag- and wire-compatible with ibv_rc_pingpong"
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
	fs := cli.NewFlagSet(kind.String())
	defSize := 4096
	if kind == ppUD {
		// ibv_ud_pingpong's size is 1024 (its usage text says 2048).
		defSize = 1024
	}
	if kind == ppUD || kind == ppSRQ {
		var odp bool
		cli.BoolFlags(fs, &odp, "o", "odp") // accepted and ignored
	}
	if kind == ppSRQ {
		cli.IntFlags(fs, &c.numQP, "q", "num-qp", 16)
	}
	cli.IntFlags(fs, &c.port, "p", "port", 18515)
	cli.StringFlags(fs, &c.dev, "d", "ib-dev", "")
	cli.IntFlags(fs, &c.ibPort, "i", "ib-port", 1)
	cli.IntFlags(fs, &c.size, "s", "size", defSize)
	cli.IntFlags(fs, &mtu, "m", "mtu", 1024)
	cli.IntFlags(fs, &c.rxDepth, "r", "rx-depth", 500)
	cli.IntFlags(fs, &c.iters, "n", "iters", 1000)
	cli.IntFlags(fs, &c.sl, "l", "sl", 0)
	cli.BoolFlags(fs, &c.events, "e", "events")
	cli.IntFlags(fs, &c.gidIdx, "g", "gid-idx", -1)
	cli.BoolFlags(fs, &c.chk, "c", "chk")
	fs.StringVar(&bind, "bind", "", "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.Func("idle-timeout", "", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return errors.New("want a duration of 0 (wait for ever) or more, e.g. 30s")
		}
		c.idle, c.idleSet = d, true
		return nil
	})
	fs.IntVar(&c.qpTimeout, "qp-timeout", 14, "")
	fs.BoolVar(&c.verbose, "v", false, "")
	cli.AddSocketFlags(fs, &c.sock)
	var err error
	if c.server, err = cli.ParseWithServer(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	if c.mtu, err = cli.ParseMTUFlag(mtu); err != nil {
		return nil, fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	switch {
	case c.port <= 0 || c.port > 65535:
		return nil, fmt.Errorf("%w: -p %d: port out of range 1..65535", cli.ErrUsage, c.port)
	case c.ibPort != 1:
		return nil, fmt.Errorf("%w: -i %d: rocev2d devices have one port, 1", cli.ErrUsage, c.ibPort)
	case c.size <= 0 || c.size > 1<<30:
		return nil, fmt.Errorf("%w: -s %d: size out of range 1..%d", cli.ErrUsage, c.size, 1<<30)
	case kind == ppSRQ && c.numQP <= 0:
		// The tool would wait for completions of no QP forever.
		return nil, fmt.Errorf("%w: -q %d: at least one QP", cli.ErrUsage, c.numQP)
	case c.rxDepth <= 0 || c.rxDepth > 1<<16:
		return nil, fmt.Errorf("%w: -r %d: rx-depth out of range 1..%d", cli.ErrUsage, c.rxDepth, 1<<16)
	case c.iters <= 0:
		return nil, fmt.Errorf("%w: -n %d: iters must be positive", cli.ErrUsage, c.iters)
	case c.sl < 0 || c.sl > 15:
		return nil, fmt.Errorf("%w: -l %d: sl out of range 0..15", cli.ErrUsage, c.sl)
	case c.timeout < 0:
		return nil, fmt.Errorf("%w: --timeout %v: negative", cli.ErrUsage, c.timeout)
	case c.qpTimeout < 0 || c.qpTimeout > 31:
		return nil, fmt.Errorf("%w: --qp-timeout %d: QP timeout must be between 0 and 31", cli.ErrUsage, c.qpTimeout)
	}
	if c.bind, err = cli.ParseBind(bind); err != nil {
		return nil, fmt.Errorf("%w: %w", cli.ErrUsage, err)
	}
	if c.server != "" {
		if c.server, err = cli.PeerArg("server", c.server, "-p"); err != nil {
			return nil, fmt.Errorf("%w: %w", cli.ErrUsage, err)
		}
	}
	return c, nil
}

// runPPCmd runs pingpong, uc-pingpong, ud-pingpong or srq-pingpong.
func runPPCmd(ctx context.Context, args []string, kind ppKind, stdout, stderr io.Writer) int {
	name := kind.String()
	c, err := parsePPFlags(args, kind)
	if code, done := cli.FlagsResult(name, kind.usage(), err, stdout, stderr); done {
		return code
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("--timeout %v reached", c.timeout))
		defer cancel()
	}
	usr1 := cli.WatchSIGUSR1(stderr)
	defer usr1.Stop()
	if err := runSession(ctx, c, stdout, usr1); err != nil {
		fmt.Fprintf(stderr, "rocev2d %s: %v\n", name, err)
		return cli.ExitFail
	}
	return cli.ExitOK
}
