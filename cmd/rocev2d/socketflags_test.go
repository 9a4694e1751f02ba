package main

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/udp"
)

func TestTakeGSOFlag(t *testing.T) {
	tests := []struct {
		args, rest []string
		gso, err   bool
	}{
		{args: []string{}, rest: []string{}},
		{args: []string{"-v", "--a=1.2.3.4"}, rest: []string{"-v", "--a=1.2.3.4"}},
		{args: []string{"--gso"}, rest: []string{}, gso: true},
		{args: []string{"-v", "-gso", "-m", "4096"}, rest: []string{"-v", "-m", "4096"}, gso: true},
		{args: []string{"--gso=false", "-v"}, rest: []string{"-v"}},
		{args: []string{"--gso=true"}, rest: []string{}, gso: true},
		{args: []string{"--gso=maybe"}, err: true},
		{args: []string{"gso", "--", "--gso"}, rest: []string{"gso", "--", "--gso"}},
		{args: []string{"--gsox"}, rest: []string{"--gsox"}},
	}
	for _, tc := range tests {
		rest, gso, err := takeGSOFlag(tc.args)
		if (err != nil) != tc.err || (!tc.err && (gso != tc.gso || !slices.Equal(rest, tc.rest))) {
			t.Errorf("takeGSOFlag(%q) = %q, %v, %v; want %q, %v, error %v", tc.args, rest, gso, err, tc.rest, tc.gso, tc.err)
		}
	}
}

// TestGSOFlagWrapsCommands: every command that opens socket links takes
// --gso and documents it; the flag switches GSO on in the default socket
// options for the run only.
func TestGSOFlagWrapsCommands(t *testing.T) {
	names := gsoCommands()
	for _, want := range []string{"demo", "bench", "pingpong", "write-bw", "read-lat"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s does not take --gso (commands: %v)", want, names)
		}
	}
	for _, n := range names {
		if c := commands[n]; !strings.Contains(c.usage, "--gso") {
			t.Errorf("help of %s does not mention --gso", n)
		}
	}
	var sawGSO []bool
	var sawArgs [][]string
	run := withGSOFlag("x", func(_ context.Context, args []string, _, _ io.Writer) int {
		sawGSO = append(sawGSO, udp.DefaultSocketOptions().GSO)
		sawArgs = append(sawArgs, args)
		return exitOK
	})
	run(context.Background(), []string{"-v", "--gso"}, io.Discard, io.Discard)
	run(context.Background(), []string{"-v"}, io.Discard, io.Discard)
	if !slices.Equal(sawGSO, []bool{true, false}) || !slices.Equal(sawArgs[0], []string{"-v"}) {
		t.Errorf("GSO during the runs %v, args %q; want [true false], [-v]", sawGSO, sawArgs)
	}
	if code := run(context.Background(), []string{"--gso=x"}, io.Discard, io.Discard); code != exitUsage {
		t.Errorf("--gso=x: exit %d, want %d", code, exitUsage)
	}
	if udp.DefaultSocketOptions().GSO {
		t.Error("GSO still on after the runs")
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
	if code != exitOK || !strings.Contains(out, "PASS: all 27 cases checked byte for byte") {
		t.Fatalf("demo --gso: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runIn(t, "pcap", "check", "-q", file)
	if code != exitOK || !strings.Contains(out, " 0 bad") || strings.Contains(out, " 0 RoCEv2 packets") {
		t.Fatalf("pcap check after demo --gso: exit %d\n%s%s", code, out, errOut)
	}
}

func TestTakeBusyPollFlag(t *testing.T) {
	tests := []struct {
		args, rest []string
		d          time.Duration
		err        bool
	}{
		{args: []string{}, rest: []string{}},
		{args: []string{"-v", "--gso"}, rest: []string{"-v", "--gso"}},
		{args: []string{"--busy-poll=100us", "-v"}, rest: []string{"-v"}, d: 100 * time.Microsecond},
		{args: []string{"-v", "-busy-poll", "2ms"}, rest: []string{"-v"}, d: 2 * time.Millisecond},
		{args: []string{"--busy-poll=0"}, rest: []string{}},
		{args: []string{"--busy-poll"}, err: true},
		{args: []string{"--busy-poll=fast"}, err: true},
		{args: []string{"--busy-poll=-1us"}, err: true},
		{args: []string{"--busy-poll=2s"}, err: true},
		{args: []string{"x", "--", "--busy-poll=1us"}, rest: []string{"x", "--", "--busy-poll=1us"}},
	}
	for _, tc := range tests {
		rest, d, err := takeBusyPollFlag(tc.args)
		if (err != nil) != tc.err || (!tc.err && (d != tc.d || !slices.Equal(rest, tc.rest))) {
			t.Errorf("takeBusyPollFlag(%q) = %q, %v, %v; want %q, %v, error %v", tc.args, rest, d, err, tc.rest, tc.d, tc.err)
		}
	}
	var saw []time.Duration
	run := withGSOFlag("x", func(_ context.Context, args []string, _, _ io.Writer) int {
		saw = append(saw, udp.DefaultSocketOptions().BusyPoll)
		return exitOK
	})
	run(context.Background(), []string{"--busy-poll=50us"}, io.Discard, io.Discard)
	run(context.Background(), nil, io.Discard, io.Discard)
	if !slices.Equal(saw, []time.Duration{50 * time.Microsecond, 0}) {
		t.Errorf("BusyPoll seen by the commands: %v, want [50µs 0]", saw)
	}
	for _, n := range gsoCommands() {
		if !strings.Contains(commands[n].usage, "--busy-poll") {
			t.Errorf("help of %s does not mention --busy-poll", n)
		}
	}
}

// TestLinkOptionsBusyPoll: latency commands poll for defaultBusyPoll unless
// -e (poll false) or --busy-poll chose a duration; others never poll.
func TestLinkOptionsBusyPoll(t *testing.T) {
	if got := linkOptions(true).BusyPoll; got != defaultBusyPoll {
		t.Errorf("latency command: BusyPoll %v, want %v", got, defaultBusyPoll)
	}
	if got := linkOptions(false).BusyPoll; got != 0 {
		t.Errorf("-e or bandwidth command: BusyPoll %v, want 0", got)
	}
	o := udp.DefaultSocketOptions()
	o.BusyPoll, o.GSO = 7*time.Microsecond, true
	defer udp.SetDefaultSocketOptions(o)()
	if got := linkOptions(true); got.BusyPoll != 7*time.Microsecond || !got.GSO {
		t.Errorf("with --busy-poll=7us --gso: %+v", got)
	}
	if got := linkOptions(false); got.BusyPoll != 0 || !got.GSO {
		t.Errorf("with --busy-poll=7us --gso and -e: %+v", got)
	}
	for pt := oob.WriteBW; pt <= oob.AtomicLat; pt++ {
		c, err := parsePerfFlags(pt, []string{"-e"})
		if err != nil || !c.events {
			t.Errorf("%v -e: %v", pt, err)
		}
	}
}
