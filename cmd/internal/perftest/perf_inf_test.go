//go:build unix

package perftest

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// syncBuf is a bytes.Buffer safe for one writer and a concurrent reader.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// runUntilRows runs a server and a client of test with flags on
// 127.0.0.2/127.0.0.1 and cancels the server's context (interruptServer)
// or the client's, as SIGINT does, once that side has printed rows result
// rows; then it waits for both to end.
func runUntilRows(t *testing.T, test string, interruptServer bool, rows int, flags ...string) (srv, client perfOut) {
	t.Helper()
	port := strconv.Itoa(freeTCPPort(t))
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ccancel()
	var so, se, co, ce syncBuf
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		srv.code = run(sctx, append([]string{test, "-p", port, "--bind", "127.0.0.2"}, flags...), &so, &se)
	}()
	go func() {
		defer wg.Done()
		client.code = run(cctx, append(append([]string{test, "-p", port, "--bind", "127.0.0.1"}, flags...), "127.0.0.2"), &co, &ce)
	}()
	watched, cancel := &co, ccancel
	if interruptServer {
		watched, cancel = &so, scancel
	}
	for i := 0; i < 600 && len(resultRows(watched.String())) < rows; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	srv.out, srv.errOut = so.String(), se.String()
	client.out, client.errOut = co.String(), ce.String()
	return srv, client
}

// checkInfRows checks --run_infinitely's period rows: at least want, each
// of size bytes with some iterations, peak 0.00 (perftest's noPeak), and
// no other line after the table's head (perftest prints nothing at SIGINT).
func checkInfRows(t *testing.T, who, out string, size, want int) {
	t.Helper()
	rows := resultRows(out)
	if len(rows) < want {
		t.Fatalf("%s: %d result rows, want at least %d:\n%s", who, len(rows), want, out)
	}
	total := 0
	for _, r := range rows {
		// A period may move nothing on a loaded machine; then its
		// average is 0 too.
		n, err := strconv.Atoi(r[1])
		if r[0] != strconv.Itoa(size) || err != nil || r[2] != "0.00" || (n > 0) != (r[3] != "0.00") {
			t.Errorf("%s: row %q, want %d bytes, the period's iterations, peak 0.00 and their average", who, r, size)
		}
		total += n
	}
	if total == 0 {
		t.Errorf("%s: no iteration in any period:\n%s", who, out)
	}
	_, tail, _ := strings.Cut(out, " #bytes")
	for _, l := range strings.Split(strings.TrimRight(tail, "\n"), "\n")[1:] {
		if len(strings.Fields(l)) != 5 {
			t.Errorf("%s: line %q in the table, want only period rows", who, l)
		}
	}
}

// TestPerfRunInfinitely: --run_infinitely -D 1 reports every second until
// interrupted, as perftest: a client interrupted after two periods exits 0
// having printed only period rows, and its passive server (write-bw) ends
// once the client has gone; a send-bw server reports its receives every
// period too and exits 0 when interrupted.
func TestPerfRunInfinitely(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	t.Run("write-bw client interrupted", func(t *testing.T) {
		srv, cli := runUntilRows(t, "write-bw", false, 2, "--run_infinitely", "-D", "1", "-s", "4096")
		if cli.code != 0 || srv.code != 0 {
			t.Fatalf("exit server %d client %d\nserver:\n%s%s\nclient:\n%s%s", srv.code, cli.code, srv.out, srv.errOut, cli.out, cli.errOut)
		}
		checkInfRows(t, "client", cli.out, 4096, 2)
		if rows := resultRows(srv.out); len(rows) != 0 {
			t.Errorf("passive server printed rows %v", rows)
		}
		if !strings.Contains(srv.errOut, "--run_infinitely: run ended") {
			t.Errorf("server's stderr does not say the run ended: %q", srv.errOut)
		}
		if cli.errOut != "" {
			t.Errorf("interrupted client's stderr %q, want nothing", cli.errOut)
		}
	})
	t.Run("send-bw server interrupted", func(t *testing.T) {
		srv, cli := runUntilRows(t, "send-bw", true, 2, "--run_infinitely", "-D", "1", "-s", "1024")
		if srv.code != 0 {
			t.Fatalf("server exit %d\n%s%s\nclient:\n%s%s", srv.code, srv.out, srv.errOut, cli.out, cli.errOut)
		}
		checkInfRows(t, "server", srv.out, 1024, 2)
		if len(resultRows(cli.out)) < 1 {
			t.Errorf("client printed no period row:\n%s%s", cli.out, cli.errOut)
		}
	})
}

// TestInfReport: a period's row is perftest's REPORT_FMT with peak 0.00,
// the period's iterations and their average bandwidth and message rate.
func TestInfReport(t *testing.T) {
	var b bytes.Buffer
	writeBWLine(&b, infReport(65536, 1000, time.Second, false))
	writeBWLine(&b, infReport(65536, 1000, 2*time.Second, true))
	want := " 65536      1000             0.00               62.50  \t\t   0.001000\n" +
		" 65536      1000             0.00               0.26   \t\t   0.000500\n"
	if b.String() != want {
		t.Errorf("rows\n%q\nwant\n%q", b.String(), want)
	}
}

// TestPerfRunInfinitelyFlags: what perftest refuses with --run_infinitely
// is refused naming the flag; without -D the period is perftest's 5 s.
func TestPerfRunInfinitelyFlags(t *testing.T) {
	for _, b := range []struct {
		test string
		args []string
		want string
	}{
		{"write-lat", []string{"--run_infinitely"}, "--run_infinitely: exists only in the bandwidth tests"},
		{"write-bw", []string{"--run_infinitely", "-e"}, "--run_infinitely with -e"},
		{"send-bw", []string{"--run_infinitely", "-b"}, "--run_infinitely with -b: not supported in the SEND bidirectional test"},
		{"write-bw", []string{"--run_infinitely", "-a"}, "--run_infinitely with -a"},
		{"write-bw", []string{"--run_infinitely", "-D", "0"}, "-D 0: duration must be greater than 0"},
	} {
		code, _, e := runIn(t, append([]string{b.test}, b.args...)...)
		if code != 2 || !strings.Contains(e, b.want) {
			t.Errorf("%s %v: exit %d, stderr %q, want exit 2 with %q", b.test, b.args, code, e, b.want)
		}
	}
	oobTest := []string{"write-bw", "send-bw", "read-bw", "atomic-bw"}
	for _, test := range oobTest {
		c, err := parsePerfFlags(perfTestByName(t, test), []string{"--run_infinitely"})
		if err != nil || !c.runInf || c.duration != 5 {
			t.Errorf("%s --run_infinitely: %+v, %v; want a 5 s period", test, c, err)
		}
	}
	c, err := parsePerfFlags(perfTestByName(t, "write-bw"), []string{"--run_infinitely", "-D", "2"})
	if err != nil || c.duration != 2 {
		t.Errorf("--run_infinitely -D 2: %+v, %v", c, err)
	}
}

// perfTestByName is the oob.PerfTest of a subcommand name.
func perfTestByName(t *testing.T, name string) oob.PerfTest {
	t.Helper()
	for _, pt := range []oob.PerfTest{oob.WriteBW, oob.ReadBW, oob.SendBW, oob.AtomicBW, oob.WriteLat, oob.ReadLat, oob.SendLat, oob.AtomicLat} {
		if pt.String() == name {
			return pt
		}
	}
	t.Fatalf("no perftest %q", name)
	return 0
}
