package cli_test

import (
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/transport"
)

func TestDCQCNParams(t *testing.T) {
	for _, tc := range []struct {
		in    string
		check func(c dcqcn.Config) bool
	}{
		{"rpg_max_rate=10G", func(c dcqcn.Config) bool { return c.LineRate == 10e9 }},
		{"rpg_max_rate=40000", func(c dcqcn.Config) bool { return c.LineRate == 40e9 }}, // Mb/s, as sysfs
		{"rpg_min_rate=100, rpg_ai_rate=5Mb/s", func(c dcqcn.Config) bool { return c.MinRate == 100e6 && c.AIRate == 5e6 }},
		{"rpg_hai_rate=0.5Gbps,rate_to_set_on_first_cnp=2.5G", func(c dcqcn.Config) bool { return c.HAIRate == 0.5e9 && c.RateOnFirstCNP == 2.5e9 }},
		{"rpg_time_reset=300", func(c dcqcn.Config) bool { return c.TimeReset == 300*time.Microsecond }},
		{"dce_tcp_rtt=2us,rate_reduce_monitor_period=1.5ms", func(c dcqcn.Config) bool {
			return c.AlphaPeriod == 2*time.Microsecond && c.ReduceMonitorPeriod == 1500*time.Microsecond
		}},
		{"rpg_byte_reset=-1,rpg_threshold=5,dce_tcp_g=1000", func(c dcqcn.Config) bool { return c.ByteReset == -1 && c.Threshold == 5 && c.G == 1000 }},
		{"initial_alpha_value=512,rpg_gd=12,rpg_min_dec_fac=20", func(c dcqcn.Config) bool {
			return c.InitialAlpha == 512 && c.GD == 12 && c.MinDecFac == 20
		}},
		{"clamp_tgt_rate=1,burst=32us", func(c dcqcn.Config) bool { return c.ClampTargetRate && c.Burst == 32*time.Microsecond }},
		{"RPG_MAX_RATE=1G", func(c dcqcn.Config) bool { return c.LineRate == 1e9 }},
	} {
		var c dcqcn.Config
		if err := cli.SetDCQCNParams(&c, tc.in); err != nil || !tc.check(c) {
			t.Errorf("%q: %+v, %v", tc.in, c, err)
		}
	}
	for _, bad := range []string{"rpg_max_rate", "nosuch=1", "rpg_max_rate=fast", "rpg_max_rate=-5", "rpg_time_reset=soon",
		"rpg_threshold=1.5", "clamp_tgt_rate=2", "rpg_gd=5", "dce_tcp_g=2000", "rpg_min_rate=20G,rpg_max_rate=10G", "rpg_time_reset=0.0001"} {
		c := dcqcn.Config{G: 1000}
		if err := cli.SetDCQCNParams(&c, bad); err == nil {
			t.Errorf("%q accepted", bad)
		} else if c.G != 1000 || c.LineRate != 0 {
			t.Errorf("%q: rejected but changed the config to %+v", bad, c)
		}
	}
}

// TestCCFlags parses the options every device command has (through
// addSocketFlags' FlagSet) into a CongestionConfig.
func TestCCFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want transport.CongestionConfig
	}{
		{nil, transport.CongestionConfig{}},
		{[]string{"--ecn=off"}, transport.CongestionConfig{ECN: transport.ECNNotECT}},
		{[]string{"--ecn", "ect1", "--cnp-interval", "4us"}, transport.CongestionConfig{ECN: transport.ECNECT1, CNPInterval: 4 * time.Microsecond}},
		{[]string{"--dcqcn=off"}, transport.CongestionConfig{DCQCN: dcqcn.Config{Disable: true}}},
		{[]string{"--dcqcn=off", "--dcqcn"}, transport.CongestionConfig{}},
		{[]string{"--dcqcn-param", "rpg_max_rate=25G", "--dcqcn-param", "rpg_ai_rate=10"},
			transport.CongestionConfig{DCQCN: dcqcn.Config{LineRate: 25e9, AIRate: 10e6}}},
	} {
		fs := cli.NewFlagSet("t")
		var f cli.CCFlags
		cli.AddCCFlags(fs, &f)
		if err := fs.Parse(tc.args); err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if got := f.Config(); got != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.args, got, tc.want)
		}
	}
	for _, bad := range [][]string{{"--ecn=ce"}, {"--cnp-interval=0s"}, {"--cnp-interval=2s"}, {"--dcqcn=maybe"}, {"--dcqcn-param=x=1"}} {
		fs := cli.NewFlagSet("t")
		var f cli.CCFlags
		cli.AddCCFlags(fs, &f)
		if err := fs.Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzDCQCNParams: any --dcqcn-param value either fails and leaves the
// config alone, or yields a config that normalizes.
func FuzzDCQCNParams(f *testing.F) {
	for _, s := range []string{"rpg_max_rate=10G", "rpg_min_rate=100,rpg_ai_rate=5Mb/s", "rpg_time_reset=300us",
		"clamp_tgt_rate=1", "rpg_gd=5", "x", "=", ",,,", "rpg_max_rate=1e400", "rpg_byte_reset=-1", "dce_tcp_rtt=NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := dcqcn.Config{G: 1000}
		before := c
		if err := cli.SetDCQCNParams(&c, s); err != nil {
			if c != before {
				t.Fatalf("%q failed (%v) but changed the config", s, err)
			}
			return
		}
		if _, err := c.Normalize(); err != nil {
			t.Fatalf("%q accepted but the config does not normalize: %v", s, err)
		}
	})
}
