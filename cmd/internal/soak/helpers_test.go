package soak

import (
	"context"
	"io"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// run dispatches args[0] to the package's command of that name (the soak
// children too).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return clitest.Run(Commands(), ctx, args, stdout, stderr)
}
