package rdmacm

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// newManager starts dev's manager.
func newManager(t *testing.T, dev *transport.Device) *Manager {
	t.Helper()
	m, err := NewManager(dev)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// acceptOne accepts one connection on l in the background.
func acceptOne(t *testing.T, l *Listener) <-chan *Conn {
	t.Helper()
	ch := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(ctxT(t, 5*time.Second))
		if err != nil {
			t.Errorf("Accept on %v: %v", l.Addr(), err)
		}
		ch <- c
	}()
	return ch
}

// dialAccept connects m to the listener l (on another manager's device)
// and returns both ends.
func dialAccept(t *testing.T, m *Manager, l *Listener) (active, passive *Conn) {
	t.Helper()
	acc := acceptOne(t, l)
	c, err := m.Dial(ctxT(t, 5*time.Second), l.Addr(), &fast)
	if err != nil {
		t.Fatalf("Dial %v from %v: %v", l.Addr(), m.Device().Addr(), err)
	}
	p := <-acc
	if p == nil {
		t.FailNow()
	}
	return c, p
}

// TestManagersIndependent: two managers of two devices in one process keep
// their connections, listeners and counters apart: each listens on the
// same port, each dials the other, each counts its own; closing one ends
// its connections (ErrClosed, CauseManagerClosed; their peers, the
// other's, told by DREQ) and nothing else of the other, whose listener
// goes on accepting, and its device takes a new
// manager. A device has one manager: NewManager on a device that has one
// (explicit, or the one the package-level functions started) fails with
// ErrInUse, and the package-level functions use an explicit one.
func TestManagersIndependent(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	addrC := netip.MustParseAddr("192.0.2.3")
	da, db, dc := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil), newDev(t, n, addrC, nil)
	ma, mb := newManager(t, da), newManager(t, db)
	if ma.Device() != da || mb.Device() != db {
		t.Fatal("Device() is not the manager's device")
	}
	if _, err := NewManager(da); !errors.Is(err, ErrInUse) || strings.Contains(err.Error(), "port") ||
		!strings.Contains(err.Error(), "has a connection manager already") {
		t.Fatalf("second NewManager on a device: %v, want ErrInUse saying the device has a manager (no port is involved)", err)
	}
	lo := &ListenOptions{Options: fast}
	la, err := ma.Listen(7174, lo)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := mb.Listen(7174, lo)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	if la.Addr() != netip.AddrPortFrom(addrA, 7174) || lb.Addr() != netip.AddrPortFrom(addrB, 7174) {
		t.Fatalf("listeners on %v and %v", la.Addr(), lb.Addr())
	}
	// The package-level Listen on da is ma's: the port is taken.
	if _, err := Listen(da, 7174, nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("package-level Listen on a port ma listens on: %v, want ErrInUse", err)
	}
	ab, ba := dialAccept(t, ma, lb)
	ac, ca := dialAccept(t, mb, la)
	for _, c := range []struct {
		name string
		m    *Manager
	}{{"a", ma}, {"b", mb}} {
		s := c.m.Stats()
		if s.Established != 2 || s.Conns != 2 {
			t.Errorf("manager %s: %d established, %d held; want 2 and 2 (one dialed, one accepted)", c.name, s.Established, s.Conns)
		}
		if d := StatsOf(c.m.Device()); d.Established != s.Established || d.Conns != s.Conns {
			t.Errorf("manager %s: StatsOf its device (%d established, %d held) is not its Stats", c.name, d.Established, d.Conns)
		}
	}

	// Closing ma ends its two connections and its listener, not mb's.
	if err := ma.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ma.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, c := range []*Conn{ab, ca} {
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("a connection of the closed manager is still up")
		}
		if !errors.Is(c.Err(), ErrClosed) || errors.Is(c.Err(), transport.ErrClosed) {
			t.Errorf("connection of the closed manager: %v, want ErrClosed (and not the device's)", c.Err())
		}
	}
	if _, err := la.Accept(ctxT(t, time.Second)); !errors.Is(err, ErrClosed) {
		t.Errorf("Accept on the closed manager's listener: %v, want ErrClosed", err)
	}
	if _, err := ma.Dial(ctxT(t, time.Second), lb.Addr(), &fast); !errors.Is(err, ErrClosed) {
		t.Errorf("Dial on a closed manager: %v, want ErrClosed", err)
	}
	if got := ma.Stats().Ended[CauseManagerClosed]; got != 2 {
		t.Errorf("closed manager: %d connections ended by its Close, want 2 (%v)", got, ma.Stats().Ended)
	}
	if s := StatsOf(da); s.MADsIn != 0 || s.Conns != 0 {
		t.Errorf("StatsOf a device whose manager closed: %+v, want zero", s)
	}
	// The peers of the closed manager's connections were told (its
	// farewell DREQs); nothing else of the other manager ended.
	for _, c := range []*Conn{ba, ac} {
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a peer of the closed manager's connections was not told")
		}
		if !errors.Is(c.Err(), ErrDisconnected) {
			t.Errorf("peer of the closed manager's connection: %v, want ErrDisconnected", c.Err())
		}
	}
	if got := mb.Stats().Ended[CauseManagerClosed]; got != 0 {
		t.Errorf("the other manager counts %d connections ended by a Close", got)
	}

	// mb goes on: a third device, through the package-level Dial, connects
	// to its listener; that device's manager is then in place, and
	// NewManager on it fails.
	acc := acceptOne(t, lb)
	cc, err := Dial(ctxT(t, 5*time.Second), dc, lb.Addr(), &fast)
	if err != nil {
		t.Fatalf("package-level Dial to the open manager's listener: %v", err)
	}
	defer cc.Close()
	if p := <-acc; p == nil {
		t.FailNow()
	} else {
		defer p.Close()
	}
	if s := mb.Stats(); s.Established != 3 {
		t.Errorf("manager b: %d established, want 3", s.Established)
	}
	if s := StatsOf(dc); s.Established != 1 {
		t.Errorf("device c's default manager: %d established, want 1", s.Established)
	}
	if ManagerOf(dc) == nil || ManagerOf(dc) == mb || ManagerOf(db) != mb {
		t.Error("ManagerOf does not return the device's running manager")
	}
	if _, err := NewManager(dc); !errors.Is(err, ErrInUse) {
		t.Errorf("NewManager on a device the package-level functions use: %v, want ErrInUse", err)
	}

	// The closed manager's device takes a new one, which connects.
	ma2, err := NewManager(da)
	if err != nil {
		t.Fatalf("NewManager after Close: %v", err)
	}
	defer ma2.Close()
	c2, p2 := dialAccept(t, ma2, lb)
	defer c2.Close()
	defer p2.Close()
	if s := ma2.Stats(); s.Established != 1 || s.Ended[CauseManagerClosed] != 0 {
		t.Errorf("new manager of device a: %+v, want 1 established and its own counters", s)
	}
	ab.Close()
	ca.Close()
	ba.Close()
	ac.Close()
}

// TestManagerDeviceClose: when its device closes, a manager shuts down as
// before (ErrClosed and transport.ErrClosed, CauseDeviceClosed), and Close
// afterwards returns at once.
func TestManagerDeviceClose(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	ma, mb := newManager(t, da), newManager(t, db)
	defer mb.Close()
	lb, err := mb.Listen(7174, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	c, p := dialAccept(t, ma, lb)
	defer p.Close()
	da.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the connection outlived its device")
	}
	if !errors.Is(c.Err(), ErrClosed) || !errors.Is(c.Err(), transport.ErrClosed) {
		t.Errorf("connection of a closed device: %v", c.Err())
	}
	done := make(chan struct{})
	go func() { ma.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close of a manager whose device closed does not return")
	}
	if got := ma.Stats().Ended[CauseDeviceClosed]; got != 1 {
		t.Errorf("%d connections ended by the device's close, want 1", got)
	}
}
