//go:build !linux

package main

import (
	"errors"
	"net"
	"net/netip"
)

// tryRead is not implemented here: udpping runs in the lab's Linux VMs.
func tryRead(*net.UDPConn, []byte) (int, netip.AddrPort, bool, error) {
	return 0, netip.AddrPort{}, false, errors.ErrUnsupported
}
