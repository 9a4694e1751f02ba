package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/udp"
)

// The --gso option of every subcommand that opens UDP socket links. It is
// added here, around the registered commands (this file's init runs after
// theirs: files initialise in name order), so the commands' own flag
// parsing never sees it: the wrapper takes it out of the arguments and sets
// the udp package's default socket options for the run.

// gsoUsage is appended to the help of the wrapped commands.
const gsoUsage = `  --gso          send each run of equal-size packets to one peer (the
                 packets of a multi-packet message) as one UDP GSO datagram
                 (UDP_SEGMENT): about twice the packet rate of plain
                 sendmmsg. Linux numbers the segments' IPv4 identifications
                 upward and each ICRC is computed for its segment. Off by
                 default: a NIC that segments in hardware must number the
                 identifications the same way (check with a capture).
  --busy-poll=DUR   poll the UDP socket without blocking for up to DUR
                 (e.g. 100us) before sleeping in each receive: CPU for
                 latency, like the ibv_poll_cq loops of ibv_rc_pingpong
                 and perftest's latency tests. Off by default, except
                 in pingpong and the *-lat tests: 100us unless -e.
`

// gsoCommands are the subcommands that open udp.ListenSocket links.
func gsoCommands() []string {
	names := []string{"demo", "bench", "pingpong"}
	for name, c := range commands {
		if strings.HasPrefix(c.summary, "perftest-compatible") {
			names = append(names, name)
		}
	}
	return names
}

func init() {
	for _, name := range gsoCommands() {
		if c, ok := commands[name]; ok {
			c.usage += gsoUsage
			c.run = withGSOFlag(name, c.run)
		}
	}
}

// withGSOFlag returns run with the --gso and --busy-poll options: taken out
// of the arguments, they set UDP GSO and SocketOptions.BusyPoll in the
// default socket options while run runs.
func withGSOFlag(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		rest, gso, err := takeGSOFlag(args)
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d %s: %v\n", name, err)
			return exitUsage
		}
		rest, poll, err := takeBusyPollFlag(rest)
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d %s: %v\n", name, err)
			return exitUsage
		}
		if gso || poll > 0 {
			o := udp.DefaultSocketOptions()
			o.GSO = o.GSO || gso
			o.BusyPoll = poll
			defer udp.SetDefaultSocketOptions(o)()
		}
		return run(ctx, rest, stdout, stderr)
	}
}

// takeFlag removes every -name / --name / --name=VAL from args (before a
// "--" that ends the options) and calls set with each value. A flag that
// needs a value (takesArg) also takes it from the next argument.
func takeFlag(args []string, name string, takesArg bool, set func(val string, hasVal bool) error) ([]string, error) {
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		n, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || n != name {
			rest = append(rest, a)
			continue
		}
		if takesArg && !hasVal {
			if i+1 == len(args) {
				return nil, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val, hasVal = args[i], true
		}
		if err := set(val, hasVal); err != nil {
			return nil, err
		}
	}
	return rest, nil
}

// takeGSOFlag removes -gso / --gso / --gso=BOOL from args (before a "--"
// that ends the options) and reports its value.
func takeGSOFlag(args []string) (rest []string, gso bool, err error) {
	rest, err = takeFlag(args, "gso", false, func(val string, hasVal bool) error {
		gso = true
		if hasVal {
			var err error
			if gso, err = strconv.ParseBool(val); err != nil {
				return fmt.Errorf("--gso=%q: want true or false", val)
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return rest, gso, nil
}

// takeBusyPollFlag removes --busy-poll=DUR / -busy-poll=DUR / --busy-poll DUR
// (before a "--" that ends the options) and returns the duration (0 when
// absent).
func takeBusyPollFlag(args []string) (rest []string, d time.Duration, err error) {
	rest, err = takeFlag(args, "busy-poll", true, func(val string, _ bool) error {
		var err error
		if d, err = time.ParseDuration(val); err != nil || d < 0 || d > time.Second {
			return fmt.Errorf("--busy-poll=%q: want a duration between 0 and 1s (e.g. 100us)", val)
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return rest, d, nil
}
