//go:build !linux

package cli

import (
	"io"

	"github.com/gorocev2/rocev2/udp"
)

// printShareCounters prints nothing where sockets are never shared.
func printShareCounters(w io.Writer, l udp.Link) {}

// foreignGroup reports false where sockets are never shared.
func foreignGroup(err error) bool { return false }
