package soak

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// TestMain lets soak start this test binary as its children (rocev2d
// soak-server and soak-client); the tests themselves run holding the
// command packages' loopback lock (clitest.Main: they open UDP 4791 on
// 127.0.0.1 and 127.0.0.2), which the children must not wait for.
func TestMain(m *testing.M) {
	if os.Getenv(soakChildEnv) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(clitest.Main(m))
}

// TestSoak runs rocev2d soak: clients killed and restarted, the server
// restarted, 1 % loss; every byte checked and nothing may grow.
func TestSoak(t *testing.T) {
	d := 45 * time.Second
	if testing.Short() {
		d = 8 * time.Second
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"soak", "--duration", d.String(), "--clients", "3", "--churn", "1s"}, &out, &errb)
	t.Log(out.String())
	if code != cli.ExitOK {
		t.Fatalf("soak exit %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "PASS: every byte checked") {
		t.Fatal("no PASS line")
	}
}

func TestSoakMessages(t *testing.T) {
	scratch := make([]byte, soakMaxMsg)
	for k := uint64(0); k < 100; k++ {
		n := soakLen(1, 2, k)
		if n < 8 || n > soakMaxMsg {
			t.Fatalf("length %d", n)
		}
		b := make([]byte, n)
		soakFill(b, 1, 2, k)
		if !soakCheck(b, 1, 2, k, scratch) {
			t.Fatal("a message does not check against itself")
		}
		b[n-1] ^= 1
		if soakCheck(b, 1, 2, k, scratch) {
			t.Fatal("a flipped bit passed")
		}
		if soakCheck(b[:n-1], 1, 2, k, scratch) {
			t.Fatal("a short message passed")
		}
	}
	s, ok := parseSoakStatus(soakStatus{goroutines: 3, heap: 4, fds: 5, qps: 6, conns: 7, bytes: 8}.line())
	if !ok || s != (soakStatus{goroutines: 3, heap: 4, fds: 5, qps: 6, conns: 7, bytes: 8}) {
		t.Fatalf("status round trip: %+v", s)
	}
}

// TestPrintByReason: the summary's per-reason lists, sorted by reason,
// and nothing for an empty one.
func TestPrintByReason(t *testing.T) {
	var b bytes.Buffer
	printByReason(&b, "failed connects by reason:", map[string]int{"timeout": 3, "refused": 12})
	printByReason(&b, "connections ended by reason:", nil)
	if want := "failed connects by reason:\n     12  refused\n      3  timeout\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

// TestSoakFlags: zero or negative durations and counts are refused naming
// the flag (a --duration=0 soak ran and ended "FAIL: 0 connections");
// the children's flags as the parent passes them parse.
func TestSoakFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--duration=0"}, "--duration=0s"},
		{[]string{"--duration=-1s"}, "--duration=-1s"},
		{[]string{"--churn=-1s"}, "--churn=-1s"},
		{[]string{"--server-restarts=-1"}, "--server-restarts -1"},
		{[]string{"--keepalive=0"}, "--keepalive=0s"},
		{[]string{"--keepalive-timeout=-1s"}, "--keepalive-timeout=-1s"},
		{[]string{"--port=0"}, "--port 0"},
	} {
		if _, err := parseSoakFlags("soak", tc.args); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%q: %v, want an error naming %q", tc.args, err, tc.msg)
		}
	}
	c, err := parseSoakFlags("soak", []string{"--churn=0"})
	if err != nil {
		t.Fatalf("--churn=0 (never): %v", err)
	}
	if _, err := parseSoakFlags("soak-server", append([]string{"--addr", "127.1.2.1"}, c.childArgs()...)); err != nil {
		t.Errorf("the children's flags: %v", err)
	}
	if _, err := parseSoakFlags("soak-client", append([]string{"--addr", "127.1.2.5", "--server", "127.1.2.1"}, c.childArgs()...)); err != nil {
		t.Errorf("the children's flags: %v", err)
	}
	// A child run by hand without its addresses is told which it needs
	// (it said "cannot open a RoCEv2 socket on invalid AddrPort").
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"soak-server", nil, "--addr (the server's address) is required; soak-server is started by `rocev2d soak`"},
		{"soak-client", []string{"--addr", "127.1.2.5"}, "--addr (the client's address) and --server (the server's) are required"},
		{"soak-client", []string{"--server", "127.1.2.1"}, "--addr (the client's address) and --server (the server's) are required"},
		{"soak-client", []string{"--addr", "127.1.2.5", "--server", "127.1.2.1:7900"}, `--server "127.1.2.1:7900": give the address alone; --port sets the port`},
	} {
		if _, err := parseSoakFlags(tc.name, tc.args); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s %q: %v, want an error naming %q", tc.name, tc.args, err, tc.msg)
		}
	}
}

// TestSoakInterruptedWhileReaping: a SIGINT after --duration, while the
// soak waits for the server to give back what the killed clients held,
// ends the wait and says INTERRUPTED, exit 1. It went unnoticed: the soak
// waited for the reaping and printed PASS.
func TestSoakInterruptedWhileReaping(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var out, errb bytes.Buffer
	// The signal comes when the run's clients have been killed.
	soakReapHook = func() { cancel(errors.New("interrupt signal received")) }
	defer func() { soakReapHook = nil }()
	code := run(ctx, []string{"soak", "--duration", "2s", "--clients", "2", "--churn", "0", "--server-restarts", "0", "--loss", "0"}, &out, &errb)
	t.Log(out.String(), errb.String())
	if code != cli.ExitFail {
		t.Errorf("soak interrupted while reaping: exit %d, want %d", code, cli.ExitFail)
	}
	if strings.Contains(out.String(), "PASS") {
		t.Error("a soak interrupted while reaping printed PASS")
	}
	if !strings.Contains(out.String(), "INTERRUPTED after the 2s run, while waiting") || !strings.Contains(out.String(), "(interrupt signal received)") {
		t.Error("a soak interrupted while reaping does not say so")
	}
}

// TestSoakInterrupted: a soak cut short (SIGINT: its context cancelled)
// before its --duration says so and exits 1. It printed "PASS: every byte
// checked, nothing grew" for the part that ran, exit 0.
func TestSoakInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var out, errb bytes.Buffer
	stop := time.AfterFunc(3*time.Second, func() { cancel(errors.New("interrupt signal received")) })
	defer stop.Stop()
	code := run(ctx, []string{"soak", "--duration", "10m", "--clients", "2", "--churn", "0", "--server-restarts", "0", "--loss", "0"}, &out, &errb)
	t.Log(out.String(), errb.String())
	if code != cli.ExitFail {
		t.Errorf("interrupted soak exit %d, want %d", code, cli.ExitFail)
	}
	if strings.Contains(out.String(), "PASS") {
		t.Error("an interrupted soak printed PASS")
	}
	if !strings.Contains(out.String(), "INTERRUPTED after") || !strings.Contains(out.String(), "of 10m0s (interrupt signal received)") {
		t.Error("an interrupted soak does not say it was interrupted, after how long of what, and why")
	}
}
