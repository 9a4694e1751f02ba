package perftest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// run dispatches args[0] to the perftest command of that name, as
// rocev2d's main does.
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

// runIn runs `rocev2d args` in process and returns status and output.
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// freeTCPPort is clitest.FreeTCPPort.
func freeTCPPort(t *testing.T) int { t.Helper(); return clitest.FreeTCPPort(t) }
