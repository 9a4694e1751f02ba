package transport

import "testing"

// TestOnClose: the functions registered with OnClose run once, at the
// start of Close, while the device still works (its QPs still in RTS);
// one unregistered before does not run; none registers on a closed device.
func TestOnClose(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	var ran, stopped int
	var stateSeen QPState
	a.dev.OnClose(func() {
		ran++
		stateSeen = a.qp.State()
		if _, err := a.dev.GSI(); err != nil {
			t.Errorf("GSI from an OnClose function: %v", err)
		}
	})
	stop := a.dev.OnClose(func() { stopped++ })
	if !stop() {
		t.Error("stop before Close reported false")
	}
	if stop() {
		t.Error("second stop reported true")
	}
	late := a.dev.OnClose(func() {})
	a.dev.Close()
	a.dev.Close()
	if ran != 1 || stopped != 0 {
		t.Fatalf("ran %d times, the stopped one %d times; want 1 and 0", ran, stopped)
	}
	if stateSeen != QPSRTS {
		t.Errorf("QP state inside the OnClose function: %v, want RTS", stateSeen)
	}
	if late() {
		t.Error("stop after Close reported true")
	}
	after := 0
	if a.dev.OnClose(func() { after++ })() {
		t.Error("OnClose on a closed device registered")
	}
	a.dev.Close()
	if after != 0 {
		t.Error("a function registered after Close ran")
	}
}
