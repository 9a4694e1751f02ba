// Command rocev2d is the rocev2 command: it runs two endpoints in one
// process through every RC operation (demo), peers compatible with
// ibv_rc_pingpong (pingpong), ibv_uc_pingpong (uc-pingpong),
// ibv_ud_pingpong (ud-pingpong), ibv_srq_pingpong (srq-pingpong) and
// perftest (write-bw, read-lat, ...), librdmacm's examples connecting
// through the IB connection manager (rping, rdma-server, rdma-client,
// udaddy, cmtime, ucmatose), a benchmark against raw UDP (bench), N flows into one bottleneck of
// the in-memory switch with ECN, CNPs and DCQCN, drawn as CSV and SVG
// (congestion), many QP pairs between two devices (scale), a churn test of
// CM connections (soak), checks and writes RoCEv2 captures (pcap), injects
// faults on an interface (faults, Linux, root) and shows who shares an
// address's UDP port 4791 (share).
//
// Usage:
//
//	rocev2d <command> [arguments]
//	rocev2d help [command]
//
// main only dispatches: every command lives in a family package under
// cmd/internal (pingpong: the four ibv_*_pingpong peers; perftest:
// write-bw .. atomic-lat; cmtools: librdmacm's rping, rdma-server,
// rdma-client, udaddy, cmtime, ucmatose; bench: raw UDP against the stack; congestion: DCQCN
// flows into the simulated switch; demo; scale; pcapcmd: pcap; faultscmd:
// faults; soak: soak and its children; sharecmd: share), which exports its
// commands as []cli.Command; families (below) lists the packages, one line
// each, and run dispatches args[0] to the command of that name. Besides,
// this package sets the process's GOGC (gcsettle.go) and its
// ROCEV2D_TRACE and ROCEV2D_CPUPROFILE recordings (diagenv.go), and it
// turns on rdmacm's guardian (package rdmacm/guardian, cli.EnableGuardian) for every command that
// runs a connection manager (rping, rdma-server/-client, udaddy, cmtime,
// ucmatose, perftest -R, nvmf-target/-host, ...; not soak's children): a killed or
// crashed rocev2d still has its established connections' DREQs sent by a
// small child process, as Linux's kernel sends them for a killed
// process's cm_ids (docs/connection-life.md). ROCEV2D_GUARDIAN=off leaves
// it off (the connection journal then waits for a restart on the address).
//
// What the commands share is package cli (cmd/internal/cli): flag parsing,
// exit statuses, the --gso, --busy-poll and congestion control options,
// endpoints (socket link, device, PD, CQs, QP, registered memory), the
// out-of-band TCP helpers and the -v and SIGUSR1 counters.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/gorocev2/rocev2/cmd/internal/bench"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/cmtools"
	"github.com/gorocev2/rocev2/cmd/internal/congestion"
	"github.com/gorocev2/rocev2/cmd/internal/demo"
	"github.com/gorocev2/rocev2/cmd/internal/faultscmd"
	"github.com/gorocev2/rocev2/cmd/internal/pcapcmd"
	"github.com/gorocev2/rocev2/cmd/internal/perftest"
	"github.com/gorocev2/rocev2/cmd/internal/pingpong"
	"github.com/gorocev2/rocev2/cmd/internal/scale"
	"github.com/gorocev2/rocev2/cmd/internal/sharecmd"
	"github.com/gorocev2/rocev2/cmd/internal/soak"
)

// command is one subcommand.
type command struct {
	name    string
	summary string // one line for `rocev2d help`
	usage   string // full help text for `rocev2d help NAME`
	// run executes the subcommand with the arguments after its name and
	// returns the exit status. It writes only to stdout and stderr and
	// returns when ctx is cancelled (SIGINT/SIGTERM) if it runs long.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands is the subcommand table, filled from families by init.
var commands = map[string]*command{}

// register adds a subcommand to the table; it panics on a duplicate name
// (a programming error found by any test).
func register(name, summary, usage string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	if _, dup := commands[name]; dup {
		panic("rocev2d: duplicate command " + name)
	}
	commands[name] = &command{name: name, summary: summary, usage: usage, run: run}
}

// families are the command packages: one line each.
var families = [][]cli.Command{
	pingpong.Commands(),
	bench.Commands(),
	congestion.Commands(),
	perftest.Commands(),
	cmtools.Commands(),
	demo.Commands(),
	scale.Commands(),
	pcapcmd.Commands(),
	faultscmd.Commands(),
	soak.Commands(),
	sharecmd.Commands(),
}

func init() {
	for _, f := range families {
		for _, c := range f {
			register(c.Name, c.Summary, c.Usage, c.Run)
		}
	}
}

func main() {
	// In main, not init: the commands' in-process tests (run) start no
	// guardian processes.
	cli.EnableGuardian()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args[0] to its subcommand and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printHelp(stderr)
		return cli.ExitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			switch args[1] {
			case "help", "-h", "-help", "--help":
				// help is listed with the commands: its usage is the
				// list (`help -h` called -h an unknown command).
				printHelp(stdout)
				return cli.ExitOK
			}
			c, ok := commands[args[1]]
			if !ok {
				fmt.Fprintf(stderr, "rocev2d: unknown command %q\n", args[1])
				printHelp(stderr)
				return cli.ExitUsage
			}
			fmt.Fprint(stdout, c.usage)
			return cli.ExitOK
		}
		printHelp(stdout)
		return cli.ExitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "rocev2d: unknown command %q\n", args[0])
		printHelp(stderr)
		return cli.ExitUsage
	}
	if wantsHelp(args[1:]) {
		fmt.Fprint(stdout, c.usage)
		return cli.ExitOK
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

// wantsHelp reports whether a command's arguments ask for its usage (-h,
// -help or --help anywhere before "--"), whatever else they hold: every
// command answers it the same way, including those with subcommands or
// positional arguments (where it was taken for a file name or an
// address).
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// printHelp lists the commands.
func printHelp(w io.Writer) {
	fmt.Fprintln(w, "usage: rocev2d <command> [arguments]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := len("help")
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-*s %s\n", width, "help", "show this list, or `help COMMAND` for a command's usage")
}
