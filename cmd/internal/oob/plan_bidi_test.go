package oob

import (
	"slices"
	"testing"
)

// TestPlanBidi: perftest 4.5-0.17's duplex sequences (src/*_bw.c), the same
// in both roles, and -R's from them.
func TestPlanBidi(t *testing.T) {
	// The second round of QP data (one record per QP) comes right after
	// ctx_connect, but in send_bw after one more barrier.
	head := []Step{StepVersion, StepCycleBuffer, StepCacheLine, StepMTU, StepDest, StepConnect, StepDestRound, StepSync}
	sendHead := []Step{StepVersion, StepCycleBuffer, StepCacheLine, StepMTU, StepDest, StepConnect, StepSync, StepDestRound}
	tail := []Step{StepSync, StepDone}
	for _, tt := range []PerfTest{WriteBW, ReadBW, SendBW, AtomicBW} {
		h := head
		if tt == SendBW {
			h = sendHead
		}
		one := slices.Concat(h, []Step{StepPrepare, StepSync, StepTraffic, StepReport}, tail)
		p, err := PlanBidi(tt, 1)
		if err != nil || !slices.Equal(p, one) {
			t.Errorf("%v -b: %v %v, want %v", tt, p, err, one)
		}
	}
	rw := []Step{StepPrepare, StepSync, StepTraffic, StepSync, StepReport}
	if p, _ := PlanBidi(WriteBW, 2); !slices.Equal(p, slices.Concat(head, rw, rw, tail)) {
		t.Errorf("write-bw -b -a: %v", p)
	}
	sd := []Step{StepPrepare, StepSync, StepTraffic, StepReport, StepSync}
	if p, _ := PlanBidi(SendBW, 2); !slices.Equal(p, slices.Concat(sendHead, sd, sd, tail)) {
		t.Errorf("send-bw -b -a: %v", p)
	}
	if _, err := PlanBidi(WriteLat, 1); err == nil {
		t.Error("write-lat -b: no error")
	}
	p, _ := PlanBidi(SendBW, 1)
	want := slices.Concat(sendHead[:4], []Step{StepCMSync, StepCMConnect, StepCMSync}, sendHead[4:], []Step{StepPrepare, StepSync, StepTraffic, StepReport, StepSync})
	if got := RDMACM(p); !slices.Equal(got, want) {
		t.Errorf("send-bw -b -R: %v, want %v", got, want)
	}
}
