package scale

import (
	"os"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// TestMain holds the command packages' loopback lock (clitest.Main) while
// the tests run: they open UDP 4791 on 127.0.0.1 and 127.0.0.2.
func TestMain(m *testing.M) { os.Exit(clitest.Main(m)) }

// runIn runs `rocev2d args` in process and returns status and output.
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RunIn(t, Commands(), args...)
}

// runInRetry is runIn, retried while UDP 4791 is taken by someone else.
func runInRetry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RunInRetry(t, Commands(), args...)
}
