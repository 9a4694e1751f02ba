//go:build unix

package pingpong

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// The harness every ping-pong test runs on: the commands in process, a
// server and a client over loopback, and the checks of their output.

// ppResult is one run of a command: exit status, stdout and stderr.
type ppResult struct {
	code     int
	out, err string
}

// runKind runs the command of kind in process with args.
func runKind(ctx context.Context, kind ppKind, args ...string) ppResult {
	var out, errb bytes.Buffer
	code := runPPCmd(ctx, args, kind, &out, &errb)
	return ppResult{code, out.String(), errb.String()}
}

// freeTCPPort is clitest.FreeTCPPort.
func freeTCPPort(t *testing.T) int { t.Helper(); return clitest.FreeTCPPort(t) }

// runPPPair runs the command of kind as a server on 127.0.0.2 (args +
// srvArgs) and a client on 127.0.0.1 (args + cliArgs), retrying while UDP
// 4791 on those addresses is busy (other tests of the repository use
// them), and returns both results.
func runPPPair(t *testing.T, kind ppKind, args, srvArgs, cliArgs []string) (srv, clnt ppResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		port := strconv.Itoa(freeTCPPort(t))
		sctx, scancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv = runKind(sctx, kind, append(append([]string{"-p", port, "--bind", "127.0.0.2"}, args...), srvArgs...)...)
		}()
		// The client retries the connection until the server listens.
		for deadline := time.Now().Add(10 * time.Second); ; {
			clnt = runKind(ctx, kind, append(append(append([]string{"-p", port, "--bind", "127.0.0.1"}, args...), cliArgs...), "127.0.0.2")...)
			if clnt.code == 0 || !strings.Contains(clnt.err, "couldn't connect") || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if clnt.code != 0 && strings.Contains(clnt.err, "couldn't connect") {
			scancel() // let the server give up
		}
		wg.Wait()
		scancel()
		if !strings.Contains(srv.err+clnt.err, "address already in use") || attempt == 5 {
			return srv, clnt
		}
		t.Logf("UDP 4791 busy, retrying: %s%s", srv.err, clnt.err)
		time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
	}
}

var (
	reBytes = regexp.MustCompile(`(?m)^(\d+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec$`)
	reIters = regexp.MustCompile(`(?m)^(\d+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter$`)
	// reAddr matches an address line of any of the tools: ibv_rc_pingpong's
	// (also uc and srq: ", GID") and ibv_ud_pingpong's local one (": GID").
	reAddr = regexp.MustCompile(`(?m)^  (local|remote) address: +LID 0x0000, QPN (0x[0-9a-f]{6}), PSN (0x[0-9a-f]{6})(,|:) GID (::ffff:127\.0\.0\.[12])$`)
)

// checkRun checks one side's run of iters exchanges of size bytes: exit
// status 0 and the two result lines with the right counts.
func checkRun(t *testing.T, side string, r ppResult, size, iters int) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", side, r.code, r.out, r.err)
	}
	mb, mi := reBytes.FindStringSubmatch(r.out), reIters.FindStringSubmatch(r.out)
	if mb == nil || mi == nil {
		t.Fatalf("%s: result lines missing:\n%s", side, r.out)
	}
	if want := strconv.Itoa(2 * size * iters); mb[1] != want {
		t.Errorf("%s: %s bytes, want %s", side, mb[1], want)
	}
	if want := strconv.Itoa(iters); mi[1] != want {
		t.Errorf("%s: %s iters, want %s", side, mi[1], want)
	}
}

// addrLines returns the local and remote address lines' "QPN PSN GID" in
// order, whether every local line came before every remote one, and
// whether each line has its tool's separator before the GID (":" only on
// ibv_ud_pingpong's local line).
func addrLines(kind ppKind, out string) (local, remote []string, ordered, sepOK bool) {
	ordered, sepOK = true, true
	for _, m := range reAddr.FindAllStringSubmatch(out, -1) {
		v := m[2] + " " + m[3] + " " + m[5]
		wantSep := ","
		if kind == ppUD && m[1] == "local" {
			wantSep = ":"
		}
		sepOK = sepOK && m[4] == wantSep
		if m[1] == "local" {
			if len(remote) > 0 {
				ordered = false
			}
			local = append(local, v)
		} else {
			remote = append(remote, v)
		}
	}
	return local, remote, ordered, sepOK
}

// checkAddrs checks both sides' address lines: qps of each, local before
// remote, the tool's format, and each side's remote lines the other's
// local ones, in order.
func checkAddrs(t *testing.T, kind ppKind, srv, clnt ppResult, qps int) {
	t.Helper()
	sl, sr, so, ss := addrLines(kind, srv.out)
	cl, cr, co, cs := addrLines(kind, clnt.out)
	for _, s := range []struct {
		side               string
		loc, rem           []string
		ordered, separator bool
		out                string
	}{{"server", sl, sr, so, ss, srv.out}, {"client", cl, cr, co, cs, clnt.out}} {
		if len(s.loc) != qps || len(s.rem) != qps || !s.ordered || !s.separator {
			t.Errorf("%s: %d local and %d remote address lines (in order: %v, format: %v), want %d each in %v's format:\n%s",
				s.side, len(s.loc), len(s.rem), s.ordered, s.separator, qps, kind, s.out)
		}
	}
	if strings.Join(sl, ";") != strings.Join(cr, ";") || strings.Join(cl, ";") != strings.Join(sr, ";") {
		t.Errorf("address lines do not match:\nserver:\n%s\nclient:\n%s", srv.out, clnt.out)
	}
}

// counterValue is a counter of a -v block, 0 when it is not printed.
func counterValue(out, name string) int64 {
	m := regexp.MustCompile(`(?m)^  ` + name + ` +(\d+)$`).FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}
