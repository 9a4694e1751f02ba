package perftest

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// fakeConn is a net.Conn with a given remote address.
type fakeConn struct {
	net.Conn
	remote net.Addr
}

func (c fakeConn) RemoteAddr() net.Addr { return c.remote }

// TestVersionClosedHint: what a side says when the peer hangs up before
// the versions; a client is not told about -R (a rocev2d server with -R
// answers TCP clients to say so), and the shared address is named.
func TestVersionClosedHint(t *testing.T) {
	local := netip.MustParseAddr("127.0.0.9")
	conn := func(ip string) net.Conn {
		return fakeConn{remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 18515}}
	}
	for _, tc := range []struct {
		role     oob.Role
		peer     string
		want     []string
		wantNone string
	}{
		{oob.Client, "127.0.0.10", []string{"the server hung up before the exchange"}, "-R"},
		{oob.Client, "127.0.0.9", []string{"this side runs RoCEv2 on 127.0.0.9, the server's address", "--bind"}, "-R"},
		{oob.Server, "127.0.0.10", []string{"could not set up its side", "add -R here too"}, "connected from"},
		{oob.Server, "127.0.0.9", []string{"it connected from 127.0.0.9, where this side holds UDP port 4791", "add -R here too"}, ""},
	} {
		got := versionClosedHint(tc.role, local, conn(tc.peer))
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%v, peer %s: %q lacks %q", tc.role, tc.peer, got, w)
			}
		}
		if tc.wantNone != "" && strings.Contains(got, tc.wantNone) {
			t.Errorf("%v, peer %s: %q has %q", tc.role, tc.peer, got, tc.wantNone)
		}
	}
}
