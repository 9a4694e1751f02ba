//go:build !linux

package udp

import (
	"errors"
	"fmt"
	"net/netip"
)

// DeviceOffloadOf is Linux-only (ethtool netlink); elsewhere it returns
// errors.ErrUnsupported.
func DeviceOffloadOf(ifindex int) (DeviceOffload, error) {
	return DeviceOffload{Index: ifindex}, fmt.Errorf("udp: device %d offloads: %w", ifindex, errors.ErrUnsupported)
}

// DeviceOffloadFor is Linux-only; elsewhere it returns errors.ErrUnsupported.
func DeviceOffloadFor(addr netip.Addr) (DeviceOffload, error) {
	return DeviceOffload{}, fmt.Errorf("udp: device of %v: %w", addr, errors.ErrUnsupported)
}
