//go:build unix

package main

import (
	"flag"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/udp"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

func TestSocketFlags(t *testing.T) {
	tests := []struct {
		args []string
		want cli.SocketFlags
		rest []string
		err  bool
	}{
		{args: []string{}, rest: []string{}},
		{args: []string{"-v"}, want: cli.SocketFlags{}, rest: []string{}},
		{args: []string{"--gso"}, want: cli.SocketFlags{GSO: true, GSOSet: true}, rest: []string{}},
		{args: []string{"-v", "-gso", "x"}, want: cli.SocketFlags{GSO: true, GSOSet: true}, rest: []string{"x"}},
		{args: []string{"--gso=false", "-v"}, want: cli.SocketFlags{GSOSet: true}, rest: []string{}},
		{args: []string{"--gso=true"}, want: cli.SocketFlags{GSO: true, GSOSet: true}, rest: []string{}},
		{args: []string{"--gso=maybe"}, err: true},
		{args: []string{"--", "--gso"}, rest: []string{"--gso"}},
		{args: []string{"--gsox"}, err: true},
		{args: []string{"--busy-poll=100us", "-v"}, want: cli.SocketFlags{BusyPoll: 100 * time.Microsecond, BusyPollSet: true}, rest: []string{}},
		{args: []string{"-v", "-busy-poll", "2ms"}, want: cli.SocketFlags{BusyPoll: 2 * time.Millisecond, BusyPollSet: true}, rest: []string{}},
		{args: []string{"--busy-poll=0"}, want: cli.SocketFlags{BusyPollSet: true}, rest: []string{}},
		{args: []string{"--busy-poll"}, err: true},
		{args: []string{"--busy-poll=fast"}, err: true},
		{args: []string{"--busy-poll=-1us"}, err: true},
		{args: []string{"--busy-poll=2s"}, err: true},
		{args: []string{"--share"}, want: cli.SocketFlags{Share: udp.ShareOn}, rest: []string{}},
		{args: []string{"--share=false", "x"}, want: cli.SocketFlags{Share: udp.ShareOff}, rest: []string{"x"}},
		{args: []string{"--share=true"}, want: cli.SocketFlags{Share: udp.ShareOn}, rest: []string{}},
		{args: []string{"--share=sometimes"}, err: true},
	}
	for _, tc := range tests {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Bool("v", false, "")
		var got cli.SocketFlags
		cli.AddSocketFlags(fs, &got)
		err := fs.Parse(tc.args)
		if !tc.err && got.Options(false, 0).Share != tc.want.Share {
			t.Errorf("%q: options().Share = %v, want %v", tc.args, got.Options(false, 0).Share, tc.want.Share)
		}
		if (err != nil) != tc.err || (!tc.err && (got != tc.want || strings.Join(fs.Args(), " ") != strings.Join(tc.rest, " "))) {
			t.Errorf("%q: %+v, rest %q, error %v; want %+v, rest %q, error %v", tc.args, got, fs.Args(), err, tc.want, tc.rest, tc.err)
		}
	}
}

// socketCommands are the commands that open UDP socket links.
func socketCommands() []string {
	names := []string{"demo", "bench", "pingpong"}
	for pt := oob.WriteBW; pt <= oob.AtomicLat; pt++ {
		names = append(names, pt.String())
	}
	return names
}

// TestSocketFlagsCommands: every command that opens socket links takes
// --gso and --busy-poll, documents them, and builds its socket options
// from them: latency commands poll for defaultBusyPoll unless -e or
// --busy-poll says otherwise; bandwidth commands never poll; demo and bench
// poll only when --busy-poll says so.
func TestSocketFlagsCommands(t *testing.T) {
	for _, n := range socketCommands() {
		c, ok := commands[n]
		if !ok {
			t.Errorf("no command %s", n)
			continue
		}
		if !strings.Contains(c.usage, "--gso") || !strings.Contains(c.usage, "--busy-poll=DUR") {
			t.Errorf("help of %s does not describe --gso and --busy-poll", n)
		}
	}
	const us7 = 7 * time.Microsecond
	d, err := parseDemoFlags([]string{"--gso", "--busy-poll", "7us"})
	if err != nil {
		t.Fatal(err)
	}
	if o := d.Sock.Options(true, 0); !o.GSO || o.BusyPoll != us7 {
		t.Errorf("demo --gso --busy-poll 7us: %+v", o)
	}
	// Bad values are usage errors of the command.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--gso=x"}, "-gso"},
		{[]string{"pingpong", "--busy-poll=fast"}, "want a duration between 0 and 1s"},
		{[]string{"write-lat", "127.0.0.1", "--busy-poll"}, "-busy-poll"},
	} {
		if code, _, errOut := runIn(t, tc.args...); code != cli.ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q", tc.args, code, errOut)
		}
	}
}

// TestDemoGSO runs the demo over UDP sockets with --gso and checks its
// capture: every case passes and every ICRC verifies.
func TestDemoGSO(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a few MB over loopback sockets")
	}
	file := filepath.Join(t.TempDir(), "demo-gso.pcap")
	code, out, errOut := runInRetry(t, "demo", "--gso", "--pcap", file)
	if code != cli.ExitOK || !strings.Contains(out, "PASS: all 27 cases checked byte for byte") {
		t.Fatalf("demo --gso: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runIn(t, "pcap", "check", "-q", file)
	if code != cli.ExitOK || !strings.Contains(out, " 0 bad") || strings.Contains(out, " 0 RoCEv2 packets") {
		t.Fatalf("pcap check after demo --gso: exit %d\n%s%s", code, out, errOut)
	}
}
