package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// Exit statuses shared by every subcommand.
const (
	ExitOK    = 0 // success
	ExitFail  = 1 // the command ran and found a problem (bad packet, failed test)
	ExitUsage = 2 // bad usage or unreadable input
)

// Command is one subcommand of rocev2d: the families of commands in the
// packages under cmd/internal export theirs, and rocev2d's main dispatches
// to them.
type Command struct {
	Name    string
	Summary string // one line for `rocev2d help`
	Usage   string // full help text for `rocev2d help NAME`
	// Run executes the subcommand with the arguments after its name and
	// returns the exit status. It writes only to stdout and stderr and
	// returns when ctx is cancelled (SIGINT/SIGTERM) if it runs long.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// RunFunc is Command.Run's type.
type RunFunc = func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// Registry is the command list of a family whose files add their commands
// from init (commands.Register(...) in each file): Commands returns them
// in the order they were added.
type Registry struct{ cmds []Command }

// Register adds a command.
func (r *Registry) Register(name, summary, usage string, run RunFunc) {
	r.cmds = append(r.cmds, Command{Name: name, Summary: summary, Usage: usage, Run: run})
}

// Commands returns the commands added so far.
func (r *Registry) Commands() []Command { return r.cmds }

// CtxErr is err, followed by the cause of ctx in parentheses when ctx has
// ended (SIGINT, SIGTERM, --timeout) and err does not say it already: a
// run cut short says "interrupt signal received", not only "context
// canceled".
func CtxErr(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	cause := context.Cause(ctx)
	if cause == nil || strings.Contains(err.Error(), cause.Error()) {
		return err
	}
	return fmt.Errorf("%w (%v)", err, cause)
}
