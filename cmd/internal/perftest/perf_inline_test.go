//go:build unix

package perftest

import (
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// TestPerfInline: -I is taken (0..912) and disabled as perftest 4.5 does on
// rxe, a device it does not know to send inline: it says so (a dashed line
// on stdout, the notice on stderr) and the header says "Max inline data :
// 0[B]"; the run is a plain one.
func TestPerfInline(t *testing.T) {
	for _, args := range [][]string{{"-I", "913"}, {"--inline_size=-1"}} {
		code, _, e := runIn(t, append([]string{"write-bw"}, args...)...)
		if code != 2 || !strings.Contains(e, "inline size must be between 0 and 912") {
			t.Errorf("write-bw %v: exit %d, stderr %q", args, code, e)
		}
	}
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	srv, cli := runPerfPair(t, "write-bw", "-I", "64", "-s", "64", "-n", "100")
	mustPass(t, srv, cli)
	for who, o := range map[string]perfOut{"client": cli, "server": srv} {
		if !strings.HasPrefix(o.out, perfLine) || !strings.Contains(o.out, " Max inline data : 0[B]\n") ||
			!strings.Contains(o.errOut, perfInlineDisabled+"\n") {
			t.Errorf("%s: stdout\n%s\nstderr %q", who, o.out, o.errOut)
		}
	}
	if rows := resultRows(cli.out); len(rows) != 1 || rows[0][1] != "100" {
		t.Errorf("rows %v", rows)
	}
}

// TestPerfInlineReadAtomicRefused: perftest 4.5 refuses -I in the READ and
// atomic tests (" Inline feature not available on READ/Atomic verbs"),
// whose requests carry no data to inline; rocev2d took it there.
func TestPerfInlineReadAtomicRefused(t *testing.T) {
	for _, test := range []oob.PerfTest{oob.ReadBW, oob.ReadLat, oob.AtomicBW, oob.AtomicLat} {
		for _, args := range [][]string{{"-I", "64"}, {"--inline_size=0"}} {
			_, err := parsePerfFlags(test, args)
			if err == nil || !strings.Contains(err.Error(), "-I") || !strings.Contains(err.Error(), "READ") {
				t.Errorf("%v %v: %v, want an error naming -I (not in READ/atomic tests)", test, args, err)
			}
		}
	}
	for _, test := range []oob.PerfTest{oob.WriteBW, oob.WriteLat, oob.SendBW, oob.SendLat} {
		if _, err := parsePerfFlags(test, []string{"-I", "64"}); err != nil {
			t.Errorf("%v -I 64: %v", test, err)
		}
	}
}
