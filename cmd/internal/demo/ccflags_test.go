//go:build unix

package demo

import (
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// demoCounters returns the -v counters of demo's devices A and B, summed
// (the "  name value" lines; the result table's rows have more fields).
func demoCounters(t *testing.T, out string) map[string]uint64 {
	t.Helper()
	m := map[string]uint64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if !strings.HasPrefix(line, "  ") || len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			m[f[0]] += v
		}
	}
	return m
}

// TestDemoCongestionFlags runs demo over the in-memory network with 5 %
// of the ECN-capable packets marked CE (--ce) and checks that the
// congestion options reach the devices: by default the marks make CNPs
// that DCQCN handles; --ecn=off sends Not-ECT packets, which are never
// marked; --dcqcn=off ignores the CNPs. The data checks pass in each.
func TestDemoCongestionFlags(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		check func(c map[string]uint64) bool
	}{
		{nil, func(c map[string]uint64) bool {
			return c["np_ecn_marked_roce_packets"] > 0 && c["np_cnp_sent"] > 0 && c["rp_cnp_handled"] > 0 && c["rp_cnp_ignored"] == 0
		}},
		{[]string{"--ecn=off"}, func(c map[string]uint64) bool {
			return c["np_ecn_marked_roce_packets"] == 0 && c["np_cnp_sent"] == 0 && c["rp_cnp_handled"] == 0
		}},
		{[]string{"--ecn=ect1", "--cnp-interval=100us"}, func(c map[string]uint64) bool {
			return c["np_ecn_marked_roce_packets"] > 0 && c["rp_cnp_handled"] > 0
		}},
		{[]string{"--dcqcn=off"}, func(c map[string]uint64) bool {
			return c["np_cnp_sent"] > 0 && c["rp_cnp_handled"] == 0 && c["rp_cnp_ignored"] > 0
		}},
		{[]string{"--dcqcn-param=rpg_max_rate=1G,rpg_min_rate=10"}, func(c map[string]uint64) bool {
			return c["rp_cnp_handled"] > 0
		}},
	} {
		args := append([]string{"demo", "--mem", "--ce", "0.05", "-v"}, tc.flags...)
		code, out, errOut := runIn(t, args...)
		if code != cli.ExitOK || !strings.Contains(out, "PASS: all") {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errOut)
			continue
		}
		c := demoCounters(t, out)
		for _, n := range []string{"np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored"} {
			if _, ok := c[n]; !ok {
				t.Errorf("%v: -v lacks %s", args, n)
			}
		}
		if !tc.check(c) {
			t.Errorf("%v: counters %v", tc.flags, c)
		}
	}
}
