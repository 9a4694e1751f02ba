package demo

import (
	"os"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
	"github.com/gorocev2/rocev2/cmd/internal/pcapcmd"
)

// TestMain holds the command packages' loopback lock (clitest.Main) while
// the tests run: they open UDP 4791 on 127.0.0.1 and 127.0.0.2.
func TestMain(m *testing.M) { os.Exit(clitest.Main(m)) }

// runIn runs `rocev2d args` in process and returns status and output.
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RunIn(t, testCommands(), args...)
}

// runInRetry is runIn, retried while UDP 4791 is taken by someone else.
func runInRetry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RunInRetry(t, testCommands(), args...)
}

// testCommands are demo's commands and pcap's, whose check the tests run
// on demo's captures.
func testCommands() []cli.Command { return append(Commands(), pcapcmd.Commands()...) }
