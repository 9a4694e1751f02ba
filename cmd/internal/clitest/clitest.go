// Package clitest holds the test helpers the tests of rocev2d and of its
// command families share: the built binary, free TCP ports, exit statuses
// of processes and the port-4791-busy check. Only tests import it.
package clitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
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

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{} // the ports FreeTCPPort handed out
)

// FreeTCPPort returns a TCP port that was free a moment ago on every
// address. It is drawn at random below Linux's ephemeral range (32768 and
// up by default), where the tests' own outgoing connections take their
// ports: a port handed out by the kernel for ":0" could be given again to
// some other test's connect before the server under test binds it (seen in
// CI: "TCP port 40609 is in use"). A run that still collides says so in its
// stderr, and PortBusy lets the caller retry with another port.
//
// A port is never handed out twice in one test process: two tests of a
// package given the same port would each start a server on it, one of the
// binds would fail and be retried, and meanwhile that test's client could
// connect to the other test's server and run its exchange there (a
// TestPerfBidi failure looked so: the server printed every row, its own
// client none, both saw "peer closed after 0 of 108 bytes").
func FreeTCPPort(t *testing.T) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		port := 20000 + rand.IntN(12000)
		if portsGiven[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		portsGiven[port] = true
		return port
	}
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// PortBusy reports whether a command's stderr says that a port it had to
// bind was taken: UDP 4791 (by another test of the repository on the same
// loopback address), or the TCP port of a perftest-style exchange (taken
// between FreeTCPPort and the bind).
func PortBusy(stderr string) bool {
	if !strings.Contains(stderr, "address already in use") {
		return false
	}
	return strings.Contains(stderr, "4791") || strings.Contains(stderr, "TCP port")
}

// Run dispatches args[0] to the command of that name among cmds, as
// rocev2d's main does, so that a family's tests run its commands in
// process; `help NAME` prints NAME's usage, as main's help does.
func Run(cmds []cli.Command, ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 2 && args[0] == "help" {
		for _, c := range cmds {
			if c.Name == args[1] {
				fmt.Fprint(stdout, c.Usage)
				return cli.ExitOK
			}
		}
	}
	if len(args) > 0 {
		for _, c := range cmds {
			if c.Name == args[0] {
				return c.Run(ctx, args[1:], stdout, stderr)
			}
		}
	}
	fmt.Fprintf(stderr, "rocev2d: unknown command %q\n", args)
	return cli.ExitUsage
}

// RunIn runs `rocev2d args` in process, dispatched among cmds (Run), and
// returns the exit status and what it wrote to stdout and stderr.
func RunIn(t *testing.T, cmds []cli.Command, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = Run(cmds, context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

// RunInRetry is RunIn, retried while UDP 4791 is taken by someone else
// (RetryBusy).
func RunInRetry(t *testing.T, cmds []cli.Command, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return RetryBusy(func() (int, string, string) { return RunIn(t, cmds, args...) })
}

// RetryBusy calls run until its stderr no longer says that UDP 4791 was
// taken (PortBusy), at most five times, and returns the last result.
func RetryBusy(run func() (code int, stdout, stderr string)) (int, string, string) {
	for try := 0; ; try++ {
		code, out, errOut := run()
		if try == 4 || !PortBusy(errOut) {
			return code, out, errOut
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// Main runs a command package's tests (call it from TestMain) while
// holding a lock file shared by every such package: their tests run
// devices on UDP 4791 of 127.0.0.1 and 127.0.0.2 (the commands' defaults,
// and the addresses their output is checked against), which one process
// at a time can hold, and `go test ./...` runs packages in parallel. So
// the command packages take turns, as their tests did when they were all
// in cmd/rocev2d.
func Main(m *testing.M) int {
	release, err := lockLoopback()
	if err != nil {
		fmt.Fprintf(os.Stderr, "clitest: loopback lock: %v (running without it)\n", err)
		return m.Run()
	}
	defer release()
	return m.Run()
}

// LockedBuffer is a bytes.Buffer safe for concurrent writes and reads (a
// process's output while it runs).
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
