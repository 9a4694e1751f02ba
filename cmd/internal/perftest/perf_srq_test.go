//go:build unix

package perftest

import (
	"strings"
	"sync"
	"testing"
)

// TestPerfUseSRQ: --use-srq (SEND tests only, as perftest) gives each side
// one shared receive queue; a send-bw run over 4 QPs and a send-lat run
// complete every iteration with their receives taken from it, the data
// checked, and the header says "Using SRQ : ON".
func TestPerfUseSRQ(t *testing.T) {
	for _, b := range []struct {
		test string
		args []string
		want string
	}{
		{"write-bw", []string{"--use-srq"}, "--use-srq: a shared receive queue is only available in the SEND tests"},
		{"send-bw", []string{"--use-srq", "-q", "8", "-r", "4"}, "--use-srq with -q 8: the SRQ depth (-r 4) must be at least the number of QPs"},
	} {
		code, _, e := runIn(t, append([]string{b.test}, b.args...)...)
		if code != 2 || !strings.Contains(e, b.want) {
			t.Errorf("%s %v: exit %d, stderr %q, want exit 2 with %q", b.test, b.args, code, e, b.want)
		}
	}
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	var mu sync.Mutex
	srqs := 0
	perfAfterRun = func(s *perfSide) {
		mu.Lock()
		defer mu.Unlock()
		if s.SRQ != nil {
			srqs++
		}
	}
	defer func() { perfAfterRun = nil }()
	for _, b := range []struct {
		test  string
		flags []string
		iters string
	}{
		{"send-bw", []string{"--use-srq", "-q", "4", "-n", "500", "-s", "1024", "-r", "64", "--check"}, "2000"},
		{"send-lat", []string{"--use-srq", "-n", "100", "-s", "64", "--check"}, "100"},
	} {
		srqs = 0
		srv, cli := runPerfPair(t, b.test, b.flags...)
		mustPass(t, srv, cli)
		for who, out := range map[string]string{"client": cli.out, "server": srv.out} {
			if !strings.Contains(out, "Using SRQ      : ON\n") || !strings.Contains(out, " data check: ok") {
				t.Errorf("%s %s: no \"Using SRQ : ON\" or data check:\n%s", b.test, who, out)
			}
		}
		rows := resultRows(srv.out + cli.out)
		if len(rows) == 0 || rows[0][1] != b.iters {
			t.Errorf("%s: rows %v, want %s iterations", b.test, rows, b.iters)
		}
		if srqs != 2 {
			t.Errorf("%s: %d sides ran with an SRQ, want 2", b.test, srqs)
		}
	}
}
