package perftest

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
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
		{"write-bw", []string{"--run_infinitely", "-D", "2"}, "--run_infinitely: perftest's run until interrupted"},
		{"write-bw", []string{"-I", "64"}, "-I: perftest's inline data size"},
		{"write-bw", []string{"--inline_size=64"}, "--inline_size: perftest's inline data size"},
		{"write-bw", []string{"-l", "4"}, "-l: perftest's post lists"},
		{"send-bw", []string{"--cq-mod", "10"}, "--cq-mod: perftest's CQ moderation"},
		{"send-bw", []string{"-Q", "10"}, "-Q: perftest's CQ moderation"},
		{"send-bw", []string{"-g"}, "-g: perftest's multicast"},
		{"write-bw", []string{"--mr_per_qp", "-q", "2"}, "--mr_per_qp: perftest's a memory region per QP"},
		{"write-bw", []string{"--tclass=32"}, "--tclass: perftest's traffic class"},
		{"write-bw", []string{"-T", "32"}, "-T: perftest's traffic class"},
		{"write-bw", []string{"-S", "1"}, "-S: perftest's service level"},
		{"write-bw", []string{"--sl", "1"}, "--sl: perftest's service level"},
		{"write-bw", []string{"--dont_xchg_versions"}, "--dont_xchg_versions: perftest's"},
		{"write-bw", []string{"--use_old_post_send"}, "--use_old_post_send: perftest's"},
		{"write-bw", []string{"--output=bandwidth"}, "--output: perftest's"},
		{"write-lat", []string{"-C"}, "-C: perftest's report cycles"},
		{"write-lat", []string{"-H"}, "-H: perftest's latency histogram"},
		{"read-lat", []string{"-U"}, "-U: perftest's unsorted latencies"},
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
