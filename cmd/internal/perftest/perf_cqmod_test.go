//go:build unix

package perftest

import (
	"bytes"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// TestPerfCQModFlags: -Q and -l give perftest 4.5's effective CQ
// moderation (100 by default, 1 over 8 KiB unless -Q, -a or -e, at most
// the TX depth, -l's size with -l), with perftest's notices, and what
// perftest refuses is refused naming the flag.
func TestPerfCQModFlags(t *testing.T) {
	for _, b := range []struct {
		test  string
		args  []string
		cq    int
		notes string
	}{
		{"write-bw", nil, 1, ""},
		{"write-bw", []string{"-s", "8192"}, 100, ""},
		{"write-bw", []string{"-s", "4096", "-t", "50"}, 50, ""},
		{"write-bw", []string{"-s", "4096", "-n", "20"}, 20, ""},
		{"write-bw", []string{"-Q", "10"}, 10, "Warning: Large message requested and CQ moderation enabled\nWarning: It can lead to inaccurate results"},
		{"write-bw", []string{"-Q", "1"}, 1, ""},
		{"write-bw", []string{"-a"}, 100, ""},
		{"send-bw", []string{"-e"}, 100, ""},
		{"send-bw", []string{"--cq-mod=200", "-s", "64", "-t", "300"}, 200, ""},
		{"write-bw", []string{"-l", "4", "-s", "4096"}, 4, "Post List requested - CQ moderation will be the size of the post list"},
		{"write-bw", []string{"--post_list=8", "-Q", "4", "-s", "4096"}, 4, ""},
		{"read-bw", []string{"-l", "8"}, 8, "Post List requested"},
	} {
		c, err := parsePerfFlags(perfTestByName(t, b.test), b.args)
		if err != nil {
			t.Errorf("%s %v: %v", b.test, b.args, err)
			continue
		}
		notes := strings.Join(c.notes, "\n")
		if c.cqMod != b.cq || (b.notes == "") != (notes == "") || !strings.Contains(notes, b.notes) {
			t.Errorf("%s %v: CQ moderation %d, notes %q; want %d, %q", b.test, b.args, c.cqMod, notes, b.cq, b.notes)
		}
		if notes != "" && !strings.HasPrefix(notes, strings.TrimSuffix(perfLine, "\n")+"\n") {
			t.Errorf("%s %v: notes %q do not start with perftest's RESULT_LINE", b.test, b.args, notes)
		}
	}
	for _, b := range []struct {
		test string
		args []string
		want string
	}{
		{"write-bw", []string{"-Q", "0"}, "-Q 0: CQ moderation must be between 1 and 1024"},
		{"write-bw", []string{"--cq-mod", "1025"}, "-Q 1025: CQ moderation must be between 1 and 1024"},
		{"write-bw", []string{"-l", "0"}, "-l 0: the post list size must be at least 1"},
		{"write-bw", []string{"-l", "3", "-n", "1000"}, "-l 3: the number of iterations (-n 1000) must be a multiple of the post list size"},
		{"write-bw", []string{"-l", "4", "-Q", "3"}, "-l 4 with -Q 3: the post list size must be a multiple of the CQ moderation"},
		{"write-lat", []string{"-l", "2"}, "-l 2: post lists are supported in the bandwidth tests only"},
		{"write-bw", []string{"-l", "200", "-n", "1000"}, "-l 200: larger than the TX depth (-t 128"},
	} {
		code, _, e := runIn(t, append([]string{b.test}, b.args...)...)
		if code != 2 || !strings.Contains(e, b.want) {
			t.Errorf("%s %v: exit %d, stderr %q, want exit 2 with %q", b.test, b.args, code, e, b.want)
		}
	}
	// -l 3 with -D: no iteration count to divide.
	if _, err := parsePerfFlags(oob.WriteBW, []string{"-l", "3", "-D", "1", "-Q", "3"}); err != nil {
		t.Errorf("-l 3 -D 1: %v", err)
	}
}

// TestPerfCQModHeader: the header prints the effective CQ moderation and,
// with -l, perftest's "Post List" title word and line.
func TestPerfCQModHeader(t *testing.T) {
	var b bytes.Buffer
	writePerfHeader(&b, perfHeader{test: oob.WriteBW, role: oob.Client, txDepth: 128, mtu: 1024, gidIdx: 1, cqMod: 100})
	if !strings.Contains(b.String(), " TX depth        : 128\n CQ Moderation   : 100\n") || strings.Contains(b.String(), "Post List") {
		t.Errorf("header:\n%s", b.String())
	}
	b.Reset()
	writePerfHeader(&b, perfHeader{test: oob.WriteBW, role: oob.Client, txDepth: 128, mtu: 1024, gidIdx: 1, cqMod: 4, postList: 4, bidi: true})
	for _, want := range []string{"                    RDMA_Write Bidirectional Post List BW Test\n",
		" TX depth        : 128\n Post List       : 4\n CQ Moderation   : 4\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("header lacks %q:\n%s", want, b.String())
		}
	}
}

// TestPerfCQModRun: with -Q the client requests a completion for one WR
// in N (and the last), with -l it posts lists; the run completes every
// iteration, the result row counts them all, and the client polled as
// many completions as perftest would signal.
func TestPerfCQModRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	var mu sync.Mutex
	var wcs []uint64
	perfAfterRun = func(s *perfSide) {
		mu.Lock()
		defer mu.Unlock()
		if s.c.role() == oob.Client {
			wcs = append(wcs, s.sendWCs.Load())
		}
	}
	defer func() { perfAfterRun = nil }()
	for _, b := range []struct {
		test   string
		args   []string
		iters  int
		wcs    uint64
		header string
	}{
		{"write-bw", []string{"-s", "4096", "-n", "1000"}, 1000, 10, " CQ Moderation   : 100\n"},
		{"write-bw", []string{"-s", "4096", "-n", "1000", "-Q", "7", "--check"}, 1000, 143, " CQ Moderation   : 7\n"},
		{"read-bw", []string{"-s", "1024", "-n", "1000", "-l", "8", "--check"}, 1000, 125, " Post List       : 8\n CQ Moderation   : 8\n"},
		{"send-bw", []string{"-s", "1024", "-n", "1000", "-l", "10", "-Q", "5", "--check"}, 1000, 200, " Post List       : 10\n CQ Moderation   : 5\n"},
		{"atomic-bw", []string{"-n", "100", "-Q", "30", "-q", "2"}, 200, 8, " CQ Moderation   : 30\n"},
	} {
		wcs = nil
		srv, cli := runPerfPair(t, b.test, b.args...)
		mustPass(t, srv, cli)
		rows := resultRows(cli.out)
		if len(rows) != 1 || rows[0][1] != strconv.Itoa(b.iters) {
			t.Errorf("%s %v: rows %v, want one of %d iterations", b.test, b.args, rows, b.iters)
		}
		if !strings.Contains(cli.out, b.header) {
			t.Errorf("%s %v: client header lacks %q:\n%s", b.test, b.args, b.header, cli.out)
		}
		mu.Lock()
		if len(wcs) != 1 || wcs[0] != b.wcs {
			t.Errorf("%s %v: client polled %v send completions, want %d", b.test, b.args, wcs, b.wcs)
		}
		mu.Unlock()
	}
	// -D with -Q: the run ends although the WRs after the last signaled
	// one never complete visibly.
	srv, cli := runPerfPair(t, "write-bw", "-s", "1024", "-D", "1", "-Q", "64")
	mustPass(t, srv, cli)
	if rows := resultRows(cli.out); len(rows) != 1 {
		t.Errorf("-D 1 -Q 64: rows %v", rows)
	}
}
