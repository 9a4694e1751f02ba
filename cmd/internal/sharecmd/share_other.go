//go:build !linux

package sharecmd

import (
	"errors"
	"io"
	"net/netip"
)

func shareStatus(addr netip.Addr, stdout io.Writer) error { return errors.ErrUnsupported }

func shareRemove(addr netip.Addr, stdout io.Writer) error { return errors.ErrUnsupported }
