package cmtools

import (
	"strings"
	"testing"
)

// TestBindFor: --bind wins over the tools' -b, a bad address is an error,
// and a server (no -s) without an address is refused with the reason, in
// each command that takes its address through bindFor.
func TestBindFor(t *testing.T) {
	for _, tc := range []struct {
		bind, bindB string
		server      bool
		want, err   string
	}{
		{"192.0.2.7", "192.0.2.8", true, "192.0.2.7", ""},
		{"", "192.0.2.8", true, "192.0.2.8", ""},
		{"", "", false, "invalid IP", ""},
		{"", "", true, "", "the server needs -b addr or --bind=IP"},
		{"not-an-ip", "", false, "", "not-an-ip"},
	} {
		a, err := bindFor(tc.bind, tc.bindB, tc.server)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("bindFor(%q, %q, %v) = %v, %v; want an error with %q", tc.bind, tc.bindB, tc.server, a, err, tc.err)
			}
		case err != nil || a.String() != tc.want:
			t.Errorf("bindFor(%q, %q, %v) = %v, %v; want %s", tc.bind, tc.bindB, tc.server, a, err, tc.want)
		}
	}
	for name, parse := range map[string]func([]string) error{
		"cmtime":   func(a []string) error { _, err := parseCmtimeFlags(a); return err },
		"ucmatose": func(a []string) error { _, err := parseUcmatoseFlags(a); return err },
		"udaddy":   func(a []string) error { _, err := parseUdaddyFlags(a); return err },
	} {
		if err := parse(nil); err == nil || !strings.Contains(err.Error(), "the server needs -b addr") {
			t.Errorf("%s as a server without an address: %v", name, err)
		}
		if err := parse([]string{"-b", "192.0.2.9"}); err != nil {
			t.Errorf("%s -b 192.0.2.9: %v", name, err)
		}
	}
}
