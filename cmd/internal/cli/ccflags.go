package cli

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/transport"
)

// CCUsage documents the congestion control options AddCCFlags registers;
// SocketUsage includes it, so every command that creates a device lists it.
const CCUsage = `  --ecn=MODE     ECN codepoint of the RoCEv2 packets sent (CNPs are always
                 Not-ECT): ect0 (default), ect1 or off (Not-ECT: a switch
                 drops instead of marking)
  --cnp-interval=DUR   notification point: at most one CNP per QP per DUR
                 (default 50us)
  --dcqcn=on|off DCQCN reaction point of every RC/UC QP (default on); off
                 counts CNPs as rp_cnp_ignored and never paces
  --dcqcn-param=KEY=VALUE[,KEY=VALUE...]   DCQCN knobs by the names of
                 mlx5's /sys/class/net/IF/ecn/roce_rp/ (repeatable):
                 rpg_max_rate (line rate), rpg_min_rate,
                 rate_to_set_on_first_cnp, rpg_ai_rate, rpg_hai_rate:
                 Mb/s as in sysfs, or with a unit (10G, 500M, 2.5Gb/s);
                 rpg_time_reset, dce_tcp_rtt, rate_reduce_monitor_period,
                 burst: µs as in sysfs, or a duration (300us);
                 rpg_byte_reset (bytes), rpg_threshold, dce_tcp_g,
                 initial_alpha_value, rpg_gd, rpg_min_dec_fac (%),
                 clamp_tgt_rate (0/1). The counters np_ecn_marked_roce_packets,
                 np_cnp_sent, rp_cnp_handled and rp_cnp_ignored are in -v.
`

// CCFlags holds the congestion control options of one command.
type CCFlags struct {
	ECN         transport.ECNMode
	CNPInterval time.Duration
	DCQCNOff    bool
	Params      dcqcn.Config // knobs set by --dcqcn-param (zero: default)
	// ParamArgs are the --dcqcn-param values in order, joined by commas
	// (a string keeps the options comparable).
	ParamArgs string
}

// AddCCFlags registers --ecn, --cnp-interval, --dcqcn and --dcqcn-param
// in fs, storing their values in f.
func AddCCFlags(fs *flag.FlagSet, f *CCFlags) {
	fs.Func("ecn", "", func(v string) error {
		m, err := ParseECN(v)
		if err == nil {
			f.ECN = m
		}
		return err
	})
	fs.Func("cnp-interval", "", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > time.Second {
			return fmt.Errorf("want a duration between 1ns and 1s (e.g. 50us)")
		}
		f.CNPInterval = d
		return nil
	})
	fs.Var(onOff{&f.DCQCNOff}, "dcqcn", "")
	fs.Func("dcqcn-param", "", func(v string) error {
		if err := SetDCQCNParams(&f.Params, v); err != nil {
			return err
		}
		if f.ParamArgs != "" {
			f.ParamArgs += ","
		}
		f.ParamArgs += v
		return nil
	})
}

// config returns the device's CongestionConfig.
func (f CCFlags) Config() transport.CongestionConfig {
	c := transport.CongestionConfig{ECN: f.ECN, CNPInterval: f.CNPInterval, DCQCN: f.Params}
	c.DCQCN.Disable = f.DCQCNOff
	return c
}

// ParseECN parses an --ecn value.
func ParseECN(v string) (transport.ECNMode, error) {
	switch strings.ToLower(v) {
	case "ect0", "ect(0)", "on":
		return transport.ECNECT0, nil
	case "ect1", "ect(1)":
		return transport.ECNECT1, nil
	case "off", "not-ect", "notect", "none":
		return transport.ECNNotECT, nil
	}
	return 0, fmt.Errorf("want ect0, ect1 or off")
}

// onOff is a boolean flag spelled on/off (or true/false, 1/0) that stores
// its negation: --dcqcn=off sets *off. A bare --dcqcn means on.
type onOff struct{ off *bool }

func (o onOff) String() string {
	if o.off != nil && *o.off {
		return "off"
	}
	return "on"
}

func (o onOff) Set(v string) error {
	switch strings.ToLower(v) {
	case "on", "true", "1", "yes":
		*o.off = false
	case "off", "false", "0", "no":
		*o.off = true
	default:
		return fmt.Errorf("want on or off")
	}
	return nil
}

func (o onOff) IsBoolFlag() bool { return true }

// dcqcnKnob is one knob --dcqcn-param sets: its mlx5 sysfs name and a
// pointer to its dcqcn.Config field, whose type says how the value is read
// (float64: a rate; time.Duration; int or int64; bool).
type dcqcnKnob struct {
	name string
	f    func(c *dcqcn.Config) any
}

var dcqcnKnobs = []dcqcnKnob{
	{"rpg_max_rate", func(c *dcqcn.Config) any { return &c.LineRate }},
	{"rpg_min_rate", func(c *dcqcn.Config) any { return &c.MinRate }},
	{"rate_to_set_on_first_cnp", func(c *dcqcn.Config) any { return &c.RateOnFirstCNP }},
	{"rpg_ai_rate", func(c *dcqcn.Config) any { return &c.AIRate }},
	{"rpg_hai_rate", func(c *dcqcn.Config) any { return &c.HAIRate }},
	{"rpg_time_reset", func(c *dcqcn.Config) any { return &c.TimeReset }},
	{"rpg_byte_reset", func(c *dcqcn.Config) any { return &c.ByteReset }},
	{"rpg_threshold", func(c *dcqcn.Config) any { return &c.Threshold }},
	{"dce_tcp_g", func(c *dcqcn.Config) any { return &c.G }},
	{"dce_tcp_rtt", func(c *dcqcn.Config) any { return &c.AlphaPeriod }},
	{"initial_alpha_value", func(c *dcqcn.Config) any { return &c.InitialAlpha }},
	{"rpg_gd", func(c *dcqcn.Config) any { return &c.GD }},
	{"rpg_min_dec_fac", func(c *dcqcn.Config) any { return &c.MinDecFac }},
	{"rate_reduce_monitor_period", func(c *dcqcn.Config) any { return &c.ReduceMonitorPeriod }},
	{"clamp_tgt_rate", func(c *dcqcn.Config) any { return &c.ClampTargetRate }},
	{"burst", func(c *dcqcn.Config) any { return &c.Burst }},
}

// SetDCQCNParams applies a comma-separated KEY=VALUE list to c and checks
// the result with dcqcn.Config.Normalize.
func SetDCQCNParams(c *dcqcn.Config, list string) error {
	next := *c
	for _, kv := range strings.Split(list, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q: want KEY=VALUE", kv)
		}
		k = strings.ToLower(strings.TrimSpace(k))
		v = strings.TrimSpace(v)
		i := slices.IndexFunc(dcqcnKnobs, func(kn dcqcnKnob) bool { return kn.name == k })
		if i < 0 {
			names := make([]string, len(dcqcnKnobs))
			for j, kn := range dcqcnKnobs {
				names[j] = kn.name
			}
			return fmt.Errorf("unknown DCQCN knob %q (known: %s)", k, strings.Join(names, ", "))
		}
		kn := dcqcnKnobs[i]
		switch p := kn.f(&next).(type) {
		case *float64:
			r, err := ParseBitRate(v, 1e6)
			if err != nil {
				return fmt.Errorf("%s=%s: %v", k, v, err)
			}
			*p = r
		case *time.Duration:
			d, err := ParseMicros(v)
			if err != nil {
				return fmt.Errorf("%s=%s: %v", k, v, err)
			}
			*p = d
		case *int:
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%s=%s: want an integer", k, v)
			}
			*p = n
		case *int64:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("%s=%s: want an integer", k, v)
			}
			*p = n
		case *bool:
			switch v {
			case "1", "true", "on":
				*p = true
			case "0", "false", "off":
				*p = false
			default:
				return fmt.Errorf("%s=%s: want 0 or 1", k, v)
			}
		}
	}
	if _, err := next.Normalize(); err != nil {
		return err
	}
	*c = next
	return nil
}

// ParseBitRate parses a rate in bits/s: a number with a k, M, G or T prefix
// (optionally followed by "b/s", "bps" or "bit/s"), or a bare number in
// units of bare (1e6 for the Mb/s of mlx5's sysfs).
func ParseBitRate(v string, bare float64) (float64, error) {
	s := strings.TrimSpace(v)
	for _, sfx := range []string{"bit/s", "b/s", "bps"} {
		if t, ok := strings.CutSuffix(s, sfx); ok {
			s = t
			break
		}
	}
	mult := bare
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult, s = 1e3, s[:n-1]
		case 'M':
			mult, s = 1e6, s[:n-1]
		case 'G', 'g':
			mult, s = 1e9, s[:n-1]
		case 'T', 't':
			mult, s = 1e12, s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0) || f*mult > 1e15 {
		return 0, fmt.Errorf("want a positive rate (e.g. 10G, 500M, or a number in units of %g b/s)", bare)
	}
	return f * mult, nil
}

// ParseMicros parses a duration: Go syntax (300us, 1.5ms) or a bare
// number of microseconds, as mlx5's sysfs gives them.
func ParseMicros(v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		d := time.Duration(f * float64(time.Microsecond))
		if !(f > 0) || f > 1e9 || d <= 0 {
			return 0, fmt.Errorf("want a positive number of microseconds (at least 0.001)")
		}
		return d, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("want a positive duration (e.g. 300us) or microseconds")
	}
	return d, nil
}
