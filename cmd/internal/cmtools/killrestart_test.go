//go:build unix

package cmtools

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
	"github.com/gorocev2/rocev2/rdmacm"
)

// TestRpingKillRestart: a rocev2d rping client process killed with
// SIGKILL mid-run (it sends no DREQ) and started again from the same
// address connects and pings at once, five times over, against one
// persistent rocev2d rping server process; the server serves them all.
// Before, every restart was rejected as a stale connection (the new
// process numbered its QP as the killed one did). With the connection
// journal (rdmacm.JournalEnv, a directory of the test's) each restarted
// client sends the DREQ its killed predecessor could not, and the server
// reports each killed client's DISCONNECT as it would a closed one's.
func TestRpingKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs processes over loopback")
	}
	bin := clitest.BuildRocev2d(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	port := cmPort()
	// The guardian (on by default in rocev2d) would send a killed
	// client's DREQ before its restart does: off, so that this test
	// keeps checking the restart's replay (TestRpingKillGuardian checks
	// the guardian).
	env := append(os.Environ(), rdmacm.JournalEnv+"="+t.TempDir(), cli.GuardianEnv+"=off")
	var srvOut, srvErr lockedBuffer
	srv := startRpingServer(t, ctx, bin, env, &srvOut, &srvErr, "-p", port)
	pings := func(s string) int { return strings.Count(s, "ping data: ") }
	// The server is up once a one-ping client gets through: a fixed wait
	// was not enough under load (a CI-like run: the first client's REQ
	// reached the address's sharing group before the server listened,
	// share_drop_no_listener 1, and the client failed on the ICMP error).
	for deadline := time.Now().Add(20 * time.Second); ; {
		probe := exec.CommandContext(ctx, bin, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "1")
		probe.Env = env
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
		cli.Stdout, cli.Stderr, cli.Env = &out, &errOut, env
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
	cli.Stdout, cli.Stderr, cli.Env = &out, &errOut, env
	if err := cli.Run(); err != nil {
		t.Fatalf("last client: %v\n%s%s\nserver:\n%s", err, out.String(), errOut.String(), serverState())
	}
	if !strings.Contains(out.String(), "cm_established           1") || pings(out.String()) != 5 {
		t.Errorf("last client:\n%s", out.String())
	}
	if strings.Contains(srvErr.String(), "connect error") {
		t.Errorf("the server failed a connection:\n%s", srvErr.String())
	}
	// The last client spoke for the fifth killed one: one DREQ. (The
	// server's DREP names the killed process's communication ID, which
	// the address's sharing group steers to that gone member: dropped.)
	if !strings.Contains(out.String(), "cm_dreq_for_dead         1") {
		t.Errorf("last client did not send the killed client's DREQ:\n%s", out.String())
	}
	// The probe's, the five killed clients' and the last client's
	// connections all end with the server's DISCONNECT EVENT; none is
	// lost to keep-alive.
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(srvErr.String(), "server DISCONNECT EVENT") < 7 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := strings.Count(srvErr.String(), "server DISCONNECT EVENT"); n < 7 || strings.Contains(srvErr.String(), "connection lost") {
		t.Errorf("server reported %d DISCONNECT EVENTs, want 7 (a probe, 5 killed clients, the last):\n%s", n, srvErr.String())
	}
}

// TestRpingKillGuardian: a rocev2d rping client process killed with
// SIGKILL mid-run and never restarted: its guardian (on by default in
// rocev2d, package rdmacm/guardian) sends the DREQ, and the rocev2d rping
// server — keep-alive off, so nothing else could end the connection —
// reports the client's DISCONNECT. With ROCEV2D_GUARDIAN=off it waits
// for good.
func TestRpingKillGuardian(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs processes over loopback")
	}
	bin := clitest.BuildRocev2d(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := cmPort()
	env := append(os.Environ(), rdmacm.JournalEnv+"="+t.TempDir())
	var srvErr lockedBuffer
	startRpingServer(t, ctx, bin, env, &srvErr, &srvErr, "-p", port, "--keepalive=-1s")
	for deadline := time.Now().Add(20 * time.Second); ; {
		out := &lockedBuffer{}
		client := exec.CommandContext(ctx, bin, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "0", "-v", "--keepalive=-1s")
		client.Stdout, client.Stderr, client.Env = out, out, env
		if err := client.Start(); err != nil {
			t.Fatal(err)
		}
		for strings.Count(out.String(), "ping data: ") < 20 && time.Now().Before(deadline) && !strings.Contains(out.String(), "error") {
			time.Sleep(10 * time.Millisecond)
		}
		if strings.Count(out.String(), "ping data: ") >= 20 {
			client.Process.Signal(syscall.SIGKILL)
			client.Wait()
			break
		}
		client.Process.Kill()
		client.Wait()
		if time.Now().After(deadline) {
			t.Fatalf("the client did not ping within 20 s:\n%s\nserver:\n%s", out.String(), srvErr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srvErr.String(), "server DISCONNECT EVENT") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(srvErr.String(), "server DISCONNECT EVENT") {
		t.Errorf("the server was not told of the killed client:\n%s", srvErr.String())
	}
}

// startRpingServer starts `rocev2d rping -s -P -a 127.0.0.1 -v` with extra
// arguments, trying again (up to 6 times) while the port is still in use
// by an earlier test's server (only what this try printed counts), and
// stops it with SIGTERM when t ends.
func startRpingServer(t *testing.T, ctx context.Context, bin string, env []string, stdout, stderr *lockedBuffer, extra ...string) *exec.Cmd {
	t.Helper()
	args := append([]string{"rping", "-s", "-P", "-a", "127.0.0.1", "-v"}, extra...)
	for try := 0; ; try++ {
		srv := exec.CommandContext(ctx, bin, args...)
		srv.Stdout, srv.Stderr, srv.Env = stdout, stderr, env
		seen := len(stderr.String()) // what an earlier try printed
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if !strings.Contains(stderr.String()[seen:], "address already in use") {
			t.Cleanup(func() {
				srv.Process.Signal(syscall.SIGTERM)
				srv.Wait()
			})
			return srv
		}
		srv.Wait()
		if try == 5 {
			t.Fatalf("server did not start: %s", stderr.String())
		}
	}
}
