//go:build unix

package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildRocev2d builds the command into a temporary directory.
func buildRocev2d(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rocev2d")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func procExitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// TestPerfProcesses runs every perftest-compatible test between two rocev2d
// processes, server on 127.0.0.2 and client on 127.0.0.1, with data
// checks, and checks exit statuses and the reported bytes and iterations.
func TestPerfProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs loopback traffic")
	}
	bin := buildRocev2d(t)
	tests := []struct {
		test    string
		size    int
		cliRows int
		srvRows int
	}{
		{"write-bw", 3000, 1, 1}, {"read-bw", 8192, 1, 1}, {"send-bw", 1024, 1, 1}, {"atomic-bw", 8, 1, 1},
		{"write-lat", 64, 1, 1}, {"read-lat", 100, 1, 0}, {"send-lat", 5000, 1, 1}, {"atomic-lat", 8, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.test, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var so, se, co, ce bytes.Buffer
			var serr, cerr error
			for try := 0; try < 5; try++ {
				so.Reset()
				se.Reset()
				co.Reset()
				ce.Reset()
				port := strconv.Itoa(freeTCPPort(t))
				args := []string{"-p", port, "-n", "20", "-s", strconv.Itoa(tt.size), "--check", "--connect-timeout", "5s", "--timeout", "30s"}
				srv := exec.CommandContext(ctx, bin, append([]string{tt.test, "--bind", "127.0.0.2"}, args...)...)
				srv.Stdout, srv.Stderr = &so, &se
				if err := srv.Start(); err != nil {
					t.Fatal(err)
				}
				cli := exec.CommandContext(ctx, bin, append(append([]string{tt.test, "--bind", "127.0.0.1"}, args...), "127.0.0.2")...)
				cli.Stdout, cli.Stderr = &co, &ce
				cerr = cli.Run()
				serr = srv.Wait()
				if !portBusy(se.String() + ce.String()) {
					break
				}
				time.Sleep(300 * time.Millisecond)
			}
			for _, p := range []struct {
				name string
				code int
				out  string
				err  string
				rows int
			}{{"server", procExitCode(serr), so.String(), se.String(), tt.srvRows}, {"client", procExitCode(cerr), co.String(), ce.String(), tt.cliRows}} {
				if p.code != 0 {
					t.Fatalf("%s exit %d\n%s%s", p.name, p.code, p.out, p.err)
				}
				rows := resultRows(p.out)
				if len(rows) != p.rows {
					t.Fatalf("%s: %d rows, want %d\n%s", p.name, len(rows), p.rows, p.out)
				}
				for _, r := range rows {
					if r[0] != strconv.Itoa(tt.size) || r[1] != "20" {
						t.Errorf("%s row %v: want %d bytes, 20 iterations", p.name, r, tt.size)
					}
				}
				if !strings.Contains(p.out, " data check: ok") {
					t.Errorf("%s: no data check line\n%s", p.name, p.out)
				}
			}
		})
	}
}

// TestSIGUSR1 sends SIGUSR1 to a server waiting for its client and to a
// client in the middle of a two-second run: both print counters and go on.
func TestSIGUSR1(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs loopback traffic")
	}
	bin := buildRocev2d(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := strconv.Itoa(freeTCPPort(t))
	args := []string{"-p", port, "-D", "2", "-s", "1024"}
	srv := exec.CommandContext(ctx, bin, append([]string{"write-bw", "--bind", "127.0.0.2"}, args...)...)
	var so, se bytes.Buffer
	srv.Stdout, srv.Stderr = &so, &se
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := srv.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	cli := exec.CommandContext(ctx, bin, append(append([]string{"write-bw", "--bind", "127.0.0.1"}, args...), "127.0.0.2")...)
	var co, ce bytes.Buffer
	cli.Stdout, cli.Stderr = &co, &ce
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := cli.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	cerr := cli.Wait()
	serr := srv.Wait()
	if procExitCode(serr) != 0 || procExitCode(cerr) != 0 {
		t.Fatalf("exit server %v client %v\n%s%s\n%s%s", serr, cerr, so.String(), se.String(), co.String(), ce.String())
	}
	// A server with --bind has its device while it waits for the client.
	if !strings.Contains(se.String(), "counters 127.0.0.2:") {
		t.Errorf("server stderr lacks the counters of its device, waiting:\n%s", se.String())
	}
	if !strings.Contains(ce.String(), "counters 127.0.0.1:") || !strings.Contains(ce.String(), "sent_pkts") {
		t.Errorf("client stderr lacks counters:\n%s", ce.String())
	}
}

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
	bin := buildRocev2d(t)
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
			t.Fatalf("round %d: the client pinged %d times in 10 s\n%s%s\nserver:\n%s", round, n, out.String(), errOut.String(), srvErr.String())
		}
	}
	// The last client ends by itself.
	cli := exec.CommandContext(ctx, bin, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "5", "-v", "-V", "--counters")
	var out, errOut bytes.Buffer
	cli.Stdout, cli.Stderr = &out, &errOut
	if err := cli.Run(); err != nil {
		t.Fatalf("last client: %v\n%s%s", err, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "cm_established           1") || pings(out.String()) != 5 {
		t.Errorf("last client:\n%s", out.String())
	}
	if strings.Contains(srvErr.String(), "connect error") {
		t.Errorf("the server failed a connection:\n%s", srvErr.String())
	}
}
