//go:build !linux

package bench

import (
	"errors"
	"net"
	"time"
)

// rawGSOSupported: UDP GSO and GRO are Linux's; the GSO+GRO section of the
// bench does not run elsewhere.
const rawGSOSupported = false

func enableGRO(*net.UDPConn) error { return errors.ErrUnsupported }

func gsoCmsg(int) []byte { return nil }

func groSegment([]byte) int { return 0 }

// processCPU is not measured here (the socket backend is Linux-only).
func processCPU() (time.Duration, bool) { return 0, false }
