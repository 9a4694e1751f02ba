package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// loopbackPair returns two random addresses of 127.0.0.0/8 (Linux answers
// on all of them), so that parallel runs and other tests on the machine
// do not collide on port 4791.
func loopbackPair() (string, string) {
	a, b, c := 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(250)
	return fmt.Sprintf("127.%d.%d.%d", a, b, c), fmt.Sprintf("127.%d.%d.%d", a, b, c+1)
}

// TestTwoProcesses builds the example and runs it as the README shows:
// a server process and a client process over kernel UDP sockets on
// loopback. The server must print the client's message, which reached its
// buffer only through the RDMA WRITE (the rkey travelled in the CM's
// private data).
func TestTwoProcesses(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("two loopback addresses need Linux (127.0.0.0/8 on lo)")
	}
	bin := filepath.Join(t.TempDir(), "rdmawrite")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srvAddr, cliAddr := loopbackPair()
	msg := fmt.Sprintf("hello from %s at %d", cliAddr, time.Now().UnixNano())

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, bin, "server", "--bind", srvAddr, "--timeout", "50s")
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening on "+srvAddr) {
		srv.Process.Kill()
		srv.Wait()
		t.Fatalf("server's first line %q, want \"listening on %s ...\" (stderr: %s)", lines.Text(), srvAddr, srvErr.String())
	}

	cli := exec.CommandContext(ctx, bin, "client", "--bind", cliAddr, "--server", srvAddr, "--msg", msg, "--timeout", "50s")
	cliOut, err := cli.CombinedOutput()
	if err != nil {
		srv.Process.Kill()
		srv.Wait()
		t.Fatalf("client: %v\n%s", err, cliOut)
	}
	if want := fmt.Sprintf("wrote %d bytes to %s:7174", len(msg), srvAddr); !strings.HasPrefix(string(cliOut), want) {
		t.Errorf("client printed %q, want it to start with %q", cliOut, want)
	}
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v (stderr: %s)", err, srvErr.String())
	}
	want := fmt.Sprintf("received %d bytes from %s: %q", len(msg), cliAddr, msg)
	if len(rest) != 1 || rest[0] != want {
		t.Errorf("server printed %q after listening, want [%q]", rest, want)
	}
}

// TestUsageErrors: bad arguments are refused with a message naming what
// is wrong, before any socket opens.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"serve"}, "usage"},
		{[]string{"server"}, "--bind"},
		{[]string{"server", "--bind", "x"}, "--bind"},
		{[]string{"server", "--bind", "127.0.0.1", "--port", "70000"}, "--port 70000"},
		{[]string{"client", "--bind", "127.0.0.1", "--server", "nowhere"}, "--server"},
		{[]string{"client", "--frobnicate"}, "frobnicate"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		err := run(tt.args, &out)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}
