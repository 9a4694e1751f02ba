//go:build unix

package pingpong

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestIdleTimeout: a side whose peer stops sending gives up once nothing
// has arrived for --idle-timeout and says why, where the tools wait for
// ever (each case bounds the run with --timeout 30s: a side that still
// hangs fails it with "--timeout 30s reached").
func TestIdleTimeout(t *testing.T) {
	t.Run("pingpong/fewer iterations on the server", func(t *testing.T) {
		srv, clnt := runPPPair(t, ppRC, []string{"--timeout", "30s", "--idle-timeout", "300ms"}, []string{"-n", "5"}, []string{"-n", "10"})
		checkRun(t, "server", srv, 4096, 5)
		if clnt.code != cli.ExitFail || !strings.Contains(clnt.err, "nothing arrived from the peer for 300ms (--idle-timeout)") ||
			!strings.Contains(clnt.err, "both sides need the same -n 10") || !strings.Contains(clnt.err, "of 10") {
			t.Errorf("client: exit %d, stderr %q", clnt.code, clnt.err)
		}
	})
	t.Run("ud-pingpong/larger -s on the client", func(t *testing.T) {
		// The server's receive buffer is too short for the client's first
		// datagram: it drops it (ud_msgs_dropped) and neither side hears
		// from the other again.
		srv, clnt := runPPPair(t, ppUD, []string{"--timeout", "30s", "--idle-timeout", "300ms", "-n", "5"}, []string{"-s", "256"}, []string{"-s", "512"})
		for _, s := range []struct {
			side string
			r    ppResult
			want string
		}{{"server", srv, "ud_msgs_dropped: the peer's -s is larger"}, {"client", clnt, "UD does not retransmit"}} {
			if s.r.code != cli.ExitFail || !strings.Contains(s.r.err, "nothing arrived from the peer") || !strings.Contains(s.r.err, s.want) {
				t.Errorf("%s: exit %d, stderr %q (want %q)", s.side, s.r.code, s.r.err, s.want)
			}
		}
	})
}

// TestIdleTimeoutFlag: --idle-timeout's value and the default it replaces
// (longer on RC when the QP timeout makes the peer's retries longer).
func TestIdleTimeoutFlag(t *testing.T) {
	for _, tc := range []struct {
		kind ppKind
		args []string
		want time.Duration
	}{
		{ppRC, nil, defaultIdle},
		{ppUD, []string{"--qp-timeout", "25"}, defaultIdle},
		{ppRC, []string{"--qp-timeout", "20"}, 2 * 8 * 4096 * time.Nanosecond << 20},
		{ppSRQ, []string{"--qp-timeout", "20"}, 2 * 8 * 4096 * time.Nanosecond << 20},
		{ppRC, []string{"--qp-timeout", "20", "--idle-timeout", "1s"}, time.Second},
		{ppUC, []string{"--idle-timeout", "0"}, 0},
	} {
		c, err := parsePPFlags(tc.args, tc.kind)
		if err != nil {
			t.Fatalf("%v %v: %v", tc.kind, tc.args, err)
		}
		if got := c.idleTimeout(); got != tc.want {
			t.Errorf("%v %v: idle timeout %v, want %v", tc.kind, tc.args, got, tc.want)
		}
	}
	r := runKind(context.Background(), ppRC, "--idle-timeout", "-1s")
	if r.code != cli.ExitUsage || !strings.Contains(r.err, "-idle-timeout") {
		t.Errorf("--idle-timeout -1s: exit %d, stderr %q", r.code, r.err)
	}
}

// TestFailedStatusHint: a ping-pong against a peer with another -s fails
// as the tool does ("failed status ...") and then says which flags differ.
func TestFailedStatusHint(t *testing.T) {
	srv, clnt := runPPPair(t, ppRC, []string{"--timeout", "30s", "-n", "5"}, []string{"-s", "4096"}, []string{"-s", "8192"})
	if srv.code != cli.ExitFail || !strings.Contains(srv.err, "failed status local length error (1) for wr_id 1") ||
		!strings.Contains(srv.err, "longer than this side's -s 4096: both sides need the same -s") {
		t.Errorf("server: exit %d, stderr %q", srv.code, srv.err)
	}
	if clnt.code != cli.ExitFail || !strings.Contains(clnt.err, "failed status remote invalid request error (9)") ||
		!strings.Contains(clnt.err, "both sides need the same -s and -m") {
		t.Errorf("client: exit %d, stderr %q", clnt.code, clnt.err)
	}
}
