//go:build linux

package udp

import "testing"

// Exports for the external test package udp_test (veth tests that run the
// transport over every backend).

// NetnsPair is netnsPair for udp_test.
type NetnsPair = netnsPair

// NewNetnsPair is newNetnsPair for udp_test.
func NewNetnsPair(t testing.TB, mtu int) *NetnsPair { return newNetnsPair(t, mtu) }

// InNetns is inNetns for udp_test.
func InNetns[T any](t testing.TB, ns string, f func() (T, error)) T { return inNetns(t, ns, f) }

// SkipUnlessNetns is skipUnlessNetns for udp_test.
func SkipUnlessNetns(t testing.TB) { skipUnlessNetns(t) }
