package perftest

import (
	"context"
	"io"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// run dispatches args[0] to the package's command of that name.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return clitest.Run(Commands(), ctx, args, stdout, stderr)
}

// runIn runs `rocev2d args` in process and returns status and output.
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RunIn(t, Commands(), args...)
}

// freeTCPPort is clitest.FreeTCPPort.
func freeTCPPort(t *testing.T) int { t.Helper(); return clitest.FreeTCPPort(t) }
