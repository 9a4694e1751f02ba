package udp_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// capLink is an in-memory link with every optional capability, recording
// the calls that reach it.
type capLink struct {
	*memnet.MemLink
	inPlace bool
	tries   int
	wakes   int
}

func (l *capLink) GSO() bool                              { return true }
func (l *capLink) SetRecvInPlace(on bool)                 { l.inPlace = on }
func (l *capLink) TryRecv(pkts []udp.Packet) (int, error) { l.tries++; return 0, nil }
func (l *capLink) WakeRecv()                              { l.wakes++ }
func (l *capLink) BusyPoll() time.Duration                { return 7 * time.Microsecond }

// recorder is a test double that overrides Send and keeps the rest.
type recorder struct {
	udp.Wrap
	sends int
}

func (r *recorder) Send(pkts []udp.Packet) error { r.sends++; return r.Link.Send(pkts) }

// masked hides polling from what it wraps.
type masked struct{ udp.Wrap }

func (m masked) Capabilities() udp.Capabilities { return m.Wrap.Capabilities() &^ udp.CapPoll }

func TestCapabilities(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	ml, err := n.Link(netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	all := udp.CapGSO | udp.CapRecvInPlace | udp.CapPoll
	inner := &capLink{MemLink: ml}
	rec := &recorder{Wrap: udp.Wrap{Link: inner}}
	twice := udp.Wrap{Link: rec}
	tests := []struct {
		name string
		l    udp.Link
		want udp.Capabilities
	}{
		// A receive that changes only the slots it returns is the
		// link's own: a wrapper may override Recv (never forwarded).
		{"mem link", ml, udp.CapRecvPrefix},
		{"capable link", inner, all | udp.CapRecvPrefix},
		{"wrapped", rec, all},
		{"wrapped twice", twice, all},
		{"wrapped mem link", udp.Wrap{Link: ml}, 0},
		{"masked", masked{udp.Wrap{Link: inner}}, udp.CapGSO | udp.CapRecvInPlace},
	}
	for _, tt := range tests {
		if got := udp.CapabilitiesOf(tt.l); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	// The calls reach the capable link through two wrappers.
	var pl udp.PollLink = twice
	twice.SetRecvInPlace(true)
	pl.TryRecv(nil)
	pl.WakeRecv()
	if !inner.inPlace || inner.tries != 1 || inner.wakes != 1 || pl.BusyPoll() != 7*time.Microsecond || !twice.GSO() {
		t.Errorf("forwarding: in place %v, tries %d, wakes %d, busy poll %v", inner.inPlace, inner.tries, inner.wakes, pl.BusyPoll())
	}
	// A wrapped link without a capability says so.
	w := udp.Wrap{Link: ml}
	if _, err := w.TryRecv(nil); !errors.Is(err, udp.ErrNoCapability) {
		t.Errorf("TryRecv of a mem link: %v", err)
	}
	if w.GSO() || w.BusyPoll() != 0 {
		t.Error("a wrapped mem link claims GSO or busy polling")
	}
	w.SetRecvInPlace(true)
	w.WakeRecv()
	if got := all.String(); got != "gso|recv-in-place|poll" {
		t.Errorf("String = %q", got)
	}
	if got := udp.Capabilities(0).String(); got != "none" {
		t.Errorf("String = %q", got)
	}
}
