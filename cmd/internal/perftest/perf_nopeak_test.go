//go:build unix

package perftest

import (
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// TestPerfNoPeak: -N (and, as perftest, more than 20000 iterations of a
// bandwidth test) reports no peak: 0.00 on both sides' rows, the average
// as before.
func TestPerfNoPeak(t *testing.T) {
	for _, b := range []struct {
		test oob.PerfTest
		args []string
		want bool
	}{
		{oob.WriteBW, []string{"-N"}, true},
		{oob.WriteBW, []string{"--noPeak"}, true},
		{oob.WriteBW, []string{"-n", "20000"}, false},
		{oob.SendBW, []string{"-n", "20001"}, true},
		{oob.WriteBW, []string{"-n", "30000", "-D", "2"}, false},
		{oob.WriteLat, []string{"-n", "30000"}, false},
	} {
		c, err := parsePerfFlags(b.test, b.args)
		if err != nil || c.noPeak != b.want {
			t.Errorf("%v %v: noPeak %v, %v; want %v", b.test, b.args, c != nil && c.noPeak, err, b.want)
		}
	}
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	for _, b := range []struct {
		flags []string
		peak  bool
	}{
		{[]string{"-s", "1024", "-n", "200", "-N"}, false},
		{[]string{"-s", "1024", "-n", "200"}, true},
	} {
		srv, cli := runPerfPair(t, "write-bw", b.flags...)
		mustPass(t, srv, cli)
		for who, out := range map[string]string{"client": cli.out, "server": srv.out} {
			rows := resultRows(out)
			if len(rows) != 1 || rows[0][1] != "200" || rows[0][3] == "0.00" || (rows[0][2] != "0.00") != b.peak {
				t.Errorf("%v: %s rows %v, want 200 iterations, an average and a peak: %v", b.flags, who, rows, b.peak)
			}
		}
	}
}
