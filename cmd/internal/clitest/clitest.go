// Package clitest holds the test helpers the tests of rocev2d and of its
// command families share: the built binary, free TCP ports, exit statuses
// of processes and the port-4791-busy check. Only tests import it.
package clitest

import (
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BuildRocev2d builds the rocev2d command into a temporary directory and
// returns the binary's path.
func BuildRocev2d(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rocev2d")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/gorocev2/rocev2/cmd/rocev2d").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// ProcExitCode is the exit status of a process that ended with err (from
// exec.Cmd.Wait or Run): 0 for nil, -1 when it did not exit on its own.
func ProcExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// FreeTCPPort returns a TCP port that was free a moment ago.
func FreeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// PortBusy reports whether a command's stderr says that UDP 4791 was taken
// (by another test of the repository on the same loopback address).
func PortBusy(stderr string) bool {
	return strings.Contains(stderr, "4791") && strings.Contains(stderr, "address already in use")
}
