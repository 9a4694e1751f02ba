//go:build unix

package cmtools

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRdmaServerClient: rocev2d rdma-server and rdma-client over loopback
// (one 16-byte SEND each way, both disconnect), and a client refused by a
// server that listens on another port: rdma_connect's "Connection
// refused" and "end -1" (exit 255), as librdmacm's rdma_client.
func TestRdmaServerClient(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &rdmaExListening, "rdma-server", "-s", "127.0.0.1", "-p", port, "--counters")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := runCmd(t, ctx, "rdma-client", "-s", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "--counters")
	s := srv.wait(t, 10*time.Second)
	if cli.code != 0 || s.code != 0 {
		t.Fatalf("exit: client %d, server %d\n--- client:\n%s%s--- server:\n%s%s", cli.code, s.code, cli.out, cli.errOut, s.out, s.errOut)
	}
	for _, r := range []struct {
		who string
		res cmResult
	}{{"rdma_client", cli}, {"rdma_server", s}} {
		if !strings.HasPrefix(r.res.out, r.who+": start\n") || !strings.Contains(r.res.out, r.who+": end 0\n") || r.res.errOut != "" {
			t.Errorf("%s output:\n%s%s", r.who, r.res.out, r.res.errOut)
		}
		for _, want := range []string{"rdma_sends", "rdma_recvs", "cm_established"} {
			if !hasCounter(r.res.out, want, "1") {
				t.Errorf("%s: no %q in its counters:\n%s", r.who, want, r.res.out)
			}
		}
	}

	srv = startCMServer(t, &rdmaExListening, "rdma-server", "--bind", "127.0.0.1", "-p", port)
	start := time.Now()
	cli = runCmd(t, ctx, "rdma-client", "-s", "127.0.0.1", "--bind", "127.0.0.2", "-p", strconv.Itoa(mustAtoi(port)+1))
	if d := time.Since(start); cli.code != 255 || !strings.Contains(cli.errOut, "rdma_connect: Connection refused") ||
		!strings.HasSuffix(cli.out, "rdma_client: end -1\n") || d > 2*time.Second {
		t.Errorf("refused client (%v): exit %d\n%s%s", d, cli.code, cli.out, cli.errOut)
	}
	if s := srv.wait(t, 0); s.code != 255 || !strings.Contains(s.errOut, "rdma_get_request") {
		t.Errorf("interrupted server: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
	var out, errb lockedBuffer
	if code := run(ctx, []string{"rdma-server", "-p", "x"}, &out, &errb); code != 1 {
		t.Errorf("bad usage: exit %d %s", code, errb.String())
	}
}

// TestUdaddy: rocev2d udaddy server and client over loopback — SIDR
// resolution, count datagrams each way with the sender's QP number as
// immediate data — and a client refused by a server on another port
// (SIDR_REP status 1, "unsupported": udaddy's exit status 1).
func TestUdaddy(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	for _, tc := range []struct{ count, size int }{{10, 100}, {50, 1024}, {1, 1}} {
		port := cmPort()
		count, size := strconv.Itoa(tc.count), strconv.Itoa(tc.size)
		srv := startCMServer(t, &udaddyListening, "udaddy", "-b", "127.0.0.1", "--port", port, "-C", count, "-S", size, "--counters")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cli := runCmd(t, ctx, "udaddy", "-s", "127.0.0.1", "-b", "127.0.0.2", "--port", port, "-C", count, "-S", size, "--counters")
		cancel()
		s := srv.wait(t, 10*time.Second)
		if cli.code != 0 || s.code != 0 {
			t.Fatalf("-C %d -S %d: exit client %d server %d\n--- client:\n%s%s--- server:\n%s%s", tc.count, tc.size, cli.code, s.code, cli.out, cli.errOut, s.out, s.errOut)
		}
		const wantCli = "udaddy: starting client\nudaddy: connecting\ninitiating data transfers\nreceiving data transfers\ndata transfers complete\ntest complete\nreturn status 0\n"
		const wantSrv = "udaddy: starting server\nreceiving data transfers\nsending replies\ndata transfers complete\ntest complete\nreturn status 0\n"
		if got := withoutCounters(cli.out); got != wantCli {
			t.Errorf("client output %q", got)
		}
		if got := withoutCounters(s.out); got != wantSrv {
			t.Errorf("server output %q", got)
		}
		for _, out := range []string{cli.out, s.out} {
			for _, want := range []string{"rdma_sends", "rdma_recvs"} {
				if !hasCounter(out, want, count) {
					t.Errorf("-C %d: no %q in:\n%s", tc.count, want, out)
				}
			}
		}
	}
	port := cmPort()
	srv := startCMServer(t, &udaddyListening, "udaddy", "-b", "127.0.0.1", "--port", port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := runCmd(t, ctx, "udaddy", "-s", "127.0.0.1", "-b", "127.0.0.2", "--port", strconv.Itoa(mustAtoi(port)+1))
	if cli.code != 1 || !strings.Contains(cli.out, "udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1\n") ||
		!strings.HasSuffix(cli.out, "return status 1\n") || !strings.Contains(cli.errOut, "refused the resolution") {
		t.Errorf("refused client: exit %d\n%s%s", cli.code, cli.out, cli.errOut)
	}
	srv.wait(t, 0)
}

// withoutCounters drops the --counters blocks of an output.
func withoutCounters(out string) string {
	var b strings.Builder
	skip := false
	for _, l := range strings.SplitAfter(out, "\n") {
		switch {
		case strings.HasPrefix(l, "counters ") || strings.HasPrefix(l, "cm "):
			skip = true
			continue
		case skip && strings.HasPrefix(l, "  "):
			continue
		}
		skip = false
		b.WriteString(l)
	}
	return b.String()
}

// hasCounter reports whether out has a -v counter line "  name   value"
// (whatever the width of the name column).
func hasCounter(out, name, value string) bool {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name && f[1] == value {
			return true
		}
	}
	return false
}

// Bad durations of rdma-server, rdma-client and udaddy are usage errors
// naming the flag (exit 1, as the real tools' bad usage), not values
// quietly taken: a negative timeout or idle time, a negative or
// sub-millisecond probe timeout (which dropped a live peer at once).
func TestRdmaExDurationFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"rdma-server", "--bind", "127.0.0.1", "--timeout=-1s"}, "--timeout=-1s"},
		{[]string{"rdma-client", "-s", "127.0.0.1", "--idle=-2s"}, "--idle=-2s"},
		{[]string{"rdma-server", "--bind", "127.0.0.1", "--keepalive-timeout=-5s"}, "--keepalive-timeout=-5s"},
		{[]string{"rdma-server", "--bind", "127.0.0.1", "--keepalive-timeout=1ns"}, "--keepalive-timeout=1ns"},
		{[]string{"udaddy", "-s", "127.0.0.1", "--timeout=-1s"}, "--timeout=-1s"},
	} {
		var out, errb lockedBuffer
		if code := run(context.Background(), tc.args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("%q: exit %d, stderr %q, want exit 1 naming %q", tc.args, code, errb.String(), tc.msg)
		}
	}
}
