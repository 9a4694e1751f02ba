//go:build unix

package perftest

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// runPerfPairSides runs `rocev2d test` as server on 127.0.0.2 and as client
// on 127.0.0.1 with flags of their own, retried while UDP 4791 is taken.
func runPerfPairSides(t *testing.T, test string, srvFlags, cliFlags []string) (srv, client perfOut) {
	t.Helper()
	return runPerfSides(t, "127.0.0.2", "127.0.0.1", test, test, srvFlags, cliFlags)
}

// TestPerfBidi runs the bandwidth tests with -b between two rocev2d
// instances with data checks: both sides send, both print the
// "Bidirectional" title and one row per size (the sum of both directions,
// so the same size and iterations on both sides).
func TestPerfBidi(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	tests := []struct {
		test  string
		flags []string
		rows  int
		size  int
	}{
		{"write-bw", []string{"-n", "50", "-s", "4096"}, 1, 4096},
		{"write-bw", []string{"-n", "5", "-a"}, 23, 0},
		{"read-bw", []string{"-n", "50", "-s", "5000"}, 1, 5000},
		{"send-bw", []string{"-n", "50", "-s", "3000", "-r", "16"}, 1, 3000},
		{"send-bw", []string{"-n", "5", "-a", "-r", "8"}, 23, 0},
		{"atomic-bw", []string{"-n", "100"}, 1, 8},
		{"write-bw", []string{"-n", "20", "-s", "1000", "-R"}, 1, 1000},
		{"send-bw", []string{"-n", "20", "-s", "1000", "-R"}, 1, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.test+strings.Join(tt.flags, ""), func(t *testing.T) {
			flags := append([]string{"-b", "--check", "--timeout", "60s"}, tt.flags...)
			srv, cli := runPerfPairSides(t, tt.test, flags, flags)
			mustPass(t, srv, cli)
			iters, _ := strconv.Atoi(tt.flags[1])
			for _, side := range []struct {
				name string
				o    perfOut
			}{{"server", srv}, {"client", cli}} {
				if !strings.Contains(side.o.out, " Bidirectional BW Test\n") || !strings.Contains(side.o.out, " TX depth        : ") {
					t.Errorf("%s: no bidirectional header:\n%s", side.name, side.o.out)
				}
				if strings.HasPrefix(tt.test, "send") != strings.Contains(side.o.out, " RX depth        : ") {
					t.Errorf("%s: RX depth line:\n%s", side.name, side.o.out)
				}
				rows := resultRows(side.o.out)
				if len(rows) != tt.rows {
					t.Fatalf("%s printed %d result rows, want %d:\n%s", side.name, len(rows), tt.rows, side.o.out)
				}
				for i, r := range rows {
					size := tt.size
					if size == 0 {
						size = 2 << i
					}
					if r[0] != strconv.Itoa(size) || r[1] != strconv.Itoa(iters) {
						t.Errorf("%s row %d: %v, want %d bytes %d iterations", side.name, i, r, size, iters)
					}
				}
				if !strings.Contains(side.o.out, " data check: ok") {
					t.Errorf("%s: no data check line:\n%s", side.name, side.o.out)
				}
			}
		})
	}
}

// TestPerfBidiMismatch: a side with -b against one without refuses, naming
// -b, both ways: the report exchange reveals it for write/read/atomic-bw,
// the exchange's message sequence or the stalled data phase for send-bw.
func TestPerfBidiMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("uses loopback sockets")
	}
	old := perfBidiStall
	perfBidiStall = 2 * time.Second
	defer func() { perfBidiStall = old }()
	for _, test := range []string{"write-bw", "read-bw", "send-bw"} {
		for _, bidiServer := range []bool{true, false} {
			name := test + " client -b"
			if bidiServer {
				name = test + " server -b"
			}
			t.Run(name, func(t *testing.T) {
				base := []string{"-n", "20", "-s", "1024", "--timeout", "20s"}
				srvFlags, cliFlags := base, append([]string{"-b"}, base...)
				if bidiServer {
					srvFlags, cliFlags = cliFlags, srvFlags
				}
				start := time.Now()
				srv, client := runPerfPairSides(t, test, srvFlags, cliFlags)
				if srv.code == 0 && client.code == 0 {
					t.Fatalf("both succeeded\nserver:\n%s%s\nclient:\n%s%s", srv.out, srv.errOut, client.out, client.errOut)
				}
				// The side with -b always refuses, naming the mismatch.
				bidi := client
				if bidiServer {
					bidi = srv
				}
				if bidi.code != cli.ExitFail || !strings.Contains(bidi.errOut, "-b") {
					t.Errorf("side with -b: exit %d:\n%s%s", bidi.code, bidi.out, bidi.errOut)
				}
				for _, o := range []perfOut{srv, client} {
					if o.code != 0 && !strings.Contains(o.errOut, "both sides need -b") {
						t.Errorf("a failure that does not name -b:\n%s", o.errOut)
					}
				}
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("took %v", d)
				}
				t.Logf("server exit %d: %s\nclient exit %d: %s", srv.code, strings.TrimSpace(srv.errOut), client.code, strings.TrimSpace(client.errOut))
			})
		}
	}
}
