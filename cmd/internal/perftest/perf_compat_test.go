//go:build unix

package perftest

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/rdmacm"
)

// TestPerfPerftestOnlyFlags: perftest options rocev2d does not take are
// refused (exit 2, before anything opens) naming them as perftest's, with
// the dashes the user typed, not as an unknown "-run_infinitely".
func TestPerfPerftestOnlyFlags(t *testing.T) {
	for _, b := range []struct {
		test string
		args []string
		want string
	}{
		{"send-bw", []string{"-g"}, "-g: perftest's multicast"},
		{"write-bw", []string{"-T", "32"}, "-T: perftest's type of service of rdma_cm QPs"},
		{"write-bw", []string{"--tos", "32"}, "--tos: perftest's type of service of rdma_cm QPs"},
		{"write-bw", []string{"--dont_xchg_versions"}, "--dont_xchg_versions: perftest's"},
		{"write-bw", []string{"--use_old_post_send"}, "--use_old_post_send: perftest's"},
		{"write-lat", []string{"-C"}, "-C: perftest's report cycles"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var o, e bytes.Buffer
		code := run(ctx, append([]string{b.test}, b.args...), &o, &e)
		cancel()
		if code != cli.ExitUsage || !strings.Contains(e.String(), b.want) || !strings.Contains(e.String(), "not supported by rocev2d") {
			t.Errorf("%s %v: exit %d, stderr %q, want exit 2 with %q ... not supported by rocev2d", b.test, b.args, code, e.String(), b.want)
		}
	}
	// A flag perftest does not have either stays flag's own message.
	var o, e bytes.Buffer
	if code := run(context.Background(), []string{"write-bw", "--frob"}, &o, &e); code != cli.ExitUsage || !strings.Contains(e.String(), "flag provided but not defined: -frob") {
		t.Errorf("--frob: exit %d, %q", code, e.String())
	}
}

// TestPerfConnectionType: -c RC (perftest's default, which users type) is
// taken; UC and UD, which perftest's exchange would not reveal to the peer,
// are refused naming RC.
func TestPerfConnectionType(t *testing.T) {
	for _, args := range [][]string{{"-c", "RC"}, {"--connection=RC"}} {
		if _, err := parsePerfFlags(oob.WriteBW, args); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	for _, args := range [][]string{{"-c", "UC"}, {"-c", "UD"}, {"--connection=XRC"}} {
		_, err := parsePerfFlags(oob.SendBW, args)
		if err == nil || !strings.Contains(err.Error(), "run RC only") {
			t.Errorf("%v: %v, want a refusal naming RC", args, err)
		}
	}
}

// TestPerfReportGbitsUnit: --report_gbits divides by perftest's GBS
// format_factor, 125000000 bytes, instead of 2^20.
func TestPerfReportGbitsUnit(t *testing.T) {
	t0 := time.Unix(0, 0)
	r := perfResult{size: 1000000, iters: 125, start: t0, end: t0.Add(time.Second),
		tposted: []time.Time{t0}, tcomplete: []time.Time{t0.Add(time.Second)}}
	mb, gb := bwReport(r, 1, false), bwReport(r, 1, true)
	if math.Abs(gb.BWAvg-1) > 1e-9 || math.Abs(mb.BWAvg-125e6/(1<<20)) > 1e-9 {
		t.Errorf("average %v Gb/s, %v MB/s; want 1 and %v", gb.BWAvg, mb.BWAvg, 125e6/(1<<20))
	}
	if gb.MsgRate != mb.MsgRate {
		t.Errorf("message rate %v with --report_gbits, %v without", gb.MsgRate, mb.MsgRate)
	}
	if got, want := bwColumns(true), " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"; got != want {
		t.Errorf("header %q, want perftest's %q", got, want)
	}
}

// TestPerfReportGbits runs write-bw and send-bw with --report_gbits on both
// sides: perftest's Gb/sec header and one row each.
func TestPerfReportGbits(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	for _, test := range []string{"write-bw", "send-bw"} {
		srv, cli := runPerfPair(t, test, "-n", "20", "-s", "4096", "--report_gbits")
		mustPass(t, srv, cli)
		for _, o := range []perfOut{srv, cli} {
			if !strings.Contains(o.out, "BW peak[Gb/sec]    BW average[Gb/sec]") || strings.Contains(o.out, "MB/sec") {
				t.Errorf("%s: no Gb/sec header:\n%s", test, o.out)
			}
			if rows := resultRows(o.out); len(rows) != 1 || rows[0][0] != "4096" {
				t.Errorf("%s: rows %v", test, rows)
			}
		}
	}
}

// TestPerfServerRejectsCMClient: a server without -R (with --bind, so its
// RoCEv2 socket is open while it waits) answers an rdma_cm REQ — what a
// perftest client with -R or -z sends — with a REJ, as the kernel's CM
// answers one for a perftest server without -R. Before, the shared port's
// steering dropped the REQ (no listener, no rejector), the kernel answered
// ICMP port unreachable, and ib_write_bw -z retried for minutes.
func TestPerfServerRejectsCMClient(t *testing.T) {
	if testing.Short() {
		t.Skip("uses loopback sockets")
	}
	port := freeTCPPort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	var code int
	var o, e bytes.Buffer
	go func() {
		defer close(done)
		code = run(ctx, []string{"write-bw", "--bind", "127.0.0.1", "-p", strconv.Itoa(port), "--timeout", "15s"}, &o, &e)
	}()
	c, err := parsePerfFlags(oob.WriteBW, []string{"--bind", "127.0.0.2", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := newPerfSide(c, netip.MustParseAddr("127.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	// The server's socket opens before it waits for TCP; a REQ before it
	// is unreachable whatever the fix, so the first attempts may be.
	var derr error
	for range 20 {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		var conn *rdmacm.Conn
		conn, derr = rdmacm.Dial(dctx, s.Dev, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)), nil)
		dcancel()
		if conn != nil {
			conn.Close()
		}
		if !errors.Is(derr, rdmacm.ErrUnreachable) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !errors.Is(derr, rdmacm.ErrRefused) {
		t.Errorf("rdma_cm REQ to a server without -R: %v, want a REJ (%v)", derr, rdmacm.ErrRefused)
	}
	cancel()
	<-done
	if code == cli.ExitOK {
		t.Errorf("the server ended 0 without a client:\n%s%s", o.String(), e.String())
	}
}
