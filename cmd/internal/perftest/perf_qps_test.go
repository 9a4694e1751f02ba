//go:build unix

package perftest

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// reQPNLine matches perftest's address lines' side and QPN.
var reQPNLine = regexp.MustCompile(`(?m)^ (local|remote) address: LID \S+ QPN (\S+) `)

// perfQPNs returns the QPNs of the local and of the remote address lines,
// in order.
func perfQPNs(out string) (local, remote []string) {
	for _, m := range reQPNLine.FindAllStringSubmatch(out, -1) {
		if m[1] == "local" {
			local = append(local, m[2])
		} else {
			remote = append(remote, m[2])
		}
	}
	return local, remote
}

// TestPerfQPs runs the bandwidth tests with -q 1, 2 and 8 between two
// rocev2d instances with --check (every QP's regions verified on both
// sides): both print "Number of qps", one address line per QP each way
// (the client's local QPNs are the server's remote ones, in order, all
// distinct), and the result counts -n iterations on every QP.
func TestPerfQPs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	tests := []struct {
		test  string
		flags []string
		rows  int
		size  int
	}{
		{"write-bw", []string{"-s", "4096"}, 1, 4096},
		{"read-bw", []string{"-s", "5000"}, 1, 5000},
		{"send-bw", []string{"-s", "3000", "-r", "16"}, 1, 3000},
		{"atomic-bw", nil, 1, 8},
		{"atomic-bw", []string{"-A", "CMP_AND_SWAP"}, 1, 8},
	}
	for _, tt := range tests {
		for _, q := range []int{1, 2, 8} {
			t.Run(fmt.Sprintf("%s%s/q%d", tt.test, strings.Join(tt.flags, ""), q), func(t *testing.T) {
				n := 40
				flags := append([]string{"-q", strconv.Itoa(q), "-n", strconv.Itoa(n), "-t", "16", "--check", "--timeout", "60s"}, tt.flags...)
				srv, cli := runPerfPairSides(t, tt.test, flags, flags)
				checkQPRun(t, true, q, n, tt.size, tt.rows, srv, cli)
			})
		}
	}
}

// TestPerfQPsModes: -q with -a (every size on every QP), with -b (both
// sides run every QP), with -D and with -R (a connection per QP).
func TestPerfQPsModes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	tests := []struct {
		test  string
		flags []string
		rows  int
		size  int
		n     int
	}{
		{"write-bw", []string{"-a", "-n", "5", "--check"}, 23, 0, 5},
		{"send-bw", []string{"-a", "-n", "5", "-r", "8", "--check"}, 23, 0, 5},
		{"write-bw", []string{"-b", "-s", "2048", "-n", "30", "--check"}, 1, 2048, 30},
		{"read-bw", []string{"-b", "-s", "2048", "-n", "30", "--check"}, 1, 2048, 30},
		{"send-bw", []string{"-b", "-s", "2048", "-n", "30", "-r", "16", "--check"}, 1, 2048, 30},
		{"write-bw", []string{"-D", "1", "-s", "2048"}, 1, 2048, -1},
		// -R: one rdma_cm connection per QP.
		{"write-bw", []string{"-R", "-s", "2048", "-n", "30", "--check"}, 1, 2048, 30},
		{"read-bw", []string{"-R", "-s", "2048", "-n", "30", "--check"}, 1, 2048, 30},
		{"send-bw", []string{"-R", "-s", "2048", "-n", "30", "-r", "16", "--check"}, 1, 2048, 30},
		{"atomic-bw", []string{"-R", "-n", "30", "--check"}, 1, 8, 30},
	}
	for _, tt := range tests {
		t.Run(tt.test+strings.Join(tt.flags, ""), func(t *testing.T) {
			q := 3
			flags := append([]string{"-q", strconv.Itoa(q), "--timeout", "60s"}, tt.flags...)
			srv, cli := runPerfPairSides(t, tt.test, flags, flags)
			checkQPRun(t, slices.Contains(tt.flags, "--check"), q, tt.n, tt.size, tt.rows, srv, cli)
		})
	}
}

// checkQPRun checks both sides of a -q run; n < 0: duration mode (any
// count above 0); check: both ran --check.
func checkQPRun(t *testing.T, check bool, q, n, size, rows int, srv, cli perfOut) {
	t.Helper()
	mustPass(t, srv, cli)
	cl, cr := perfQPNs(cli.out)
	sl, sr := perfQPNs(srv.out)
	if len(cl) != q || len(cr) != q || strings.Join(cl, " ") != strings.Join(sr, " ") || strings.Join(cr, " ") != strings.Join(sl, " ") {
		t.Errorf("address lines: client local %v remote %v, server local %v remote %v; want %d each, crossed", cl, cr, sl, sr, q)
	}
	for _, qpns := range [][]string{cl, sl} {
		distinct := map[string]bool{}
		for _, v := range qpns {
			distinct[v] = true
		}
		if len(distinct) != q {
			t.Errorf("%d distinct QPNs among %v, want %d", len(distinct), qpns, q)
		}
	}
	for _, side := range []struct {
		name string
		o    perfOut
	}{{"server", srv}, {"client", cli}} {
		if want := fmt.Sprintf(" Number of qps   : %d\t", q); !strings.Contains(side.o.out, want) {
			t.Errorf("%s: no %q line:\n%s", side.name, want, side.o.out)
		}
		got := resultRows(side.o.out)
		want, last := rows, 0
		if rows > 1 && side.name == "server" && !strings.Contains(side.o.out, "Bidirectional") {
			// -a: a server prints the client's last report, or its own
			// measurement of the last size.
			want, last = 1, rows-1
		}
		if len(got) != want {
			t.Fatalf("%s printed %d result rows, want %d:\n%s", side.name, len(got), want, side.o.out)
		}
		for i, r := range got {
			sz := size
			if sz == 0 {
				sz = 2 << (i + last)
			}
			it, _ := strconv.Atoi(r[1])
			if r[0] != strconv.Itoa(sz) || (n >= 0 && it != n*q) || (n < 0 && it <= 0) {
				t.Errorf("%s row %d: %v, want %d bytes, %d iterations × %d QPs", side.name, i, r, sz, n, q)
			}
		}
		if check && !strings.Contains(side.o.out, " data check: ok") {
			t.Errorf("%s: no data check line:\n%s", side.name, side.o.out)
		}
	}
}

// TestPerfQPMismatch: sides with different -q both fail in the QP data
// exchange, before any traffic, naming both counts: the side with more QPs
// knows the peer's exactly, the side with fewer knows a lower bound (the
// other rocev2d hangs up as soon as it has seen the repeat).
func TestPerfQPMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("uses loopback sockets")
	}
	for _, tt := range []struct {
		test     string
		cli, srv int
	}{
		{"write-bw", 1, 8}, {"write-bw", 8, 1}, {"send-bw", 2, 3}, {"read-bw", 4, 2}, {"atomic-bw", 1, 2},
	} {
		t.Run(fmt.Sprintf("%s/client%d_server%d", tt.test, tt.cli, tt.srv), func(t *testing.T) {
			srv, cli := runPerfPairSides(t, tt.test, []string{"-q", strconv.Itoa(tt.srv), "-n", "20", "--timeout", "30s"},
				[]string{"-q", strconv.Itoa(tt.cli), "-n", "20", "--timeout", "30s"})
			for _, side := range []struct {
				name         string
				o            perfOut
				local, other int
			}{{"server", srv, tt.srv, tt.cli}, {"client", cli, tt.cli, tt.srv}} {
				if side.o.code == 0 {
					t.Errorf("%s exited 0:\n%s", side.name, side.o.out)
					continue
				}
				want := []string{"QP count mismatch", fmt.Sprintf("this side %s (-q %d)", qpWord(side.local), side.local)}
				if side.local > side.other {
					want = append(want, fmt.Sprintf("the peer runs %s (", qpWord(side.other)))
				} else {
					want = append(want, "the peer runs at least ")
				}
				for _, w := range want {
					if !strings.Contains(side.o.errOut, w) {
						t.Errorf("%s: stderr lacks %q:\n%s", side.name, w, side.o.errOut)
					}
				}
				if strings.Contains(side.o.errOut, "retry") || len(resultRows(side.o.out)) > 0 {
					t.Errorf("%s: got as far as the data phase:\n%s%s", side.name, side.o.out, side.o.errOut)
				}
			}
		})
	}
}

func qpWord(n int) string {
	if n == 1 {
		return "1 QP"
	}
	return fmt.Sprintf("%d QPs", n)
}

// TestPerfQPFlags: -q is for the bandwidth tests, 1..16384.
func TestPerfQPFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"write-lat", "-q", "2"}, "only available on bw tests"},
		{[]string{"write-bw", "-q", "0"}, "between 1 and 16384"},
		{[]string{"send-bw", "-q", "16385"}, "between 1 and 16384"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, _, errOut := runIn(t, append(tt.args, "127.0.0.1")...)
			if code != cli.ExitUsage || !strings.Contains(errOut, tt.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errOut, cli.ExitUsage, tt.want)
			}
		})
	}
}

// TestPerfQPMismatchRDMACM: with -R each QP has its own rdma_cm connection,
// so a -q mismatch shows there, before the QP data: the side with more QPs
// waits for or is refused the next connection and says the peer may run
// fewer QPs, naming its own -q.
func TestPerfQPMismatchRDMACM(t *testing.T) {
	if testing.Short() {
		t.Skip("uses loopback sockets")
	}
	for _, tt := range []struct{ cli, srv int }{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("client%d_server%d", tt.cli, tt.srv), func(t *testing.T) {
			srv, cli := runPerfPairSides(t, "write-bw", []string{"-R", "-q", strconv.Itoa(tt.srv), "-n", "20", "--timeout", "60s", "--connect-timeout", "3s"},
				[]string{"-R", "-q", strconv.Itoa(tt.cli), "-n", "20", "--timeout", "60s", "--connect-timeout", "3s"})
			if srv.code == 0 || cli.code == 0 {
				t.Fatalf("exit server %d client %d\nserver:\n%s%s\nclient:\n%s%s", srv.code, cli.code, srv.out, srv.errOut, cli.out, cli.errOut)
			}
			more := cli
			if tt.srv > tt.cli {
				more = srv
			}
			want := fmt.Sprintf("does it run fewer QPs? this side runs -q %d, both sides need the same -q", max(tt.cli, tt.srv))
			if !strings.Contains(more.errOut, want) {
				t.Errorf("the side with more QPs says:\n%s\nwant %q", more.errOut, want)
			}
			for _, o := range []perfOut{srv, cli} {
				if len(resultRows(o.out)) > 0 {
					t.Errorf("a side got to the data phase:\n%s", o.out)
				}
			}
		})
	}
}
