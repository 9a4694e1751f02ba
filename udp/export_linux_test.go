//go:build linux

package udp

import (
	"testing"

	"github.com/gorocev2/rocev2/internal/netns"
)

// Exports for the external test package udp_test (veth tests that run the
// transport over every backend).

// NewNetnsPair is newNetnsPair for udp_test.
func NewNetnsPair(t testing.TB, mtu int) *netns.Pair { return newNetnsPair(t, mtu) }
