//go:build unix

package perftest

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/test/golden"
)

// goldenSection returns the lines of a golden .txt section ("## client
// output") up to the next "## " heading.
func goldenSection(t *testing.T, name, section string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(golden.Dir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## "+section+"\n")
	if i < 0 {
		t.Fatalf("%s: no section %q", name, section)
	}
	s = s[i+len(section)+4:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return strings.Split(s, "\n")
}

// TestPerfOutputGolden renders the description block, the address lines
// and the result line with the values of real perftest 4.5 runs and
// compares them with what the tool printed in the golden captures (lines
// whose values describe the device differently are skipped: PCIe relax
// order, CQ moderation).
func TestPerfOutputGolden(t *testing.T) {
	cases := []struct {
		file      string
		test      oob.PerfTest
		atomic    string
		role      oob.Role
		section   string
		outReads  int
		local     oob.PerfDest
		remote    oob.PerfDest
		rep       oob.Report
		reportRow bool
	}{
		{file: "rc_write_64.txt", test: oob.WriteBW, role: oob.Client, section: "client output",
			local:  oob.PerfDest{QPN: 0x15, PSN: 0xc8a712, RKey: 0x607, VAddr: 0x55b5fdeb5000, GID: gid4(192, 0, 2, 3)},
			remote: oob.PerfDest{QPN: 0x15, PSN: 0x94b760, RKey: 0x654, VAddr: 0x55d90dddb000, GID: gid4(192, 0, 2, 2)},
			rep:    oob.Report{Size: 64, Iters: 5, BWPeak: 0.08, BWAvg: 0.07, MsgRate: 0.001218}, reportRow: true},
		{file: "rc_read_4096.txt", test: oob.ReadBW, role: oob.Client, section: "client output", outReads: 128,
			local:  oob.PerfDest{OutReads: 0x80, QPN: 0x18, PSN: 0x5178d7, RKey: 0x99d, VAddr: 0x5572243fa000, GID: gid4(192, 0, 2, 3)},
			remote: oob.PerfDest{OutReads: 0x80, QPN: 0x18, PSN: 0x1dab83, RKey: 0x949, VAddr: 0x557a662a5000, GID: gid4(192, 0, 2, 2)},
			rep:    oob.Report{Size: 4096, Iters: 5, BWPeak: 4.47, BWAvg: 4.47, MsgRate: 0.001145}, reportRow: true},
		{file: "rc_send_bw_64.txt", test: oob.SendBW, role: oob.Server, section: "server output",
			local:  oob.PerfDest{QPN: 0x1e, PSN: 0xac9b29, GID: gid4(192, 0, 2, 2)},
			remote: oob.PerfDest{QPN: 0x1e, PSN: 0xceedde, GID: gid4(192, 0, 2, 3)},
			rep:    oob.Report{Size: 64, Iters: 5, BWPeak: 0, BWAvg: 2.03, MsgRate: 0.033298}, reportRow: true},
		{file: "rc_atomic_fadd.txt", test: oob.AtomicBW, atomic: "FETCH_AND_ADD", role: oob.Client, section: "client output", outReads: 128,
			local:  oob.PerfDest{QPN: 0x19, PSN: 0xa16063, GID: gid4(192, 0, 2, 3)},
			remote: oob.PerfDest{QPN: 0x19, PSN: 0x70ccc0, GID: gid4(192, 0, 2, 2)},
			rep:    oob.Report{Size: 8, Iters: 5, BWPeak: 0.02, BWAvg: 0.01, MsgRate: 0.001721}, reportRow: true},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			// The goldens ran with -n 5 and -s (the report's size):
			// perftest's CQ moderation, 100, is lowered to the TX depth,
			// which -n 5 lowers to 5.
			args := []string{"-n", "5"}
			if tc.test != oob.AtomicBW {
				args = append(args, "-s", strconv.Itoa(int(tc.rep.Size)))
			}
			c, err := parsePerfFlags(tc.test, args)
			if err != nil {
				t.Fatal(err)
			}
			writePerfHeader(&b, perfHeader{test: tc.test, atomicType: tc.atomic, dev: "rxe0", role: tc.role,
				txDepth: 5, rxDepth: 6, mtu: 1024, gidIdx: 1, outReads: tc.outReads, cqMod: c.cqMod})
			writePerfDest(&b, tc.test, "local", tc.local)
			writePerfDest(&b, tc.test, "remote", tc.remote)
			b.WriteString(perfLine)
			b.WriteString(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n")
			writeBWLine(&b, tc.rep)
			b.WriteString(perfLine)
			got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			want := goldenSection(t, tc.file, tc.section)
			// Skip the golden's preamble up to the first dashed line.
			for len(want) > 0 && want[0] != strings.TrimSuffix(perfLine, "\n") {
				want = want[1:]
			}
			for len(want) > 1 && want[1] == want[0] { // "Device not recognized ..." leaves two dashed lines
				want = want[1:]
			}
			wi := 0
			for gi, g := range got {
				for wi < len(want) && strings.HasPrefix(want[wi], " PCIe relax order") {
					wi++
				}
				if strings.HasPrefix(g, " PCIe relax order") {
					continue
				}
				if wi >= len(want) {
					t.Fatalf("line %d %q: golden output ended", gi, g)
				}
				if g != want[wi] {
					t.Errorf("line %d:\n got  %q\n want %q", gi, g, want[wi])
				}
				wi++
			}
		})
	}
}

func gid4(a, b, c, d byte) [16]byte {
	return [16]byte{10: 0xff, 11: 0xff, 12: a, 13: b, 14: c, 15: d}
}

// TestLatRow checks the statistics of a latency row: the two largest
// samples are dropped (perftest's LAT_MEASURE_TAIL), then min, max, median,
// average, standard deviation and the 99% / 99.9% percentiles, in
// perftest's REPORT_FMT_LAT layout.
func TestLatRow(t *testing.T) {
	var b bytes.Buffer
	writeLatLine(&b, 2, 5, []float64{1.5, 1.25, 2, 1.75, 1})
	want := " 2       5          1.00           1.50         1.25     \t       1.25        \t0.20   \t\t1.50    \t\t1.50   \n"
	if got := b.String(); got != want {
		t.Errorf("latency row\n got  %q\n want %q", got, want)
	}
	f := strings.Fields(b.String())
	if len(f) != 9 {
		t.Errorf("%d columns, want 9 (the header's)", len(f))
	}
}
