//go:build linux

package transport

import "testing"

// TestRxStatsOnlyWhenOn: devices made while rxStatsOn is false (as in
// every program but a test binary) have no stats and still move
// messages; made with it on, they count their batches.
func TestRxStatsOnlyWhenOn(t *testing.T) {
	defer func() { rxStatsOn = true }()
	for _, on := range []bool{false, true} {
		rxStatsOn = on
		s := newStackPingPong(t, "SEND", false)
		rxStatsOn = true
		err := s.round(20)
		st := s.a.dev.rx.stats
		var counted uint64
		if st != nil {
			counted = st.looped.Load() + st.waited.Load() + st.polls.Load()
		}
		s.stop()
		if err != nil {
			t.Fatalf("rxStatsOn %v: %v", on, err)
		}
		if (st != nil) != on {
			t.Fatalf("rxStatsOn %v: device has stats %v", on, st != nil)
		}
		if on && counted == 0 {
			t.Fatal("rxStatsOn: 20 round trips and no batch counted")
		}
	}
}
