package udp

import (
	"net/netip"
	"testing"
)

// TestNormAddr: normAddr's plain-IPv4 shortcut returns what Unmap and
// WithZone("") return, for every form an address may take (plain IPv4,
// IPv4-mapped IPv6 with and without a zone, IPv6 with and without a
// zone, the zero Addr).
func TestNormAddr(t *testing.T) {
	for _, s := range []string{
		"192.0.2.1", "0.0.0.0", "255.255.255.255",
		"::ffff:192.0.2.1", "::ffff:192.0.2.1%eth0",
		"2001:db8::1", "fe80::1%eth0", "::", "::1%lo",
	} {
		a := netip.MustParseAddr(s)
		if got, want := normAddr(a), a.Unmap().WithZone(""); got != want {
			t.Errorf("normAddr(%v) = %v, want %v", a, got, want)
		}
	}
	if got := normAddr(netip.Addr{}); got != (netip.Addr{}) {
		t.Errorf("normAddr(zero) = %v, want the zero Addr", got)
	}
}
