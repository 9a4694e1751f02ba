package cli

import (
	"strings"
	"testing"
)

func TestParseAddrPair(t *testing.T) {
	for _, tc := range []struct {
		a, b, err string
	}{
		{a: "127.0.0.1", b: "127.0.0.2"},
		{a: "::1", b: "::1"},
		{a: "::ffff:127.0.0.1", b: "127.0.0.2"},
		{a: "x", b: "127.0.0.2", err: `--a "x": not an IP address`},
		{a: "127.0.0.1", b: "", err: `--b "": not an IP address`},
		{a: "::1", b: "127.0.0.2", err: "--a ::1 and --b 127.0.0.2: the two endpoints talk to each other, give both IPv4 or both IPv6 addresses"},
		{a: "192.0.2.1", b: "fe80::1%lo", err: "--a 192.0.2.1 and --b fe80::1%lo"},
	} {
		a, b, err := ParseAddrPair(tc.a, tc.b)
		if tc.err == "" {
			if err != nil || !a.IsValid() || !b.IsValid() || !a.Is4() && a.Is4In6() {
				t.Errorf("%s %s: %v %v %v", tc.a, tc.b, a, b, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s %s: error %v, want %q", tc.a, tc.b, err, tc.err)
		}
	}
}
