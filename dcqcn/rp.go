package dcqcn

import (
	"math"
	"time"
)

// maxIncreaseSteps bounds the timer events one evaluation replays: a flow
// idle for longer than this many TimeReset periods is back at line rate.
const maxIncreaseSteps = 4096

// RP is the reaction point of one flow: its current and target rates, α,
// the increase timer and byte counter, and the pacer. The zero RP is not
// usable; use NewRP. An RP is not safe for concurrent use (transport
// guards it with the QP's lock).
type RP struct {
	cfg *Config

	// limited and held first: a sender reads them per packet (Limited,
	// Idle) and the rest only under congestion, so that they share a
	// cache line with what the sender reads next to them.
	limited bool // a CNP was received and the rate is not back at line rate
	held    bool // Wait held the flow back: it is backlogged, not idle

	rc, rt float64 // current and target rate, bits/s (line rate while !limited)
	alpha  float64 // congestion estimate in [0, 1]

	alphaAt     time.Time // start of the current α period
	cnpInPeriod bool      // a CNP arrived in the current α period
	lastCut     time.Time // time of the last cut
	timerAt     time.Time // start of the current increase timer period
	tCount      int       // timer events since the last cut
	bCount      int       // byte counter events since the last cut
	bytes       int64     // bytes sent since the last byte counter event
	timeInc     bool      // the timer raised the rate since the last cut

	next time.Time // pacer: when the next packet may leave (held: above)

	stats Stats
}

// Stats counts what an RP did.
type Stats struct {
	CNPs        uint64 // CNPs handled
	Cuts        uint64 // rate cuts (CNPs outside a ReduceMonitorPeriod)
	TimerEvents uint64 // rate increase timer events
	ByteEvents  uint64 // rate increase byte counter events
	Recovered   uint64 // times the rate climbed back to LineRate
}

// NewRP returns the reaction point of a new flow at line rate. cfg must
// have been normalized (Config.Normalize).
func NewRP(cfg Config) *RP {
	r := &RP{}
	r.Init(&cfg)
	return r
}

// Init resets r to a new flow at line rate under cfg, which must have been
// normalized (Config.Normalize) and must not change while r uses it; many
// RPs may share one Config.
func (r *RP) Init(cfg *Config) {
	*r = RP{cfg: cfg, rc: cfg.LineRate, rt: cfg.LineRate}
}

// Limited reports whether the flow is rate limited (it got a CNP and has
// not climbed back to line rate).
func (r *RP) Limited() bool { return r.limited }

// Rate returns the current rate in bits/s at now (LineRate when not
// limited), after replaying the timer events due by now.
func (r *RP) Rate(now time.Time) float64 {
	r.advance(now)
	return r.rc
}

// TargetRate returns the target rate in bits/s.
func (r *RP) TargetRate() float64 { return r.rt }

// Alpha returns α in [0, 1] at now.
func (r *RP) Alpha(now time.Time) float64 {
	r.advance(now)
	return r.alpha
}

// Stats returns the RP's counters.
func (r *RP) Stats() Stats { return r.stats }

// advance replays the α periods and increase timer events due by now.
func (r *RP) advance(now time.Time) {
	if !r.limited {
		return
	}
	r.advanceAlpha(now)
	if r.cfg.TimeReset <= 0 {
		return
	}
	for steps := 0; now.Sub(r.timerAt) >= r.cfg.TimeReset; steps++ {
		if steps == maxIncreaseSteps {
			r.recover()
			return
		}
		r.timerAt = r.timerAt.Add(r.cfg.TimeReset)
		r.tCount++
		r.timeInc = true
		r.stats.TimerEvents++
		r.increase()
		if !r.limited {
			return
		}
	}
}

// advanceAlpha applies the α updates of the periods that ended by now.
func (r *RP) advanceAlpha(now time.Time) {
	p := r.cfg.AlphaPeriod
	if p <= 0 {
		return
	}
	k := int64(now.Sub(r.alphaAt) / p)
	if k <= 0 {
		return
	}
	g := float64(r.cfg.G) / 1024
	if r.cnpInPeriod {
		r.alpha = g*r.alpha + (1 - g)
		r.cnpInPeriod = false
		k--
		r.alphaAt = r.alphaAt.Add(p)
	}
	if k > 0 {
		if k > 1<<20 {
			r.alpha = 0
		} else {
			r.alpha *= math.Pow(g, float64(k))
		}
		r.alphaAt = r.alphaAt.Add(time.Duration(k) * p)
	}
}

// increase is one rate increase event (timer or byte counter): fast
// recovery, additive increase or hyper increase by the event counts.
func (r *RP) increase() {
	f := r.cfg.Threshold
	lo, hi := min(r.tCount, r.bCount), max(r.tCount, r.bCount)
	if r.cfg.ByteReset < 0 {
		lo, hi = r.tCount, r.tCount // no byte counter: the timer alone decides
		if hi >= f {
			lo = f - 1 // additive, never hyper, as with one counter in QCN
		}
	}
	switch {
	case hi < f: // fast recovery: towards the target
	case lo < f: // additive increase
		r.rt += r.cfg.AIRate
	default: // hyper increase
		r.rt += float64(lo-f+1) * r.cfg.HAIRate
	}
	if r.rt > r.cfg.LineRate {
		r.rt = r.cfg.LineRate
	}
	r.rc = (r.rt + r.rc) / 2
	if r.cfg.LineRate-r.rc < r.cfg.LineRate*1e-6 {
		r.recover()
	}
}

// recover ends rate limiting: the flow is back at line rate.
func (r *RP) recover() {
	r.limited = false
	r.rc, r.rt = r.cfg.LineRate, r.cfg.LineRate
	r.stats.Recovered++
}

// CNP handles a congestion notification received at now. It reports
// false, and changes nothing, when the RP is disabled.
func (r *RP) CNP(now time.Time) bool {
	if r.cfg.Disable {
		return false
	}
	r.stats.CNPs++
	first := !r.limited
	if first {
		r.limited = true
		r.alpha = float64(r.cfg.InitialAlpha) / 1024
		r.alphaAt = now
		r.cnpInPeriod = false
		r.rc, r.rt = r.cfg.LineRate, r.cfg.LineRate
		if r.cfg.RateOnFirstCNP > 0 {
			r.rc, r.rt = r.cfg.RateOnFirstCNP, r.cfg.RateOnFirstCNP
			r.cnpInPeriod = true
			r.resetIncrease(now)
			r.lastCut = now
			r.stats.Cuts++
			return true
		}
	} else {
		r.advance(now)
		if !r.limited { // the timer replay climbed back to line rate
			return r.CNP(now)
		}
		if now.Sub(r.lastCut) < r.cfg.ReduceMonitorPeriod {
			r.cnpInPeriod = true
			return true
		}
	}
	r.cut()
	r.cnpInPeriod = true
	r.resetIncrease(now)
	r.lastCut = now
	return true
}

// cut is the rate reduction of one CNP, with the current α.
func (r *RP) cut() {
	r.stats.Cuts++
	if !r.cfg.ClampTargetRate || r.timeInc {
		r.rt = r.rc
	}
	dec := r.alpha * 1024 / float64(uint64(1)<<r.cfg.GD)
	if floor := 1 - float64(r.cfg.MinDecFac)/100; dec > floor {
		dec = floor
	}
	if dec > 1 {
		dec = 1
	}
	r.rc *= 1 - dec
	if r.rc < r.cfg.MinRate {
		r.rc = r.cfg.MinRate
	}
	if r.rt < r.rc {
		r.rt = r.rc
	}
}

// resetIncrease restarts the increase timer and byte counter after a cut.
func (r *RP) resetIncrease(now time.Time) {
	r.tCount, r.bCount, r.bytes = 0, 0, 0
	r.timerAt = now
	r.timeInc = false
}

// Sent accounts n bytes (an IP datagram) that left at now: the byte
// counter and the pacer.
func (r *RP) Sent(now time.Time, n int) {
	if !r.limited {
		return
	}
	r.advance(now)
	if !r.limited {
		return
	}
	if r.cfg.ByteReset > 0 {
		r.bytes += int64(n)
		for r.bytes >= r.cfg.ByteReset && r.limited {
			r.bytes -= r.cfg.ByteReset
			r.bCount++
			r.stats.ByteEvents++
			r.increase()
		}
	}
	if !r.limited {
		return
	}
	// The pacer: the next packet may leave once this one's time at the
	// current rate has passed. An idle flow keeps at most Burst of credit.
	// A flow the pacer held back keeps what its wake-up came late by, up
	// to CatchUp: software timers fire late (Go's by up to a millisecond
	// on an idle machine), and the rate is kept on average by sending what
	// the delay owed at once.
	floor := now.Add(-r.cfg.Burst)
	if r.held {
		floor = now.Add(-max(r.cfg.Burst, r.cfg.CatchUp))
	}
	if r.next.Before(floor) {
		r.next = floor
	}
	r.next = r.next.Add(time.Duration(float64(n) * 8 / r.rc * 1e9))
}

// Idle tells the pacer the flow has nothing more to send: the next packet
// after a pause gets Burst of credit, not CatchUp.
func (r *RP) Idle() { r.held = false }

// Wait returns how long the flow must wait at now before its next packet
// may leave: 0 when it may leave now. Once Wait has held the flow back, the
// flow counts as backlogged until Idle.
func (r *RP) Wait(now time.Time) time.Duration {
	if !r.limited {
		return 0
	}
	r.advance(now)
	if !r.limited {
		return 0
	}
	if d := r.next.Sub(now); d > 0 {
		r.held = true
		return d
	}
	return 0
}
