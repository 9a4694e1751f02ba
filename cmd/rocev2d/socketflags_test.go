//go:build unix

package main

import (
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// socketCommands are the commands that open UDP socket links.
func socketCommands() []string {
	names := []string{"demo", "bench", "pingpong"}
	for pt := oob.WriteBW; pt <= oob.AtomicLat; pt++ {
		names = append(names, pt.String())
	}
	return names
}

// TestSocketFlagsCommands: every command that opens socket links takes
// --gso and --busy-poll, documents them, and builds its socket options
// from them (demo's TestDemoSocketOptions, perftest's tests); bad values
// are usage errors of the command.
func TestSocketFlagsCommands(t *testing.T) {
	for _, n := range socketCommands() {
		c, ok := commands[n]
		if !ok {
			t.Errorf("no command %s", n)
			continue
		}
		if !strings.Contains(c.usage, "--gso") || !strings.Contains(c.usage, "--busy-poll=DUR") {
			t.Errorf("help of %s does not describe --gso and --busy-poll", n)
		}
	}
	// Bad values are usage errors of the command.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--gso=x"}, "-gso"},
		{[]string{"pingpong", "--busy-poll=fast"}, "want a duration between 0 and 1s"},
		{[]string{"write-lat", "127.0.0.1", "--busy-poll"}, "-busy-poll"},
	} {
		if code, _, errOut := runIn(t, tc.args...); code != cli.ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q", tc.args, code, errOut)
		}
	}
}
