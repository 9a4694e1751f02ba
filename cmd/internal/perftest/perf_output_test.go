//go:build unix

package perftest

import (
	"regexp"
	"strings"
	"testing"
)

// TestPerfOutput: --output prints the figure alone, as perftest's "%lf\n"
// (no banner, header, address lines or table): the average bandwidth or
// message rate of the bandwidth tests, the average latency of the latency
// tests, on each side that reports; other words, and a word of the other
// kind of test, are refused naming the flag.
func TestPerfOutput(t *testing.T) {
	for _, b := range []struct {
		test string
		args []string
		want string
	}{
		{"write-bw", []string{"--output=latency"}, "--output=latency: the bandwidth tests' output can be bandwidth or message_rate"},
		{"write-lat", []string{"--output=bandwidth"}, "--output=bandwidth: the latency tests' output can be latency"},
		{"send-bw", []string{"--output=peak"}, "--output=peak: must be bandwidth, latency or message_rate"},
	} {
		code, _, e := runIn(t, append([]string{b.test}, b.args...)...)
		if code != 2 || !strings.Contains(e, b.want) {
			t.Errorf("%s %v: exit %d, stderr %q, want exit 2 with %q", b.test, b.args, code, e, b.want)
		}
	}
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	figure := regexp.MustCompile(`^[0-9]+\.[0-9]{6}\n$`)
	for _, b := range []struct {
		test string
		args []string
	}{
		{"write-bw", []string{"--output=bandwidth", "-s", "1024", "-n", "200"}},
		{"send-bw", []string{"--output=message_rate", "-s", "1024", "-n", "200"}},
		{"send-lat", []string{"--output=latency", "-s", "64", "-n", "100"}},
	} {
		srv, cli := runPerfPair(t, b.test, b.args...)
		mustPass(t, srv, cli)
		for who, out := range map[string]string{"client": cli.out, "server": srv.out} {
			if !figure.MatchString(out) || out == "0.000000\n" {
				t.Errorf("%s %v: %s printed %q, want one figure line", b.test, b.args, who, out)
			}
		}
	}
}
