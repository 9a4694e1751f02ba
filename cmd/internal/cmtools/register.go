package cmtools

import (
	"context"
	"io"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// commands are the librdmacm tools, registered by their files' init.
var commands []cli.Command

// register adds a command to commands.
func register(name, summary, usage string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	commands = append(commands, cli.Command{Name: name, Summary: summary, Usage: usage, Run: run})
}

// Commands are rping, rdma-server, rdma-client and udaddy, for rocev2d's
// dispatch.
func Commands() []cli.Command { return commands }
