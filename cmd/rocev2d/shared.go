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
	"syscall"

	"github.com/gorocev2/rocev2/transport"
)

// flagsResult handles what every command does after parsing its flags:
// -h prints usage on stdout (exit 0); any other error is printed on stderr
// with a pointer to `rocev2d help name` (exit 2). done is false when err is
// nil and the command should go on.
func flagsResult(name, usage string, err error, stdout, stderr io.Writer) (code int, done bool) {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return exitOK, true
	}
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d %s: %v\n(see `rocev2d help %s`)\n", name, err, name)
		return exitUsage, true
	}
	return exitOK, false
}

// parseAddrPair parses the --a and --b addresses of a two-device command
// and returns them unmapped.
func parseAddrPair(a, b string) (netip.Addr, netip.Addr, error) {
	pa, err := netip.ParseAddr(a)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("--a %q: not an IP address", a)
	}
	pb, err := netip.ParseAddr(b)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("--b %q: not an IP address", b)
	}
	return pa.Unmap(), pb.Unmap(), nil
}

// errMTUFlag is the error for an -m value that is not an IB MTU.
func errMTUFlag(mtu int) error {
	return fmt.Errorf("-m %d: MTU must be 256, 512, 1024, 2048 or 4096", mtu)
}

// parseMTUFlag converts the -m flag (bytes) to a path MTU.
func parseMTUFlag(mtu int) (transport.MTU, error) {
	m, ok := transport.MTUFromBytes(mtu)
	if !ok {
		return 0, errMTUFlag(mtu)
	}
	return m, nil
}

// acceptOne listens on TCP port on every address and accepts one client
// for an out-of-band exchange, giving up when ctx ends. inUse words the
// error when the port is taken.
func acceptOne(ctx context.Context, port int, inUse func(err error) error) (net.Conn, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, inUse(err)
		}
		return nil, fmt.Errorf("couldn't listen on TCP port %d: %w", port, err)
	}
	defer ln.Close()
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

// peerFromGID is the IP address in a peer's GID, or an error naming the
// peer tool's GID-index flag when the GID holds no RoCEv2 address.
func peerFromGID(gid [16]byte, gidFlag string) (netip.Addr, error) {
	peer := netip.AddrFrom16(gid).Unmap()
	if !peer.IsValid() || peer.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("remote GID %s is not a RoCEv2 address (is the peer using %s with its IPv4 GID index?)", netip.AddrFrom16(gid), gidFlag)
	}
	return peer, nil
}

// localAddr is the address to run RoCEv2 on: bind (--bind) when set, else
// the local address of the out-of-band connection conn.
func localAddr(bind netip.Addr, conn net.Conn) (netip.Addr, error) {
	if bind.IsValid() {
		return bind, nil
	}
	ap, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("local address of the out-of-band connection %s: %v", conn.LocalAddr(), err)
	}
	return ap.Addr().Unmap(), nil
}

// wcError describes a failed completion.
func wcError(wc transport.WC, what string) error {
	return fmt.Errorf("%s completion with error: %s (status %d, wr_id %d, opcode %v) — the peer or the path failed the operation",
		what, wc.Status, uint8(wc.Status), wc.WRID, wc.Opcode)
}
