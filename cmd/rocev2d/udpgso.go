package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

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

// withGSOFlag returns run with the --gso option: taken out of the
// arguments, it switches UDP GSO on in the default socket options while
// run runs.
func withGSOFlag(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		rest, gso, err := takeGSOFlag(args)
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d %s: %v\n", name, err)
			return exitUsage
		}
		if gso {
			o := udp.DefaultSocketOptions()
			o.GSO = true
			defer udp.SetDefaultSocketOptions(o)()
		}
		return run(ctx, rest, stdout, stderr)
	}
}

// takeGSOFlag removes -gso / --gso / --gso=BOOL from args (before a "--"
// that ends the options) and reports its value.
func takeGSOFlag(args []string) (rest []string, gso bool, err error) {
	rest = make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "gso" {
			rest = append(rest, a)
			continue
		}
		gso = true
		if hasVal {
			if gso, err = strconv.ParseBool(val); err != nil {
				return nil, false, fmt.Errorf("--gso=%q: want true or false", val)
			}
		}
	}
	return rest, gso, nil
}
