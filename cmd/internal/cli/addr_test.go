package cli

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/transport"
)

// TestParseIP: the forms users type for an address flag: brackets are
// taken, a port or a link-local address without its zone is refused with
// what to give instead (they failed as "not an IP address", "missing port
// in address", a host lookup of "127.0.0.1:18515", or "bind: invalid
// argument").
func TestParseIP(t *testing.T) {
	for _, tc := range []struct {
		s, portFlag string
		want        string // the address, or "" when refused
		err         string
	}{
		{s: "192.0.2.1", want: "192.0.2.1"},
		{s: "::ffff:192.0.2.1", want: "192.0.2.1"},
		{s: "[::1]", want: "::1"},
		{s: "::1", want: "::1"},
		{s: "fe80::1%eth0", want: "fe80::1%eth0"},
		{s: "[fe80::1%eth0]", want: "fe80::1%eth0"},
		{s: "fe80::1", err: `--x fe80::1: a link-local address needs its zone, the interface it is on (e.g. fe80::1%eth0)`},
		{s: "127.0.0.1:4791", err: `--x "127.0.0.1:4791": give the address alone (RoCEv2 always uses UDP port 4791)`},
		{s: "[::1]:4420", portFlag: "--port", err: `--x "[::1]:4420": give the address alone; --port sets the port`},
		{s: "localhost", err: `--x "localhost": not an IP address`},
		{s: "", err: "not an IP address"},
	} {
		a, err := ParseIP("--x", tc.s, tc.portFlag)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, %v; want error %q", tc.s, a, err, tc.err)
		case tc.err == "" && (err != nil || a.String() != tc.want):
			t.Errorf("%q: %v, %v; want %s", tc.s, a, err, tc.want)
		}
	}
	if _, err := ParseBind("fe80::1"); err == nil || !strings.Contains(err.Error(), "--bind fe80::1: a link-local address needs its zone") {
		t.Errorf("ParseBind(fe80::1): %v", err)
	}
}

// TestPeerArg: a client's server argument: a host name or an address,
// brackets taken, a port refused naming the port flag, a link-local
// address only with its zone.
func TestPeerArg(t *testing.T) {
	for _, tc := range []struct {
		s, want, err string
	}{
		{s: "192.0.2.1", want: "192.0.2.1"},
		{s: "server.example", want: "server.example"},
		{s: "[2001:db8::1]", want: "2001:db8::1"},
		{s: "2001:db8::1", want: "2001:db8::1"},
		{s: "fe80::1%eth0", want: "fe80::1%eth0"},
		{s: "192.0.2.1:18515", err: `server "192.0.2.1:18515": give the address alone; -p sets the port`},
		{s: "server.example:18515", err: `server "server.example:18515": give the address alone; -p sets the port`},
		{s: "[2001:db8::1]:18515", err: `give the address alone; -p sets the port`},
		{s: "fe80::1", err: "server fe80::1: a link-local address needs its zone"},
	} {
		got, err := PeerArg("server", tc.s, "-p")
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %q, %v; want error %q", tc.s, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%q: %q, %v; want %q", tc.s, got, err, tc.want)
		}
	}
}

// TestActiveMTU: the path MTU an interface carries, as rxe's port reports
// it (eth_mtu_int_to_enum: the interface's MTU less 80 bytes of headers).
func TestActiveMTU(t *testing.T) {
	for _, tc := range []struct {
		link int
		want transport.MTU
	}{
		{65536, transport.MTU4096}, {9000, transport.MTU4096}, {4176, transport.MTU4096}, {4175, transport.MTU2048},
		{1500, transport.MTU1024}, {1104, transport.MTU1024}, {1103, transport.MTU512}, {336, transport.MTU256}, {335, 0},
	} {
		got, ok := ActiveMTU(tc.link)
		if got != tc.want || ok != (tc.want != 0) {
			t.Errorf("ActiveMTU(%d) = %v, %v; want %v", tc.link, got, ok, tc.want)
		}
	}
}

// TestLinkOf: every 127.0.0.0/8 address is lo's (which carries path MTU
// 4096).
func TestLinkOf(t *testing.T) {
	name, mtu, ok := LinkOf(netip.MustParseAddr("127.0.0.77"))
	if !ok || name == "" || mtu < 4176 {
		t.Fatalf("LinkOf(127.0.0.77) = %q, %d, %v; want lo", name, mtu, ok)
	}
	if m, _ := ActiveMTU(mtu); m != transport.MTU4096 {
		t.Errorf("lo's MTU %d carries %v", mtu, m)
	}
}

// TestListenSocketLinkLocalAdvice: a link-local address without its zone
// fails with advice naming the zone, not "pick another address".
func TestListenSocketLinkLocalAdvice(t *testing.T) {
	_, err := ListenSocket(netip.MustParseAddr("fe80::1"), SocketFlags{}.Options(false, 0), "pick another address with --bind")
	if err == nil {
		t.Fatal("ListenSocket(fe80::1) succeeded")
	}
	if !strings.Contains(err.Error(), "a link-local address needs its zone") {
		t.Errorf("error %q names no zone", err)
	}
}

// TestCtxErr: an error of a run cut short names the cause of its context
// (an interrupt, --timeout), once; other errors pass unchanged.
func TestCtxErr(t *testing.T) {
	base := errors.New("WRITE 65536 B: context canceled")
	if got := CtxErr(context.Background(), base); got != base {
		t.Errorf("live context: %v", got)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("interrupt signal received"))
	got := CtxErr(ctx, base)
	if got.Error() != "WRITE 65536 B: context canceled (interrupt signal received)" || !errors.Is(got, base) {
		t.Errorf("interrupted: %v", got)
	}
	if again := CtxErr(ctx, got); again.Error() != got.Error() {
		t.Errorf("cause named twice: %v", again)
	}
}
