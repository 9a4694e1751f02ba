package cmtools

import (
	"context"
	"fmt"
	"io"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// run dispatches args[0] to the command of that name, as rocev2d's main
// does.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		for _, c := range Commands() {
			if c.Name == args[0] {
				return c.Run(ctx, args[1:], stdout, stderr)
			}
		}
	}
	fmt.Fprintf(stderr, "rocev2d: unknown command %q\n", args)
	return cli.ExitUsage
}
