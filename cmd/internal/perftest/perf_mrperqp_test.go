//go:build unix

package perftest

import (
	"regexp"
	"testing"
)

// TestPerfMRPerQP: --mr_per_qp gives each QP a buffer and memory region of
// its own, as perftest: the local address lines announce one RKey per QP
// (one shared RKey without it), and WRITE, READ and SEND runs over 3 QPs
// move and check the data.
func TestPerfMRPerQP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	rkey := regexp.MustCompile(`(?m)^ local address: .* RKey (0x[0-9a-f]+) `)
	for _, b := range []struct {
		test     string
		flags    []string
		distinct int
	}{
		{"write-bw", []string{"--mr_per_qp", "-q", "3", "-n", "100", "-s", "4096", "--check"}, 3},
		{"read-bw", []string{"--mr_per_qp", "-q", "3", "-n", "100", "-s", "4096", "--check"}, 3},
		{"send-bw", []string{"--mr_per_qp", "-q", "3", "-n", "100", "-s", "4096", "--check"}, 0},
		{"write-bw", []string{"-q", "3", "-n", "100", "-s", "4096", "--check"}, 1},
		{"write-lat", []string{"--mr_per_qp", "-n", "100", "-s", "64", "--check"}, 1},
	} {
		srv, cli := runPerfPair(t, b.test, b.flags...)
		mustPass(t, srv, cli)
		if b.distinct == 0 {
			continue // SEND's address lines carry no RKey
		}
		for who, out := range map[string]string{"client": cli.out, "server": srv.out} {
			keys := map[string]bool{}
			for _, m := range rkey.FindAllStringSubmatch(out, -1) {
				keys[m[1]] = true
			}
			if len(keys) != b.distinct {
				t.Errorf("%s %v: %s announces RKeys %v, want %d distinct", b.test, b.flags, who, keys, b.distinct)
			}
		}
	}
}
