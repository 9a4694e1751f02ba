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

// The tests of this package send datagrams to arbitrary QPNs over bare
// links: a shared link would receive only its leased QPNs. Sharing is
// tested where it is asked for (ShareOn, share_linux_test.go).
func init() { autoShare = false }
