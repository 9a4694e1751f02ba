package perftest

import (
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// TestSocketOptions: the socket options the perftest commands' flags give
// their links: latency tests poll for cli.DefaultBusyPoll unless -e or
// --busy-poll says otherwise, bandwidth tests never poll; the flags may
// follow the server address.
func TestSocketOptions(t *testing.T) {
	const us7 = 7 * time.Microsecond
	perf := func(pt oob.PerfTest, args ...string) (cli.SocketFlags, bool) {
		c, err := parsePerfFlags(pt, args)
		if err != nil {
			t.Fatalf("%v %q: %v", pt, args, err)
		}
		if c.server != "" && c.server != "127.0.0.1" {
			t.Errorf("%v %q: server %q", pt, args, c.server)
		}
		return c.sock, !c.test.IsBW() && !c.events
	}
	perfPoll := func(pt oob.PerfTest, args ...string) time.Duration {
		f, poll := perf(pt, args...)
		return f.Options(poll, cli.DefaultBusyPoll).BusyPoll
	}
	for _, tc := range []struct {
		name      string
		got, want time.Duration
	}{
		{"write-lat", perfPoll(oob.WriteLat), cli.DefaultBusyPoll},
		{"read-lat SERVER --busy-poll 7us", perfPoll(oob.ReadLat, "127.0.0.1", "--busy-poll", "7us"), us7},
		{"send-lat -e", perfPoll(oob.SendLat, "-e"), 0},
		{"write-bw --busy-poll=7us", perfPoll(oob.WriteBW, "--busy-poll=7us"), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: BusyPoll %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	// The flags may follow the server address.
	if f, _ := perf(oob.WriteBW, "-s", "64", "127.0.0.1", "--gso"); !f.GSO {
		t.Errorf("write-bw SERVER --gso: %+v", f)
	}
}
