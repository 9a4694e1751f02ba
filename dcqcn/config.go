// Package dcqcn implements the reaction point (RP) of DCQCN, the congestion
// control of RoCEv2 NICs (Zhu et al., "Congestion Control for Large-Scale
// RDMA Deployments", SIGCOMM 2015), with the parameters and defaults NVIDIA
// documents for its ConnectX adapters, and a pacer that spaces a flow's
// packets at the current rate.
//
// It is pure arithmetic on times the caller passes in: no goroutine, no
// timer, no clock. The timers of the algorithm (the α update period, the
// rate increase timer, the rate reduction monitor period) are evaluated
// lazily, when the flow sends or a CNP arrives, by counting the periods
// that have elapsed since the last evaluation, so an idle flow costs
// nothing. transport runs one RP per RC/UC queue pair.
//
// Rates are in bits per second of IP datagrams (the RoCEv2 UDP payload plus
// the UDP and IP headers), which is what a switch's queue drains.
package dcqcn

import (
	"fmt"
	"time"
)

// Config holds every knob of the reaction point. A zero field takes the
// default given in its comment (NVIDIA's default for the knob named in
// brackets, mlx5's sysfs /sys/class/net/IF/ecn/roce_rp/NAME), so the zero
// Config is NVIDIA's configuration at LineRate 100 Gb/s.
type Config struct {
	// Disable turns the reaction point off: CNPs are counted as ignored and
	// the flow is never paced.
	Disable bool

	// LineRate is the flow's maximum rate, the rate it starts at and the
	// rate it is set to on its first CNP [rpg_max_rate]. Default 100 Gb/s.
	LineRate float64
	// MinRate is the lowest rate a cut goes to [rpg_min_rate]. Default 1 Mb/s.
	MinRate float64
	// RateOnFirstCNP, if not zero, is the rate a flow is set to on its first
	// CNP instead of LineRate cut by α [rate_to_set_on_first_cnp]. Default 0.
	RateOnFirstCNP float64

	// AIRate is the target rate step of additive increase [rpg_ai_rate].
	// Default 5 Mb/s.
	AIRate float64
	// HAIRate is the target rate step of hyper increase [rpg_hai_rate].
	// Default 50 Mb/s.
	HAIRate float64
	// TimeReset is the rate increase timer's period [rpg_time_reset].
	// Default 300 µs.
	TimeReset time.Duration
	// ByteReset is the rate increase byte counter's period in bytes sent
	// [rpg_byte_reset]. Default 32767; negative disables the byte counter.
	ByteReset int64
	// Threshold is the number of timer or byte counter events of fast
	// recovery before additive increase, and of additive before hyper
	// increase [rpg_threshold]. Default 1.
	Threshold int

	// G is α's gain, in 1/1024 [dce_tcp_g]: every AlphaPeriod,
	// α ← G/1024·α + (1024−G)/1024 if a CNP arrived in the period, else
	// α ← G/1024·α. Default 1019.
	G int
	// AlphaPeriod is α's update period [dce_tcp_rtt]. Default 1 µs.
	AlphaPeriod time.Duration
	// InitialAlpha is α, in 1/1024, when a flow gets its first CNP
	// [initial_alpha_value]. Default 1023.
	InitialAlpha int
	// GD is log2 of the divisor between α (in 1/1024) and the cut: a CNP
	// sets the rate to (1 − α·1024/2^GD)·rate, i.e. (1 − α/2) at the
	// default [rpg_gd]. Default 11.
	GD int
	// MinDecFac bounds one cut, in percent: the new rate is at least
	// MinDecFac % of the old one [rpg_min_dec_fac]. Default 50.
	MinDecFac int
	// ReduceMonitorPeriod is the shortest time between two cuts; CNPs
	// within it update α only [rate_reduce_monitor_period]. Default 4 µs.
	ReduceMonitorPeriod time.Duration
	// ClampTargetRate keeps the target rate at its value on a cut instead
	// of setting it to the current rate, unless the timer raised the rate
	// since the previous cut [clamp_tgt_rate]. Default false.
	ClampTargetRate bool

	// Burst is the pacer's bucket: a flow that was idle may send this much
	// time's worth of its rate at once. Default 16 µs (at least one packet
	// always goes).
	Burst time.Duration
	// CatchUp bounds what a flow the pacer held back may send at once when
	// its wake-up comes late: up to this much time's worth of its rate.
	// Software timers are late (Go's by up to 1 ms on an idle machine), so
	// without it the rate would fall short of the target. Default 2 ms.
	CatchUp time.Duration
}

// Defaults of Config, NVIDIA's unless noted.
const (
	DefaultLineRate            = 100e9
	DefaultMinRate             = 1e6
	DefaultAIRate              = 5e6
	DefaultHAIRate             = 50e6
	DefaultTimeReset           = 300 * time.Microsecond
	DefaultByteReset           = 32767
	DefaultThreshold           = 1
	DefaultG                   = 1019
	DefaultAlphaPeriod         = time.Microsecond
	DefaultInitialAlpha        = 1023
	DefaultGD                  = 11
	DefaultMinDecFac           = 50
	DefaultReduceMonitorPeriod = 4 * time.Microsecond
	DefaultBurst               = 16 * time.Microsecond // ours: software pacing needs some slack
	DefaultCatchUp             = 2 * time.Millisecond  // ours: covers Go's timer granularity
)

// Normalize returns c with its zero fields set to their defaults, or an
// error naming the first field out of range.
func (c Config) Normalize() (Config, error) {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defi := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.LineRate, DefaultLineRate)
	def(&c.MinRate, DefaultMinRate)
	def(&c.AIRate, DefaultAIRate)
	def(&c.HAIRate, DefaultHAIRate)
	defd(&c.TimeReset, DefaultTimeReset)
	if c.ByteReset == 0 {
		c.ByteReset = DefaultByteReset
	}
	defi(&c.Threshold, DefaultThreshold)
	defi(&c.G, DefaultG)
	defd(&c.AlphaPeriod, DefaultAlphaPeriod)
	defi(&c.InitialAlpha, DefaultInitialAlpha)
	defi(&c.GD, DefaultGD)
	defi(&c.MinDecFac, DefaultMinDecFac)
	defd(&c.ReduceMonitorPeriod, DefaultReduceMonitorPeriod)
	defd(&c.Burst, DefaultBurst)
	defd(&c.CatchUp, DefaultCatchUp)
	switch {
	case !(c.LineRate > 0):
		return c, fmt.Errorf("dcqcn: LineRate %v must be > 0", c.LineRate)
	case !(c.MinRate > 0) || c.MinRate > c.LineRate:
		return c, fmt.Errorf("dcqcn: MinRate %v must be in (0, LineRate %v]", c.MinRate, c.LineRate)
	case c.RateOnFirstCNP < 0 || c.RateOnFirstCNP > c.LineRate:
		return c, fmt.Errorf("dcqcn: RateOnFirstCNP %v must be in [0, LineRate %v]", c.RateOnFirstCNP, c.LineRate)
	case !(c.AIRate > 0):
		return c, fmt.Errorf("dcqcn: AIRate %v must be > 0", c.AIRate)
	case !(c.HAIRate > 0):
		return c, fmt.Errorf("dcqcn: HAIRate %v must be > 0", c.HAIRate)
	case c.TimeReset < 0:
		return c, fmt.Errorf("dcqcn: TimeReset %v must be > 0", c.TimeReset)
	case c.Threshold < 1:
		return c, fmt.Errorf("dcqcn: Threshold %d must be >= 1", c.Threshold)
	case c.G < 1 || c.G > 1023:
		return c, fmt.Errorf("dcqcn: G %d must be in [1, 1023]", c.G)
	case c.AlphaPeriod < 0:
		return c, fmt.Errorf("dcqcn: AlphaPeriod %v must be > 0", c.AlphaPeriod)
	case c.InitialAlpha < 1 || c.InitialAlpha > 1023:
		return c, fmt.Errorf("dcqcn: InitialAlpha %d must be in [1, 1023]", c.InitialAlpha)
	case c.GD < 10 || c.GD > 30:
		return c, fmt.Errorf("dcqcn: GD %d must be in [10, 30]", c.GD)
	case c.MinDecFac < 0 || c.MinDecFac > 100:
		return c, fmt.Errorf("dcqcn: MinDecFac %d must be in [0, 100]", c.MinDecFac)
	case c.ReduceMonitorPeriod < 0:
		return c, fmt.Errorf("dcqcn: ReduceMonitorPeriod %v must be >= 0", c.ReduceMonitorPeriod)
	case c.Burst < 0:
		return c, fmt.Errorf("dcqcn: Burst %v must be >= 0", c.Burst)
	case c.CatchUp < 0:
		return c, fmt.Errorf("dcqcn: CatchUp %v must be >= 0", c.CatchUp)
	}
	return c, nil
}
