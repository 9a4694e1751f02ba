package main

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
