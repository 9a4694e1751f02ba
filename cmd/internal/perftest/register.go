package perftest

import (
	"context"
	"io"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// commands are the perftest commands, registered by perf_flags.go's init.
var commands []cli.Command

// register adds a command to commands.
func register(name, summary, usage string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	commands = append(commands, cli.Command{Name: name, Summary: summary, Usage: usage, Run: run})
}

// Commands are the eight perftest commands (write-bw .. atomic-lat), for
// rocev2d's dispatch.
func Commands() []cli.Command { return commands }
