package nvmf

import (
	"testing"
	"time"
)

// TestCtrlIDsRunOut: controller IDs go round [1, 0xffef] skipping live
// ones and the reserved 0xfff0-0xffff, and when every one is live (a
// target whose MaxControllers is above 0xffef) the Connect is refused
// (newCtrlID reports false). Before, the search looped for ever holding
// the target's mutex: the whole target hung.
func TestCtrlIDsRunOut(t *testing.T) {
	tg := &Target{ctrls: map[uint16]*tctrl{}, nextID: 0xffee}
	tg.ctrls[1] = &tctrl{}
	var got []uint16
	for range 3 {
		id, ok := tg.newCtrlID()
		if !ok {
			t.Fatal("no controller ID with 0xffee free")
		}
		got = append(got, id)
		tg.ctrls[id] = &tctrl{}
	}
	if want := []uint16{0xffee, 0xffef, 2}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("controller IDs %#x, want %#x", got, want)
	}
	for id := uint16(1); id <= maxCNTLID; id++ {
		tg.ctrls[id] = &tctrl{}
	}
	done := make(chan bool, 1)
	go func() { _, ok := tg.newCtrlID(); done <- ok }()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("a controller ID handed out with all 0xffef live")
		}
	case <-time.After(30 * time.Second): // a hang, not a timing: the search is 64 K map lookups
		t.Fatal("newCtrlID did not return with every controller ID live")
	}
	delete(tg.ctrls, 0x1234)
	if id, ok := tg.newCtrlID(); !ok || id != 0x1234 {
		t.Fatalf("with only 0x1234 free: %#x, %v", id, ok)
	}
}
