//go:build unix

package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// noDashH are the commands that take no -h (a usage error, exit status 2,
// as it always was): pcap and share, whose first argument is a
// subcommand, and soak's children, which soak starts.
var noDashH = map[string]bool{"pcap": true, "share": true, "soak-server": true, "soak-client": true}

// TestFamilies: every command of a family package is in the table once,
// listed by `rocev2d help` with its summary, and dispatched: `help NAME`
// prints its usage and `NAME -h` runs it (but noDashH).
func TestFamilies(t *testing.T) {
	n := 0
	for _, f := range families {
		for _, c := range f {
			n++
			if got, ok := commands[c.Name]; !ok || got.summary != c.Summary || got.usage != c.Usage {
				t.Errorf("%s: not in the command table as its family exports it", c.Name)
				continue
			}
			code, out, errOut := runIn(t, "help")
			if code != cli.ExitOK || !regexp.MustCompile(`(?m)^  `+regexp.QuoteMeta(c.Name)+` +`+regexp.QuoteMeta(c.Summary)+`$`).MatchString(out) {
				t.Errorf("help does not list %s:\n%s%s", c.Name, out, errOut)
			}
			if code, out, _ := runIn(t, "help", c.Name); code != cli.ExitOK || out != c.Usage {
				t.Errorf("help %s: exit %d, %d bytes, want its usage", c.Name, code, len(out))
			}
			if noDashH[c.Name] {
				if code, _, _ := runIn(t, c.Name, "-h"); code != cli.ExitUsage {
					t.Errorf("%s -h: exit %d, want %d", c.Name, code, cli.ExitUsage)
				}
				continue
			}
			if code, out, _ := runIn(t, c.Name, "-h"); code != cli.ExitOK || !strings.Contains(out, "usage: rocev2d "+c.Name) {
				t.Errorf("%s -h: exit %d, stdout %q", c.Name, code, out)
			}
		}
	}
	for _, name := range []string{"pingpong", "uc-pingpong", "ud-pingpong", "srq-pingpong"} {
		if _, ok := commands[name]; !ok {
			t.Errorf("no command %s", name)
		}
	}
	if n < 4 {
		t.Errorf("%d commands in families, want at least the 4 ping-pongs", n)
	}
}
