//go:build linux

package faultscmd

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// TestMain holds the command packages' loopback lock (clitest.Main) while
// the tests run: they open UDP 4791 on 127.0.0.1 and 127.0.0.2.
func TestMain(m *testing.M) { os.Exit(clitest.Main(m)) }

// run dispatches args[0] to the package's command of that name.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return clitest.Run(Commands(), ctx, args, stdout, stderr)
}
