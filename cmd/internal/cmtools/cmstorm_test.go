//go:build unix

package cmtools

import (
	"context"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

var reCmtimeTableRow = regexp.MustCompile(`(?m)^(create id|bind addr|resolve addr|resolve route|create qp|connect|disconnect|destroy) *:( +[0-9.]+){4}$`)

// TestCmtime: rocev2d cmtime's client connects -c connections at once to
// its server over loopback and disconnects them all: cmtime's step lines
// and table (8 rows with -b), the server's count of connections served
// and disconnected by their client, no QP left on either side.
func TestCmtime(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	defer checkGoroutines(t, runtime.NumGoroutine())
	port := cmPort()
	srv := startCMServer(t, &cmtimeListening, "cmtime", "-b", "127.0.0.1", "-p", port, "--counters")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const conns = 300
	cli := runCmd(t, ctx, "cmtime", "-s", "127.0.0.1", "-b", "127.0.0.2", "-p", port, "-c", strconv.Itoa(conns), "--counters")
	// The server serves until interrupted: every client disconnect
	// has reached it (the client waited for each DREP).
	s := srv.wait(t, 0)
	if cli.code != 0 || s.code != 0 {
		t.Fatalf("exit: client %d, server %d\n--- client:\n%s%s--- server:\n%s%s", cli.code, s.code, cli.out, cli.errOut, s.out, s.errOut)
	}
	want := "creating id\nbinding source address\nresolving address\nresolving route\ncreating qp\nconnecting\ndisconnecting\ndestroying id\n" +
		"step              total ms     max ms     min us  us / conn\n"
	if !strings.HasPrefix(cli.out, want) {
		t.Errorf("client output:\n%s", cli.out)
	}
	if n := len(reCmtimeTableRow.FindAllString(cli.out, -1)); n != 8 {
		t.Errorf("client table has %d rows, want 8:\n%s", n, cli.out)
	}
	if !strings.Contains(s.out, "cmtime: served "+strconv.Itoa(conns)+" connections, "+strconv.Itoa(conns)+" disconnected by their client\n") ||
		!strings.Contains(s.out, "cmtime: open at exit: 0 QPs, ") {
		t.Errorf("server output:\n%s%s", s.out, s.errOut)
	}
	for _, r := range []struct {
		who string
		out string
	}{{"client", cli.out}, {"server", s.out}} {
		for _, c := range []string{"cm_established", "cm_disconnected"} {
			if !hasCounter(r.out, c, strconv.Itoa(conns)) {
				t.Errorf("%s: %s is not %d:\n%s", r.who, c, conns, r.out)
			}
		}
		for _, c := range []string{"cm_unknown", "cm_shed", "cm_backlog_dropped", "cm_acceptq_dropped"} {
			if !hasCounter(r.out, c, "0") {
				t.Errorf("%s: %s is not 0:\n%s", r.who, c, r.out)
			}
		}
		// A MAD goes again after the 1 s response timeout: a stall that
		// long of a loaded -race run may cause a few; a storm of them
		// (every REP resent, as before the REP waited for the REQ's
		// response time) may not.
		if n, ok := counterValue(r.out, "cm_retransmits"); !ok || n > conns/10 {
			t.Errorf("%s: cm_retransmits %d (found %v), want at most %d:\n%s", r.who, n, ok, conns/10, r.out)
		} else if n > 0 {
			t.Logf("%s: cm_retransmits %d", r.who, n)
		}
	}
}

// counterValue returns the value of counter name in a --counters listing.
func counterValue(out, name string) (int, bool) {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			n, err := strconv.Atoi(f[1])
			return n, err == nil
		}
	}
	return 0, false
}

// TestCmtimeRefused: a cmtime client whose server does not listen prints
// cmtime's event line per connection (REJ, invalid service ID: 8) and
// exits 255.
func TestCmtimeRefused(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &cmtimeListening, "cmtime", "-b", "127.0.0.1", "-p", port)
	defer srv.wait(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := runCmd(t, ctx, "cmtime", "-s", "127.0.0.1", "-b", "127.0.0.2", "-p", strconv.Itoa(mustAtoi(port)+1), "-c", "3")
	if cli.code != 255 || strings.Count(cli.out, "event: RDMA_CM_EVENT_REJECTED, error: 8\n") != 3 ||
		!strings.Contains(cli.errOut, "3 of 3 connections failed") {
		t.Errorf("exit %d\n%s%s", cli.code, cli.out, cli.errOut)
	}
}

// TestUcmatose: rocev2d ucmatose server and client over loopback with
// several connections, message counts and sizes (multi-packet SENDs, no
// messages at all): both sides' cmatose lines in order and "return status
// 0", every connection established and disconnected by the server.
func TestUcmatose(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	defer checkGoroutines(t, runtime.NumGoroutine())
	for _, tc := range []struct{ conns, count, size int }{{1, 10, 100}, {10, 50, 8192}, {3, 0, 100}, {4, 5, 0}} {
		port := cmPort()
		args := []string{"-p", port, "-c", strconv.Itoa(tc.conns), "-C", strconv.Itoa(tc.count), "-S", strconv.Itoa(tc.size), "--counters"}
		srv := startCMServer(t, &ucmatoseListening, append([]string{"ucmatose", "-b", "127.0.0.1"}, args...)...)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cli := runCmd(t, ctx, append([]string{"ucmatose", "-s", "127.0.0.1", "-b", "127.0.0.2"}, args...)...)
		cancel()
		s := srv.wait(t, 20*time.Second)
		if cli.code != 0 || s.code != 0 {
			t.Fatalf("%+v: exit client %d server %d\n--- client:\n%s%s--- server:\n%s%s", tc, cli.code, s.code, cli.out, cli.errOut, s.out, s.errOut)
		}
		wantCli := "cmatose: starting client\ncmatose: connecting\nreceiving data transfers\nsending replies\ndata transfers complete\ntest complete\nreturn status 0\n"
		wantSrv := "cmatose: starting server\ninitiating data transfers\ncompleting sends\nreceiving data transfers\ndata transfers complete\ncmatose: disconnecting\ndisconnected\ntest complete\nreturn status 0\n"
		if tc.count == 0 || tc.size == 0 {
			wantCli = "cmatose: starting client\ncmatose: connecting\ntest complete\nreturn status 0\n"
			wantSrv = "cmatose: starting server\ncmatose: disconnecting\ndisconnected\ntest complete\nreturn status 0\n"
		}
		if got := withoutCounters(cli.out); got != wantCli {
			t.Errorf("%+v: client output %q", tc, got)
		}
		if got := withoutCounters(s.out); got != wantSrv {
			t.Errorf("%+v: server output %q", tc, got)
		}
		n := strconv.Itoa(tc.conns)
		msgs := strconv.Itoa(tc.conns * tc.count)
		if tc.size == 0 {
			msgs = "0"
		}
		for _, r := range []struct{ who, out string }{{"client", cli.out}, {"server", s.out}} {
			for _, c := range [][2]string{{"cm_established", n}, {"cm_disconnected", n}, {"cm_retransmits", "0"}, {"cm_unknown", "0"},
				{"rdma_sends", msgs}, {"rdma_recvs", msgs}} {
				if c[1] == "0" && !regexp.MustCompile(`(?m)^\s+`+c[0]+`\s`).MatchString(r.out) {
					continue // zero counters of the device are not printed
				}
				if !hasCounter(r.out, c[0], c[1]) {
					t.Errorf("%+v: %s: %s is not %s:\n%s", tc, r.who, c[0], c[1], r.out)
				}
			}
		}
		if !hasCounter(s.out, "cm_ended_local_close", n) || !hasCounter(cli.out, "cm_ended_peer_disconnect", n) {
			t.Errorf("%+v: not every connection was disconnected by the server:\n%s\n%s", tc, s.out, cli.out)
		}
	}
}

// checkGoroutines fails the test when, once the commands have returned,
// more goroutines run than before it (within 5 s: timers and the
// devices' goroutines end asynchronously).
func checkGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the run, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestUcmatoseExtraRejected: a ucmatose server of -c 1 refuses a second
// connection request as cmatose's connect_handler does — rdma_reject,
// which Linux's rdma_cm sends as REJ "consumer reject" (28) — printing
// "cmatose: failing connection request"; the client reports status 28.
// Before, the server closed its listener after -c connections and the
// second request got REJ "invalid service ID" (8). The client, one
// connection refused, sends no replies (as cmatose), so the server waits
// for them until the test interrupts it.
func TestUcmatoseExtraRejected(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &ucmatoseListening, "ucmatose", "-b", "127.0.0.1", "-p", port, "-c", "1", "-C", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan cmResult, 1)
	go func() {
		done <- runCmd(t, ctx, "ucmatose", "-s", "127.0.0.1", "-b", "127.0.0.2", "-p", port, "-c", "2", "-C", "1")
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(srv.out.String(), "failing connection request") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	s := srv.wait(t, 0) // interrupt: it waits for replies that do not come
	cli := <-done
	if cli.code != 28 || !strings.Contains(cli.out, "cmatose: event: RDMA_CM_EVENT_REJECTED, error: 28\n") ||
		!strings.Contains(s.out, "cmatose: failing connection request\n") {
		t.Errorf("exit client %d server %d\n--- client:\n%s%s--- server:\n%s%s", cli.code, s.code, cli.out, cli.errOut, s.out, s.errOut)
	}
}
