package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"github.com/gorocev2/rocev2/transport"
)

// ErrUsage marks errors caused by bad flags (exit status 2).
var ErrUsage = errors.New("bad usage")

// FlagsResult handles what every command does after parsing its flags:
// -h prints usage on stdout (exit 0); any other error is printed on stderr
// with a pointer to `rocev2d help name` (exit 2). done is false when err is
// nil and the command should go on.
func FlagsResult(name, usage string, err error, stdout, stderr io.Writer) (code int, done bool) {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return ExitOK, true
	}
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d %s: %v\n(see `rocev2d help %s`)\n", name, err, name)
		return ExitUsage, true
	}
	return ExitOK, false
}

// NewFlagSet returns a flag set that leaves printing usage and errors to
// FlagsResult.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// IntFlags registers an int option under a short and a long name (-s and
// --size), as the C tools' getopt_long options are; BoolFlags and
// StringFlags likewise.
func IntFlags(fs *flag.FlagSet, p *int, short, long string, def int) {
	fs.IntVar(p, short, def, "")
	fs.IntVar(p, long, def, "")
}

// BoolFlags registers a bool option under a short and a long name.
func BoolFlags(fs *flag.FlagSet, p *bool, short, long string) {
	fs.BoolVar(p, short, false, "")
	fs.BoolVar(p, long, false, "")
}

// StringFlags registers a string option under a short and a long name.
func StringFlags(fs *flag.FlagSet, p *string, short, long, def string) {
	fs.StringVar(p, short, def, "")
	fs.StringVar(p, long, def, "")
}

// ParseWithServer parses args with fs as getopt_long does for the C tools
// (ibv_rc_pingpong, perftest): options and at most one positional
// argument, the server, in any order. It returns the server, "" if none.
func ParseWithServer(fs *flag.FlagSet, args []string) (server string, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return server, nil
		}
		if server != "" {
			return "", fmt.Errorf("unexpected argument %q after server %q", rest[0], server)
		}
		server, args = rest[0], rest[1:]
	}
}

// ParseBind parses a --bind address (ParseIP: brackets accepted, a port
// or a link-local address without its zone refused); "" is the zero Addr
// (not set).
func ParseBind(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	return ParseIP("--bind", s, "")
}

// PairOptions are the options of the commands that run two endpoints in
// one process (demo, bench).
type PairOptions struct {
	A, B    netip.Addr    // --a, --b
	MTU     transport.MTU // -m, --mtu
	Verbose bool          // -v
	Sock    SocketFlags   // --gso, --busy-poll
}

// ParsePairFlags adds the PairOptions flags to fs (defMTU is the default
// of -m) and parses args, which may hold no positional argument, into p.
func ParsePairFlags(fs *flag.FlagSet, args []string, p *PairOptions, defMTU int) error {
	var a, b string
	var mtu int
	fs.StringVar(&a, "a", "127.0.0.1", "")
	fs.StringVar(&b, "b", "127.0.0.2", "")
	IntFlags(fs, &mtu, "m", "mtu", defMTU)
	fs.BoolVar(&p.Verbose, "v", false, "")
	AddSocketFlags(fs, &p.Sock)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if p.A, p.B, err = ParseAddrPair(a, b); err != nil {
		return err
	}
	p.MTU, err = ParseMTUFlag(mtu)
	return err
}

// ParseAddrPair parses the --a and --b addresses of a two-device command
// and returns them unmapped; they must be of one address family.
func ParseAddrPair(a, b string) (netip.Addr, netip.Addr, error) {
	pa, err := netip.ParseAddr(a)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("--a %q: not an IP address", a)
	}
	pb, err := netip.ParseAddr(b)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("--b %q: not an IP address", b)
	}
	pa, pb = pa.Unmap(), pb.Unmap()
	if pa.Is4() != pb.Is4() {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("--a %v and --b %v: the two endpoints talk to each other, give both IPv4 or both IPv6 addresses", pa, pb)
	}
	return pa, pb, nil
}

// ErrMTUFlag is the error for an -m value that is not an IB MTU.
func ErrMTUFlag(mtu int) error {
	return fmt.Errorf("-m %d: MTU must be 256, 512, 1024, 2048 or 4096", mtu)
}

// ParseMTUFlag converts the -m flag (bytes) to a path MTU.
func ParseMTUFlag(mtu int) (transport.MTU, error) {
	m, ok := transport.MTUFromBytes(mtu)
	if !ok {
		return 0, ErrMTUFlag(mtu)
	}
	return m, nil
}

// AcceptOne listens on TCP port on every address and accepts one client
// for an out-of-band exchange, giving up when ctx ends. inUse words the
// error when the port is taken; listening, if not nil, is called once the
// port listens.
func AcceptOne(ctx context.Context, port int, inUse func(err error) error, listening func()) (net.Conn, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, inUse(err)
		}
		return nil, fmt.Errorf("couldn't listen on TCP port %d: %w", port, err)
	}
	defer ln.Close()
	if listening != nil {
		listening()
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for a client on TCP port %d: %w", port, context.Cause(ctx))
		}
		return nil, fmt.Errorf("accept on TCP port %d: %w", port, err)
	}
	return conn, nil
}

// PeerFromGID is the IP address in a peer's GID, or an error naming the
// peer tool's GID-index flag when the GID holds no RoCEv2 address.
func PeerFromGID(gid [16]byte, gidFlag string) (netip.Addr, error) {
	peer := netip.AddrFrom16(gid).Unmap()
	if !peer.IsValid() || peer.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("remote GID %s is not a RoCEv2 address: have the peer pass %s the index of a GID that holds one of its IP addresses (IPv4 or IPv6)", netip.AddrFrom16(gid), gidFlag)
	}
	return peer, nil
}

// LocalAddr is the address to run RoCEv2 on: bind (--bind) when set, else
// the local address of the out-of-band connection conn.
func LocalAddr(bind netip.Addr, conn net.Conn) (netip.Addr, error) {
	if bind.IsValid() {
		return bind, nil
	}
	ap, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("local address of the out-of-band connection %s: %v", conn.LocalAddr(), err)
	}
	return ap.Addr().Unmap(), nil
}

// WCError describes a failed completion.
func WCError(wc transport.WC, what string) error {
	why := "the peer or the path failed the operation"
	if wc.Status == transport.WCWRFlushErr {
		// Not this request's own failure: the QP was in the error state
		// already.
		why = "the QP had left service before it ran: the peer disconnected or died, or an earlier request failed"
	}
	return fmt.Errorf("%s completion with error: %s (status %d, wr_id %d, opcode %v) — %s",
		what, wc.Status, uint8(wc.Status), wc.WRID, wc.Opcode, why)
}

// OpName is the name of an operation in the tables of demo and bench.
func OpName(op transport.WROpcode) string {
	switch op {
	case transport.WRSend:
		return "SEND"
	case transport.WRSendImm:
		return "SEND+imm"
	case transport.WRWrite:
		return "WRITE"
	case transport.WRWriteImm:
		return "WRITE+imm"
	case transport.WRRead:
		return "READ"
	case transport.WRCompareSwap:
		return "CMP_AND_SWAP"
	case transport.WRFetchAdd:
		return "FETCH_AND_ADD"
	}
	return op.String()
}
