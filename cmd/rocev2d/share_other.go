//go:build !linux

package main

import (
	"errors"
	"io"
	"net/netip"

	"github.com/gorocev2/rocev2/udp"
)

func printShareCounters(w io.Writer, l udp.Link) {}

func shareStatus(addr netip.Addr, stdout io.Writer) error { return errors.ErrUnsupported }

func shareRemove(addr netip.Addr, stdout io.Writer) error { return errors.ErrUnsupported }
