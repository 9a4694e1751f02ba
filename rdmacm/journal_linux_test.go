//go:build linux

package rdmacm

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// realLink hides that a memnet link is simulated (no Unwrap, no
// Simulated), so that a manager on it keeps a journal as on a socket.
type realLink struct{ udp.Link }

// TestJournalReplay: a process "killed" with an established connection
// (its manager's lock dropped, its records left) is spoken for by the
// next manager on its address: the peer gets the DREQ at once and answers
// it; without the journal it would wait for keep-alive.
func TestJournalReplay(t *testing.T) {
	t.Setenv(JournalEnv, t.TempDir())
	n := memnet.NewMemNetwork(memnet.Faults{})
	real := func(l udp.Link) udp.Link { return realLink{l} }
	db := newDev(t, n, addrB, nil)
	acc := serve(t, db)
	life1 := newDev(t, n, addrA, real)
	if _, err := Dial(ctxT(t, 5*time.Second), life1, netip.AddrPortFrom(addrB, 4420), &fast); err != nil {
		t.Fatal(err)
	}
	srv := <-acc
	m1 := managerOf(t, life1)
	if dir, err := m1.Journal(); err != nil || dir == "" {
		t.Fatalf("first life keeps no journal: %q %v", dir, err)
	}
	if _, err := managerOf(t, db).Journal(); err == nil {
		t.Error("a manager on a simulated network keeps a journal")
	}
	m1.jr.Abandon() // SIGKILL: the lock goes, the records stay
	killDev(life1)
	select {
	case <-srv.Done():
		t.Fatalf("the server's connection ended before the restart: %v", srv.Err())
	case <-time.After(50 * time.Millisecond):
	}
	life2 := newDev(t, n, addrA, real)
	if _, err := NewManager(life2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Done():
	case <-time.After(toldWithin):
		t.Fatal("the restart did not speak for the killed process's connection")
	}
	if !errors.Is(srv.Err(), ErrDisconnected) {
		t.Errorf("server connection ended with %v, want ErrDisconnected", srv.Err())
	}
	m2 := managerOf(t, life2)
	waitFor(t, toldWithin, func() bool { return m2.Stats().DREPForDead == 1 }, "the DREP of the dead connection's DREQ")
	if s := m2.Stats(); s.DREQForDead != 1 || s.Unknown != 0 || s.Retransmits != 0 {
		t.Errorf("restart: DREQForDead %d Unknown %d Retransmits %d, want 1, 0, 0", s.DREQForDead, s.Unknown, s.Retransmits)
	}
}
