package cli_test

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestBusyPollOneCPU: on a machine with one CPU the latency commands do
// not busy-poll by default, and --busy-poll still sets it; with more CPUs
// the default stays defaultBusyPoll; commands that do not poll never do.
func TestBusyPollOneCPU(t *testing.T) {
	saved := cli.OneCPU
	t.Cleanup(func() { cli.OneCPU = saved })
	for _, c := range []struct {
		name   string
		one    bool
		args   []string
		poll   bool
		expect time.Duration
	}{
		{"one CPU, default", true, nil, true, 0},
		{"one CPU, --busy-poll=50us", true, []string{"--busy-poll=50us"}, true, 50 * time.Microsecond},
		{"one CPU, not polling", true, []string{"--busy-poll=50us"}, false, 0},
		{"two CPUs, default", false, nil, true, cli.DefaultBusyPoll},
		{"two CPUs, --busy-poll=0", false, []string{"--busy-poll=0"}, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cli.OneCPU = c.one
			var f cli.SocketFlags
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			cli.AddSocketFlags(fs, &f)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if got := f.Options(c.poll, cli.DefaultBusyPoll).BusyPoll; got != c.expect {
				t.Errorf("BusyPoll %v, want %v", got, c.expect)
			}
		})
	}
}
