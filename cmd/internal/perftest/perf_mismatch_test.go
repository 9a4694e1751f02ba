//go:build unix

package perftest

import (
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// The addresses of the mismatch tests' pairs.
const (
	mismatchSrv = "127.0.0.85"
	mismatchCli = "127.0.0.86"
)

// TestPerfSizeMismatch: sides that run another -s or -n say so — by the
// client's report (--check on a write-bw or atomic-bw server), by a
// receive's length (SEND tests), by where the peer's write ended
// (write-lat) — instead of naming a byte, or waiting for ever; the peer
// left waiting gives up once its own peer has gone.
func TestPerfSizeMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	defer func(g, s time.Duration) { perfPeerGrace, perfLatStall = g, s }(perfPeerGrace, perfLatStall)
	perfPeerGrace, perfLatStall = 500*time.Millisecond, 300*time.Millisecond
	peerGone := "the peer closed the out-of-band connection"
	peerAhead := "the peer ended its data phase"
	for _, tc := range []struct {
		name             string
		test             string
		flags, cliExtra  []string
		srvCode, cliCode int
		srvWant, cliWant string
	}{
		{"write-bw --check -s", "write-bw", []string{"-n", "20", "-s", "100", "--check"}, []string{"-s", "64"},
			cli.ExitFail, cli.ExitOK, "--check: the client sent 64-byte messages, this side expects 100 (-s differs?", ""},
		{"write-bw --check -n", "write-bw", []string{"-n", "20", "-s", "100", "--check"}, []string{"-n", "30"},
			cli.ExitFail, cli.ExitOK, "--check: the client ran 30 iterations, this side expects 20 (-n differs?", ""},
		{"atomic-bw --check -n", "atomic-bw", []string{"-n", "20", "--check"}, []string{"-n", "30"},
			cli.ExitFail, cli.ExitOK, "--check: the client ran 30 iterations, this side expects 20", ""},
		{"send-lat -s", "send-lat", []string{"-n", "20", "-s", "64"}, []string{"-s", "100"},
			cli.ExitFail, cli.ExitFail, "receive 1: the peer sent 100 bytes, this side expects 64 (-s differs?", peerGone},
		{"send-bw -s", "send-bw", []string{"-n", "20", "-s", "64"}, []string{"-s", "100"},
			cli.ExitFail, cli.ExitFail, "receive 1: the peer sent 100 bytes, this side expects 64 (-s differs?", ""},
		{"write-lat -s", "write-lat", []string{"-n", "20", "-s", "64", "--check"}, []string{"-s", "100"},
			cli.ExitFail, cli.ExitFail, peerGone, "the peer's write 1 ended at byte 63 of this side's buffer instead of at byte 99: the peer writes 64-byte messages, this side 100"},
		{"write-lat -n", "write-lat", []string{"-n", "30", "-s", "64"}, []string{"-n", "20"},
			cli.ExitFail, cli.ExitOK, peerGone, ""},
		{"send-bw -n", "send-bw", []string{"-n", "30", "-s", "64"}, []string{"-n", "20"},
			cli.ExitFail, cli.ExitFail, peerAhead, ""},
		{"send-lat -n", "send-lat", []string{"-n", "30", "-s", "64"}, []string{"-n", "20"},
			cli.ExitFail, cli.ExitFail, peerAhead, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			srv, cli := runPerfPairAt(t, mismatchSrv, mismatchCli, tc.test, append(tc.flags, "--timeout", "20s"), tc.cliExtra)
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
			if srv.code != tc.srvCode || !strings.Contains(srv.errOut, tc.srvWant) {
				t.Errorf("server: exit %d, want %d and %q\n%s%s", srv.code, tc.srvCode, tc.srvWant, srv.out, srv.errOut)
			}
			if cli.code != tc.cliCode || !strings.Contains(cli.errOut, tc.cliWant) {
				t.Errorf("client: exit %d, want %d and %q\n%s%s", cli.code, tc.cliCode, tc.cliWant, cli.out, cli.errOut)
			}
		})
	}
}

// TestPerfTestMismatch: sides running different tests fail, both, with a
// message that says so, as far as the exchange (which has no field for
// the test) and the traffic tell: a WRITE or SEND side refuses a peer that
// announces more than one outstanding READ, whose hang-up the READ side
// explains; a SEND side whose peer posts no receives gives up on the RNR
// NAKs; a receiving side whose peer has moved on gives up on that.
func TestPerfTestMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	defer func(g time.Duration) { perfPeerGrace = g }(perfPeerGrace)
	perfPeerGrace = 500 * time.Millisecond
	refuse := "test mismatch: the peer announces 16 outstanding READs/atomics (OUT 0x10)"
	suspect := "the peer announced 1 outstanding READ, as perftest's WRITE and SEND tests do"
	for _, tc := range []struct {
		srvTest, cliTest string
		srvWant, cliWant string
	}{
		{"write-bw", "read-bw", refuse + ", which perftest's READ and atomic tests do and its WRITE and SEND tests never", suspect + " (and its READ and atomic tests only with -o 1): does it run a WRITE or SEND test against this read-bw?"},
		{"read-bw", "write-bw", suspect, refuse},
		{"atomic-lat", "write-lat", suspect, refuse},
		{"send-bw", "atomic-bw", refuse, suspect},
		{"write-bw", "send-bw", "or another test on the peer ends this way too", "the peer has answered SENDs with RNR NAKs"},
		{"send-bw", "write-bw", "do both sides run the same test with the same -n, -s and -D?", "or another test on the peer ends this way too"},
	} {
		t.Run(tc.srvTest+" "+tc.cliTest, func(t *testing.T) {
			srv, client := runPerfTests(t, mismatchSrv, mismatchCli, tc.srvTest, tc.cliTest, []string{"-n", "20", "--timeout", "20s"}, nil)
			if srv.code != cli.ExitFail || !strings.Contains(srv.errOut, tc.srvWant) {
				t.Errorf("server %s: exit %d, want %d and %q\n%s%s", tc.srvTest, srv.code, cli.ExitFail, tc.srvWant, srv.out, srv.errOut)
			}
			if client.code != cli.ExitFail || !strings.Contains(client.errOut, tc.cliWant) {
				t.Errorf("client %s: exit %d, want %d and %q\n%s%s", tc.cliTest, client.code, cli.ExitFail, tc.cliWant, client.out, client.errOut)
			}
		})
	}
}

// TestPerfCheckOneSide: --check on one side only fails on the checking
// side (the peer's source holds no pattern), and the message says that
// the peer needs --check too instead of only naming a byte.
func TestPerfCheckOneSide(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	for _, tc := range []struct {
		test               string
		srvFlags, cliFlags []string
		srvFails           bool
	}{
		{"write-bw", []string{"--check"}, nil, true},
		{"read-bw", nil, []string{"--check"}, false},
	} {
		t.Run(tc.test, func(t *testing.T) {
			common := []string{"-n", "20", "-s", "100", "--timeout", "20s"}
			srv, client := runPerfSides(t, mismatchSrv, mismatchCli, tc.test, tc.test, append(common, tc.srvFlags...), append(common, tc.cliFlags...))
			failed, other := srv, client
			if !tc.srvFails {
				failed, other = client, srv
			}
			if failed.code != cli.ExitFail || !strings.Contains(failed.errOut, "--check: size 100: byte 0 is 0x00") ||
				!strings.Contains(failed.errOut, "only when the peer is a rocev2d run with --check too") {
				t.Errorf("checking side: exit %d\n%s%s", failed.code, failed.out, failed.errOut)
			}
			if other.code != cli.ExitOK {
				t.Errorf("other side: exit %d\n%s%s", other.code, other.out, other.errOut)
			}
		})
	}
}
