package rdmacm

import (
	"testing"

	"github.com/gorocev2/rocev2/cm"
)

// TestLocalIDWraps: the local communication ID counter goes round 2^32
// (2^24 under a shared address's tag) and never hands out 0 or an ID a
// known connection still holds — one in TimeWait included, as m.conns
// keeps a connection until its TimeWait ends (finishLocked).
func TestLocalIDWraps(t *testing.T) {
	m := &Manager{conns: map[uint32]*Conn{}, nextID: 0xfffffffe, idXor: 0}
	m.conns[0xffffffff] = &Conn{state: stTimeWait}
	var got []uint32
	for range 3 {
		id := m.newLocalID()
		got = append(got, id)
		m.conns[id] = &Conn{}
	}
	if want := []uint32{0xfffffffe, 1, 2}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("local IDs %#x, want %#x (0xffffffff in TimeWait, 0 never)", got, want)
	}

	// On a shared address the top byte is the member's tag: the counter's
	// low 24 bits go round, still skipping the held IDs.
	m = &Manager{conns: map[uint32]*Conn{}, nextID: 0x00fffffe, tag: cm.CommIDTag{Tag: 0x85000000, Mask: 0xff000000}}
	m.conns[0x85ffffff] = &Conn{state: stTimeWait}
	m.conns[0x85000000] = &Conn{}
	got = got[:0]
	for range 2 {
		id := m.newLocalID()
		got = append(got, id)
		m.conns[id] = &Conn{}
	}
	if want := []uint32{0x85fffffe, 0x85000001}; got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("tagged local IDs %#x, want %#x", got, want)
	}
}
