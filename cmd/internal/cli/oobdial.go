package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
)

// OOBLocalTCPAddr is the local end for the client's out-of-band TCP
// connection: the --bind address with its zone (a link-local address
// without its zone cannot be bound), or nil — no binding — without
// --bind or when the server is an IP address of the other family (the
// RoCEv2 address and the out-of-band path are independent: an IPv6
// --bind may talk to an IPv4 server address).
func OOBLocalTCPAddr(bind netip.Addr, server string) *net.TCPAddr {
	if !bind.IsValid() {
		return nil
	}
	if sa, err := netip.ParseAddr(server); err == nil && sa.Unmap().Is4() != bind.Unmap().Is4() {
		return nil
	}
	return &net.TCPAddr{IP: bind.AsSlice(), Zone: bind.Zone()}
}

// OOBDialPermanent returns the error to give up with at once when err is
// not a server that is not there yet: binding the local end to --bind
// failed, or the dial cannot succeed by waiting. It returns nil for the
// errors worth retrying until --connect-timeout (refused, unreachable,
// timed out).
func OOBDialPermanent(err error, bind netip.Addr, local *net.TCPAddr) error {
	var se *os.SyscallError
	if local != nil && errors.As(err, &se) && se.Syscall == "bind" {
		return fmt.Errorf("cannot bind the out-of-band TCP connection to --bind %v: %w", bind, err)
	}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH),
		errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.EAFNOSUPPORT):
		// e.g. a link-local server address without its zone.
		return err
	}
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return err // "mismatched local address type", "missing port" ...
	}
	return nil
}
