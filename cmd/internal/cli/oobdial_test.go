package cli

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestOOBLocalTCPAddr(t *testing.T) {
	for _, tt := range []struct {
		bind, server, want string // want "" = not bound
	}{
		{"", "192.0.2.2", ""},
		{"192.0.2.1", "192.0.2.2", "192.0.2.1:0"},
		{"192.0.2.1", "vm", "192.0.2.1:0"},
		{"fe80::1%eth0", "fe80::2%eth0", "[fe80::1%eth0]:0"},
		{"fe80::1%eth0", "fe80::2", "[fe80::1%eth0]:0"},
		{"fe80::1%eth0", "192.0.2.2", ""}, // other family: not bound
		{"192.0.2.1", "2001:db8::2", ""},
		{"2001:db8::1", "host.example", "[2001:db8::1]:0"},
	} {
		var bind netip.Addr
		if tt.bind != "" {
			bind = netip.MustParseAddr(tt.bind)
		}
		got := OOBLocalTCPAddr(bind, tt.server)
		if (got == nil) != (tt.want == "") || (got != nil && got.String() != tt.want) {
			t.Errorf("bind %q server %q: %v, want %q", tt.bind, tt.server, got, tt.want)
		}
	}
}

func TestOOBDialPermanent(t *testing.T) {
	bind := netip.MustParseAddr("fe80::1%eth0")
	local := &net.TCPAddr{IP: bind.AsSlice(), Zone: "eth0"}
	op := func(call string, errno syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError(call, errno)}
	}
	if err := OOBDialPermanent(op("bind", syscall.EINVAL), bind, local); err == nil ||
		!strings.Contains(err.Error(), "cannot bind the out-of-band TCP connection to --bind fe80::1%eth0") || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("bind EINVAL: %v", err)
	}
	if err := OOBDialPermanent(op("connect", syscall.EINVAL), netip.Addr{}, nil); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("connect EINVAL (link-local without zone): %v", err)
	}
	for _, e := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ENETUNREACH, syscall.EHOSTUNREACH} {
		if err := OOBDialPermanent(op("connect", e), bind, local); err != nil {
			t.Errorf("%v is worth a retry, got %v", e, err)
		}
	}
}

func TestPeerFamily(t *testing.T) {
	v4, v6, mapped := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr("::ffff:192.0.2.2")
	if PeerFamily(v4, mapped) != nil || PeerFamily(v6, netip.MustParseAddr("fe80::2")) != nil {
		t.Error("same family refused")
	}
	// --bind needs an address of the peer's family, and the example is one.
	for _, tc := range []struct {
		name        string
		local, peer netip.Addr
		want        []string
		notWant     string
	}{
		{"IPv4 local, IPv6 peer", v4, netip.MustParseAddr("fe80::2"), []string{
			"the peer's GID fe80::2 is IPv6 but the local RoCEv2 address 192.0.2.1 is IPv4: give --bind an IPv6 address of this host (a link-local one with its zone, e.g. fe80::1%eth0)",
			"have the peer use its IPv4 GID index"}, "192.0.2.1)"},
		{"IPv6 local, IPv4 peer", v6, mapped, []string{
			"the peer's GID 192.0.2.2 is IPv4 but the local RoCEv2 address fe80::1%eth0 is IPv6: give --bind an IPv4 address of this host (e.g. 192.0.2.1)",
			"have the peer use its IPv6 GID index"}, "fe80::1%eth0)"},
	} {
		err := PeerFamily(tc.local, tc.peer)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), tc.notWant) {
			t.Errorf("%s: %q gives an example of the wrong family (%q)", tc.name, err, tc.notWant)
		}
	}
	// A GID without an address names the GID index flag.
	if _, err := PeerFromGID([16]byte{}, "-x"); err == nil || !strings.Contains(err.Error(), "have the peer pass -x the index of a GID that holds one of its IP addresses") {
		t.Errorf("zero GID: %v", err)
	}
}
