//go:build unix

package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestFamilies: every command of a family package is in the table once,
// listed by `rocev2d help` with its summary, and dispatched: `help NAME`,
// `NAME -h` and `NAME --help` print its usage (also for the commands whose
// first argument is a subcommand or an address: pcap, share).
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
			for _, h := range []string{"-h", "--help"} {
				if code, out, _ := runIn(t, c.Name, h); code != cli.ExitOK || out != c.Usage {
					t.Errorf("%s %s: exit %d, stdout %q, want its usage", c.Name, h, code, out)
				}
			}
		}
	}
	// -h after a subcommand or among positional arguments is help too, not
	// a file name or an address.
	dir := t.TempDir()
	t.Chdir(dir)
	for _, args := range [][]string{{"pcap", "write-sample", "--help"}, {"pcap", "check", "-h"}, {"share", "status", "--help"}} {
		if code, out, _ := runIn(t, args...); code != cli.ExitOK || out != commands[args[0]].usage {
			t.Errorf("%v: exit %d, stdout %q, want the usage", args, code, out)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("pcap write-sample --help wrote %s", ents[0].Name())
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
