package transport

import (
	"testing"
	"time"
)

// TestConcurrentCloseWaitsForOnClose: a second Close, concurrent with one
// running the OnClose functions, waits for them: inside them the device
// still works (QP in RTS, GSI open) however many Close calls come.
func TestConcurrentCloseWaitsForOnClose(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	started, release := make(chan struct{}), make(chan struct{})
	var stateInHook QPState
	var gsiErr error
	a.dev.OnClose(func() {
		close(started)
		<-release
		stateInHook = a.qp.State()
		_, gsiErr = a.dev.GSI()
	})
	first := make(chan struct{})
	go func() { a.dev.Close(); close(first) }()
	<-started
	second := make(chan struct{})
	go func() { a.dev.Close(); close(second) }()
	select {
	case <-second:
		t.Error("second Close returned while the first Close's OnClose function still runs")
	case <-time.After(2 * time.Second):
	}
	close(release)
	<-first
	if stateInHook != QPSRTS || gsiErr != nil {
		t.Errorf("BUG: inside the OnClose function the device no longer works: QP state %v, GSI err %v", stateInHook, gsiErr)
	}
}
