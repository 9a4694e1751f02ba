package transport

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// capableLink is an in-memory link with every optional capability
// (udp.GSOLink, udp.InPlaceRecvLink, udp.PollLink).
type capableLink struct {
	*memnet.MemLink
	inPlace bool
	closed  atomic.Bool
}

func (l *capableLink) Close() error { l.closed.Store(true); return l.MemLink.Close() }

func (l *capableLink) GSO() bool              { return true }
func (l *capableLink) SetRecvInPlace(on bool) { l.inPlace = on }
func (l *capableLink) TryRecv(pkts []udp.Packet) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	return 0, nil
}
func (l *capableLink) WakeRecv()               {}
func (l *capableLink) BusyPoll() time.Duration { return time.Millisecond }

// sendCounter is a test double in the style of this package's (a Link
// that sees every Send, recording how many packets each carried), built
// on udp.Wrap so it keeps what it wraps.
type sendCounter struct {
	udp.Wrap
	mu    sync.Mutex
	sizes []int // packets per Send, in order
}

func (s *sendCounter) Send(pkts []udp.Packet) error {
	s.mu.Lock()
	s.sizes = append(s.sizes, len(pkts))
	s.mu.Unlock()
	return s.Link.Send(pkts)
}

// sends returns the packet counts of the Sends so far.
func (s *sendCounter) sends() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sizes)
}

// TestWrappedLinkCapabilities: a device over a link wrapped by a capture or
// a test double takes the same paths as over the link itself — GSO-sized
// output batches, receiving in place, polling waiters — because it asks
// for the capabilities by name and the wrapper forwards them.
func TestWrappedLinkCapabilities(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	for i, wrap := range []func(udp.Link) udp.Link{
		func(l udp.Link) udp.Link { return l },
		func(l udp.Link) udp.Link { return &sendCounter{Wrap: udp.Wrap{Link: l}} },
		func(l udp.Link) udp.Link { return udp.Wrap{Link: &sendCounter{Wrap: udp.Wrap{Link: l}}} },
	} {
		ml, err := n.Link(netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}))
		if err != nil {
			t.Fatal(err)
		}
		inner := &capableLink{MemLink: ml}
		d, err := NewDevice(wrap(inner), DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		// Set by NewDevice before its receive goroutine starts, never
		// changed (rx.own is the receive goroutine's while it receives).
		pl, wl := d.rx.pl, d.rx.wl
		if d.outMax != outBatchMax || pl == nil || wl == nil || d.rx.spin != time.Millisecond || !inner.inPlace {
			t.Errorf("wrapping %d: output batch %d (GSO: %d), poller %v, waiter link %v, spin %v, in place %v",
				i, d.outMax, outBatchMax, pl != nil, wl != nil, d.rx.spin, inner.inPlace)
		}
		d.Close()
	}
	// Without the capabilities, none of it.
	ml, _ := n.Link(netip.MustParseAddr("192.0.2.20"))
	d, err := NewDevice(&sendCounter{Wrap: udp.Wrap{Link: ml}}, DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.outMax != outBatch || d.rx.pl != nil || d.rx.wl != nil {
		t.Errorf("plain link: output batch %d, poller %v", d.outMax, d.rx.pl != nil)
	}
}
