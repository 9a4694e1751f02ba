//go:build unix

package cmtools

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// TestRpingKillRestart: a rocev2d rping client process killed with
// SIGKILL mid-run (no DREQ: the server still holds its connection) and
// started again from the same address connects and pings at once, five
// times over, against one persistent rocev2d rping server process; the
// server serves them all. Before, every restart was rejected as a stale
// connection (the new process numbered its QP as the killed one did).
func TestRpingKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs processes over loopback")
	}
	bin := clitest.BuildRocev2d(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	port := cmPort()
	var srvOut, srvErr lockedBuffer
	var srv *exec.Cmd
	for try := 0; ; try++ {
		srv = exec.CommandContext(ctx, bin, "rping", "-s", "-P", "-a", "127.0.0.1", "-p", port, "-v")
		srv.Stdout, srv.Stderr = &srvOut, &srvErr
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if srv.ProcessState == nil && !strings.Contains(srvErr.String(), "address already in use") {
			break
		}
		srv.Wait()
		if try == 5 {
			t.Fatalf("server did not start: %s", srvErr.String())
		}
	}
	defer func() {
		srv.Process.Signal(syscall.SIGTERM)
		srv.Wait()
	}()
	pings := func(s string) int { return strings.Count(s, "ping data: ") }
	// The server is up once a one-ping client gets through: a fixed wait
	// was not enough under load (a CI-like run: the first client's REQ
	// reached the address's sharing group before the server listened,
	// share_drop_no_listener 1, and the client failed on the ICMP error).
	for deadline := time.Now().Add(20 * time.Second); ; {
		probe := exec.CommandContext(ctx, bin, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "1")
		pout, err := probe.CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not take a client within 20 s: %v\n%s\nserver:\n%s", err, pout, srvErr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// serverState asks the server for its device's counters (SIGUSR1:
	// they go to its stderr) and returns everything it printed.
	serverState := func() string {
		srv.Process.Signal(syscall.SIGUSR1)
		time.Sleep(200 * time.Millisecond)
		return srvErr.String()
	}
	for round := 0; round < 5; round++ {
		var out, errOut lockedBuffer
		cli := exec.CommandContext(ctx, bin, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "0", "-v", "-V")
		cli.Stdout, cli.Stderr = &out, &errOut
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for pings(out.String()) < 20 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		n := pings(out.String())
		cli.Process.Signal(syscall.SIGKILL)
		cli.Wait()
		if n < 20 {
			t.Fatalf("round %d: the client pinged %d times in 10 s\n%s%s\nserver:\n%s", round, n, out.String(), errOut.String(), serverState())
		}
	}
	// The last client ends by itself.
	cli := exec.CommandContext(ctx, bin, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "5", "-v", "-V", "--counters")
	var out, errOut bytes.Buffer
	cli.Stdout, cli.Stderr = &out, &errOut
	if err := cli.Run(); err != nil {
		t.Fatalf("last client: %v\n%s%s\nserver:\n%s", err, out.String(), errOut.String(), serverState())
	}
	if !strings.Contains(out.String(), "cm_established           1") || pings(out.String()) != 5 {
		t.Errorf("last client:\n%s", out.String())
	}
	if strings.Contains(srvErr.String(), "connect error") {
		t.Errorf("the server failed a connection:\n%s", srvErr.String())
	}
}
