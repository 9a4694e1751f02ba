//go:build unix

package main

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// The ping-pong commands live in cmd/internal/pingpong with their tests;
// here the binary runs one as two processes.

var (
	reBytes = regexp.MustCompile(`(?m)^(\d+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec$`)
	reIters = regexp.MustCompile(`(?m)^(\d+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter$`)
)

// TestPingpongProcesses runs server and client as two rocev2d processes on
// loopback (127.0.0.2 and 127.0.0.1, each on its own UDP 4791).
func TestPingpongProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs loopback traffic")
	}
	bin := clitest.BuildRocev2d(t)
	const size, iters = 5000, 200 // 5 packets per message at MTU 1024
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		port := strconv.Itoa(clitest.FreeTCPPort(t))
		args := []string{"-p", port, "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-c", "--timeout", "50s"}
		var sout, serr bytes.Buffer
		srv := exec.CommandContext(ctx, bin, append([]string{"pingpong", "--bind", "127.0.0.2"}, args...)...)
		srv.Stdout, srv.Stderr = &sout, &serr
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		var cout, cerr bytes.Buffer
		var cliErr error
		for deadline := time.Now().Add(10 * time.Second); ; {
			cout.Reset()
			cerr.Reset()
			cli := exec.CommandContext(ctx, bin, append(append([]string{"pingpong", "--bind", "127.0.0.1"}, args...), "127.0.0.2")...)
			cli.Stdout, cli.Stderr = &cout, &cerr
			cliErr = cli.Run()
			if cliErr == nil || !strings.Contains(cerr.String(), "couldn't connect") || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if cliErr != nil {
			srv.Process.Signal(syscall.SIGTERM)
		}
		srvErr := srv.Wait()
		cancel()
		if strings.Contains(serr.String()+cerr.String(), "address already in use") && attempt < 5 {
			t.Logf("UDP 4791 busy, retrying: %s%s", serr.String(), cerr.String())
			time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
			continue
		}
		for _, r := range []struct {
			side     string
			err      error
			out, std string
		}{{"server", srvErr, sout.String(), serr.String()}, {"client", cliErr, cout.String(), cerr.String()}} {
			if r.err != nil {
				t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", r.side, r.err, r.out, r.std)
			}
			mb, mi := reBytes.FindStringSubmatch(r.out), reIters.FindStringSubmatch(r.out)
			if mb == nil || mi == nil || mb[1] != strconv.Itoa(2*size*iters) || mi[1] != strconv.Itoa(iters) {
				t.Fatalf("%s: result lines wrong:\n%s", r.side, r.out)
			}
		}
		return
	}
}
