//go:build unix

package demo

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/udp"
)

// TestDemo runs the demo over loopback UDP sockets (its default) and over
// the in-memory network, and checks the exit status, that every operation
// appears in the table with a passed check, and the verdict line.
func TestDemo(t *testing.T) {
	runs := [][]string{{"demo", "--mem", "-m", "4096"}, {"demo", "-v"}}
	if testing.Short() {
		runs = runs[:1] // in-memory only: no sockets in -short runs
	}
	for _, args := range runs {
		code, out, errOut := runInRetry(t, args...)
		if code != cli.ExitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		for _, op := range []string{"SEND", "SEND+imm", "WRITE", "WRITE+imm", "READ", "CMP_AND_SWAP", "FETCH_AND_ADD"} {
			if !strings.Contains(out, " "+op+" ") {
				t.Errorf("%v: no %s row", args, op)
			}
		}
		rows := 0
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 8 && (f[7] == "ok" || f[7] == "FAIL") {
				rows++
				if f[7] != "ok" {
					t.Errorf("%v: row failed: %s", args, line)
				}
				if f[1] == "1048576" && f[4] == "0" {
					t.Errorf("%v: no packets counted: %s", args, line)
				}
			}
		}
		if rows != len(demoCases()) {
			t.Errorf("%v: %d rows, want %d:\n%s", args, rows, len(demoCases()), out)
		}
		if !strings.Contains(out, "PASS: all 27 cases checked byte for byte") {
			t.Errorf("%v: no PASS line:\n%s", args, out)
		}
		if args[1] == "-v" && (!strings.Contains(out, "counters A 127.0.0.1") || !strings.Contains(out, "rdma_recvs")) {
			t.Errorf("-v: no counters:\n%s", out)
		}
	}
}

// TestDemoPcap writes the demo's traffic to a capture and checks it with
// `rocev2d pcap check`: every packet decodes and its ICRC verifies.
func TestDemoPcap(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a few MB")
	}
	for _, mode := range []string{"--mem", "--a=127.0.0.1"} {
		file := filepath.Join(t.TempDir(), "demo.pcap")
		code, out, errOut := runInRetry(t, "demo", mode, "--pcap", file)
		if code != cli.ExitOK || !strings.Contains(out, "packets to "+file) {
			t.Fatalf("demo %s: exit %d\n%s%s", mode, code, out, errOut)
		}
		code, out, errOut = runIn(t, "pcap", "check", "-q", file)
		if code != cli.ExitOK || !strings.Contains(out, " 0 bad") || strings.Contains(out, " 0 RoCEv2 packets") {
			t.Fatalf("pcap check after demo %s: exit %d\n%s%s", mode, code, out, errOut)
		}
	}
}

// TestDemoFaults runs the demo over a lossy, duplicating, reordering
// in-memory network: every check must still pass, with retransmissions.
func TestDemoFaults(t *testing.T) {
	code, out, errOut := runIn(t, "demo", "--mem", "--loss", "0.02", "--dup", "0.01", "--reorder", "0.02", "--seed", "3", "-v")
	if code != cli.ExitOK || !strings.Contains(out, "PASS: all 27 cases") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "retransmitted_pkts") {
		t.Errorf("no retransmissions counted under 2%% loss:\n%s", out)
	}
}

func TestDemoErrors(t *testing.T) {
	for _, b := range []struct {
		args []string
		msg  string
	}{
		{[]string{"demo", "--loss", "0.1"}, "--loss needs --mem"},
		{[]string{"demo", "--mem", "--dup", "1.5"}, "--dup 1.5"},
		{[]string{"demo", "extra"}, `unexpected argument "extra"`},
	} {
		code, _, errOut := runIn(t, b.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, b.msg) {
			t.Errorf("%v: exit %d %q", b.args, code, errOut)
		}
	}
	code, _, errOut := runIn(t, "demo", "--a", "x")
	if code != cli.ExitUsage || !strings.Contains(errOut, `--a "x"`) {
		t.Errorf("bad address: exit %d %s", code, errOut)
	}
	code, _, errOut = runIn(t, "demo", "--a", "127.0.0.1", "--b", "127.0.0.1")
	if code != cli.ExitUsage || !strings.Contains(errOut, "different addresses") {
		t.Errorf("same address: exit %d %s", code, errOut)
	}
	code, _, errOut = runIn(t, "demo", "-m", "9000")
	if code != cli.ExitUsage || !strings.Contains(errOut, "-m 9000") {
		t.Errorf("bad mtu: exit %d %s", code, errOut)
	}
	// A run --timeout stops names the flag (it said "context deadline
	// exceeded"): at 60 % loss the 27 cases take far longer than 200ms.
	code, out, _ := runIn(t, "demo", "--mem", "--loss", "0.6", "--timeout", "200ms")
	if code != cli.ExitFail || !strings.Contains(out, "FAIL: stopped after") || !strings.Contains(out, "--timeout 200ms reached") {
		t.Errorf("--timeout: exit %d\n%s", code, out)
	}
	if testing.Short() {
		return
	}
	// Port 4791 taken on the first address: a clear message, exit 1.
	a := netip.MustParseAddr("127.0.0.1")
	l, err := udp.ListenSocket(a, &udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Skipf("cannot hold %v:4791 for the test: %v", a, err)
	}
	defer l.Close()
	code, _, errOut = runIn(t, "demo")
	if code != cli.ExitFail || !strings.Contains(errOut, "127.0.0.1:4791") || !strings.Contains(errOut, "--mem") {
		t.Errorf("port in use: exit %d %s", code, errOut)
	}
}

// fullDisk accepts n bytes, then fails every write as a full disk does.
type fullDisk struct{ n int }

func (f *fullDisk) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, fmt.Errorf("write x.pcap: %w", syscall.ENOSPC)
	}
	f.n -= len(p)
	return len(p), nil
}

// TestDemoCaptureFails: a capture that fails during the run (a full disk)
// fails the demo with a verdict that says so: every case passed; it said
// "FAIL: 1 of 27 cases failed" above 27 rows of "ok".
func TestDemoCaptureFails(t *testing.T) {
	defer func(f func(string, int) (*pcaptap.Writer, error)) { demoCreateCapture = f }(demoCreateCapture)
	demoCreateCapture = func(path string, snaplen int) (*pcaptap.Writer, error) {
		return pcaptap.NewWriterSnap(&fullDisk{n: 64 << 10}, snaplen)
	}
	code, out, errOut := runInRetry(t, "demo", "--mem", "--pcap", "x.pcap")
	if code != cli.ExitFail {
		t.Fatalf("exit %d, want %d\n%s%s", code, cli.ExitFail, out, errOut)
	}
	if !strings.Contains(out, "FAIL: all 27 cases passed, but the capture x.pcap is incomplete: ") || strings.Contains(out, "cases failed") {
		t.Errorf("verdict:\n%s", out)
	}
	if !strings.Contains(errOut, "--pcap x.pcap: ") || !strings.Contains(errOut, "no space left on device") {
		t.Errorf("stderr %q", errOut)
	}
}
