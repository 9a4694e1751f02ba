package dcqcn

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func mustRP(t testing.TB, c Config) *RP {
	t.Helper()
	n, err := c.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return NewRP(n)
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

func TestNormalizeDefaults(t *testing.T) {
	c, err := Config{}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{LineRate: 100e9, MinRate: 1e6, AIRate: 5e6, HAIRate: 50e6, TimeReset: 300 * time.Microsecond,
		ByteReset: 32767, Threshold: 1, G: 1019, AlphaPeriod: time.Microsecond, InitialAlpha: 1023, GD: 11,
		MinDecFac: 50, ReduceMonitorPeriod: 4 * time.Microsecond, Burst: 16 * time.Microsecond, CatchUp: 2 * time.Millisecond}
	if c != want {
		t.Fatalf("defaults\n got %+v\nwant %+v", c, want)
	}
}

func TestNormalizeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"LineRate", Config{LineRate: -1}},
		{"MinRate", Config{LineRate: 1e9, MinRate: 2e9}},
		{"RateOnFirstCNP", Config{RateOnFirstCNP: 200e9}},
		{"G", Config{G: 1024}},
		{"InitialAlpha", Config{InitialAlpha: 2000}},
		{"GD", Config{GD: 5}},
		{"MinDecFac", Config{MinDecFac: 101}},
		{"Threshold", Config{Threshold: -1}},
		{"Burst", Config{Burst: -1}},
		{"LineRate", Config{LineRate: math.NaN()}},
	} {
		if _, err := tc.c.Normalize(); err == nil {
			t.Errorf("%s: %+v accepted", tc.name, tc.c)
		} else if !contains(err.Error(), tc.name) {
			t.Errorf("%s: error %q does not name the field", tc.name, err)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestRateSequence follows one flow through a cut, fast recovery, additive
// increase and the return to line rate, against values computed by hand:
// cut factor 1 − α/2 with α = 1023/1024, then rc ← (rt + rc)/2 per timer
// event, rt + 5 Mb/s from the 5th event (Threshold 5, no byte counter).
func TestRateSequence(t *testing.T) {
	r := mustRP(t, Config{LineRate: 10e9, Threshold: 5, ByteReset: -1})
	if r.Limited() || r.Rate(t0) != 10e9 || r.Wait(t0) != 0 {
		t.Fatalf("new flow: limited %v rate %v", r.Limited(), r.Rate(t0))
	}
	if !r.CNP(t0) {
		t.Fatal("CNP not handled")
	}
	steps := []float64{
		5004882812.5,                                                     // the cut: 10e9 × (1 − 1023/2048)
		7502441406.25, 8751220703.125, 9375610351.5625, 9687805175.78125, // fast recovery
		9843902587.890625, 9921951293.945312, 9960975646.972656, // additive: rt stays at line rate
	}
	for i, want := range steps {
		now := at(time.Duration(i) * 300 * time.Microsecond)
		if got := r.Rate(now); !near(got, want) {
			t.Fatalf("after %d timer events: rate %.3f, want %.3f", i, got, want)
		}
		if r.TargetRate() != 10e9 {
			t.Fatalf("after %d timer events: target %v, want 10e9", i, r.TargetRate())
		}
	}
	// 18 events leave it 1e-6 short of line rate; the 19th brings it back.
	if got := r.Rate(at(18 * 300 * time.Microsecond)); !near(got, 9999980945.140123) || !r.Limited() {
		t.Fatalf("after 18 events: rate %.3f limited %v", got, r.Limited())
	}
	if got := r.Rate(at(19 * 300 * time.Microsecond)); got != 10e9 || r.Limited() {
		t.Fatalf("after 19 events: rate %.3f limited %v, want line rate, unlimited", got, r.Limited())
	}
	if s := r.Stats(); s.CNPs != 1 || s.Cuts != 1 || s.TimerEvents != 19 || s.Recovered != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestAlphaSequence checks α's update: α ← g·α + (1 − g) for a period
// with a CNP, α ← g·α for one without, g = 1019/1024.
func TestAlphaSequence(t *testing.T) {
	r := mustRP(t, Config{})
	r.CNP(t0)
	if got := r.Alpha(t0); got != 1023.0/1024 {
		t.Fatalf("α at the first CNP %v, want 1023/1024", got)
	}
	const a1 = 0.999028205871582 // 1019/1024 × 1023/1024 + 5/1024
	if got := r.Alpha(at(time.Microsecond)); !near(got, a1) {
		t.Fatalf("α after 1 µs %v, want %v", got, a1)
	}
	if got := r.Alpha(at(11 * time.Microsecond)); !near(got, 0.9513055350371648) {
		t.Fatalf("α after 11 µs %v, want a1·g^10", got)
	}
	// A second CNP 10 µs after the first: outside the 4 µs monitor period,
	// it cuts with the α of that moment (a1·g^9).
	r2 := mustRP(t, Config{LineRate: 10e9})
	r2.CNP(t0)
	rc := r2.Rate(t0)
	r2.CNP(at(10 * time.Microsecond))
	a := 0.9559733737763069
	if got, want := r2.Rate(at(10*time.Microsecond)), rc*(1-a/2); !near(got, want) {
		t.Fatalf("second cut: rate %v, want %v", got, want)
	}
	if got := r2.TargetRate(); !near(got, rc) {
		t.Fatalf("second cut: target %v, want the rate before the cut %v", got, rc)
	}
}

func TestMonitorPeriodAndFloor(t *testing.T) {
	r := mustRP(t, Config{LineRate: 10e9, MinRate: 4e9})
	r.CNP(t0)
	first := r.Rate(t0)
	r.CNP(at(2 * time.Microsecond)) // within 4 µs: α only
	if got := r.Rate(at(2 * time.Microsecond)); got != first {
		t.Fatalf("CNP inside the monitor period cut the rate: %v -> %v", first, got)
	}
	if s := r.Stats(); s.CNPs != 2 || s.Cuts != 1 {
		t.Fatalf("stats %+v, want 2 CNPs 1 cut", s)
	}
	for i := 1; i <= 5; i++ {
		r.CNP(at(time.Duration(i) * 5 * time.Microsecond))
	}
	if got := r.Rate(at(25 * time.Microsecond)); got != 4e9 {
		t.Fatalf("rate %v, want the 4e9 floor", got)
	}
	// MinDecFac 90: one cut takes at most 10 %.
	r = mustRP(t, Config{LineRate: 10e9, MinDecFac: 90})
	r.CNP(t0)
	if got := r.Rate(t0); !near(got, 9e9) {
		t.Fatalf("MinDecFac 90: rate %v, want 9e9", got)
	}
}

func TestHyperIncrease(t *testing.T) {
	// Threshold 1 (NVIDIA's default): one timer event and one byte
	// counter event make min(T, BC) = 1, hyper increase with i = 1.
	r := mustRP(t, Config{LineRate: 10e9, RateOnFirstCNP: 1e9, TimeReset: time.Millisecond, ByteReset: 1000})
	r.CNP(t0)
	if r.Rate(t0) != 1e9 || r.TargetRate() != 1e9 {
		t.Fatalf("first CNP: rate %v target %v, want RateOnFirstCNP", r.Rate(t0), r.TargetRate())
	}
	r.Sent(at(time.Microsecond), 1000) // BC=1, T=0: additive
	if got := r.TargetRate(); got != 1e9+5e6 {
		t.Fatalf("after a byte event: target %v, want +AI", got)
	}
	rc := r.Rate(at(time.Microsecond))
	if !near(rc, (1e9+5e6+1e9)/2) {
		t.Fatalf("after a byte event: rate %v", rc)
	}
	r.Rate(at(time.Millisecond)) // T=1, BC=1: hyper, i = 1
	if got := r.TargetRate(); got != 1e9+5e6+50e6 {
		t.Fatalf("after a timer event: target %v, want +HAI", got)
	}
}

func TestDisabled(t *testing.T) {
	r := mustRP(t, Config{Disable: true, LineRate: 1e9})
	if r.CNP(t0) || r.Limited() || r.Wait(t0) != 0 {
		t.Fatal("a disabled RP reacted to a CNP")
	}
}

// TestPacer checks the bucket: at 1 Gb/s a 1250-byte datagram takes 10 µs;
// an idle flow has 16 µs of credit.
func TestPacer(t *testing.T) {
	r := mustRP(t, Config{LineRate: 10e9, RateOnFirstCNP: 1e9, TimeReset: time.Hour, ByteReset: -1})
	r.CNP(t0)
	if w := r.Wait(t0); w != 0 {
		t.Fatalf("wait before sending %v", w)
	}
	r.Sent(t0, 1250) // uses 10 of the 16 µs credit
	if w := r.Wait(t0); w != 0 {
		t.Fatalf("wait after one packet %v, want 0 (credit left)", w)
	}
	r.Sent(t0, 1250)
	if w := r.Wait(t0); w != 4*time.Microsecond {
		t.Fatalf("wait after two packets %v, want 4µs", w)
	}
	if w := r.Wait(at(4 * time.Microsecond)); w != 0 {
		t.Fatalf("wait at the departure time %v", w)
	}
	// Steady state: one packet per 10 µs.
	now := at(4 * time.Microsecond)
	for i := 0; i < 100; i++ {
		r.Sent(now, 1250)
		now = now.Add(r.Wait(now))
	}
	if got := now.Sub(at(4 * time.Microsecond)); got != 1000*time.Microsecond {
		t.Fatalf("100 packets took %v, want 1ms", got)
	}
}

// TestIdleRecovers: a flow idle for a long time is back at line rate after
// a bounded replay.
func TestIdleRecovers(t *testing.T) {
	r := mustRP(t, Config{LineRate: 100e9, MinRate: 1e6})
	for i := 0; i < 40; i++ {
		r.CNP(at(time.Duration(i) * 10 * time.Microsecond))
	}
	if !r.Limited() || r.Rate(at(400*time.Microsecond)) > 1e6*1.01 {
		t.Fatalf("rate %v after 40 cuts", r.Rate(at(400*time.Microsecond)))
	}
	if got := r.Rate(at(time.Hour)); got != 100e9 || r.Limited() {
		t.Fatalf("after an hour idle: rate %v limited %v", got, r.Limited())
	}
}

func FuzzRP(f *testing.F) {
	f.Add(uint64(1), []byte{0, 1, 2, 3, 4, 5})
	f.Fuzz(func(t *testing.T, seed uint64, ops []byte) {
		r := mustRP(t, Config{LineRate: 10e9, MinRate: 1e6, ByteReset: int64(seed%5000) + 1})
		now := t0
		for _, op := range ops {
			now = now.Add(time.Duration(op&0x3f) * time.Microsecond)
			switch op >> 6 {
			case 0:
				r.CNP(now)
			case 1:
				r.Sent(now, int(op)*40)
			case 2:
				r.Wait(now)
			default:
				r.Alpha(now)
			}
			rate := r.Rate(now)
			if !(rate >= 1e6 && rate <= 10e9) || r.TargetRate() < rate-1 || r.TargetRate() > 10e9 {
				t.Fatalf("rate %v target %v out of [MinRate, LineRate]", rate, r.TargetRate())
			}
			if a := r.Alpha(now); !(a >= 0 && a <= 1) {
				t.Fatalf("α %v", a)
			}
		}
	})
}

// BenchmarkPacer measures the pacer's arithmetic per packet against a
// plain time.Time addition.
func BenchmarkPacer(b *testing.B) {
	r := mustRP(b, Config{LineRate: 10e9, RateOnFirstCNP: 1e9})
	r.CNP(t0)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		r.Sent(now, 1078)
		now = now.Add(r.Wait(now))
	}
}
