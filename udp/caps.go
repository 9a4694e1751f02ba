package udp

import (
	"errors"
	"strings"
	"time"
)

// A Link may offer more than the Link interface: optional capabilities that
// a user (transport) asks for by name, each an interface of its own as
// wireguard-go's conn offers its optional Bind methods, and all of them
// summed up by a Capabilities method as gVisor's stack.LinkEndpoint does.
// A link that wraps another (a packet capture, a test double that drops or
// records) keeps them by embedding Wrap, which forwards every capability of
// the wrapped link and reports exactly its Capabilities.

// Capabilities is a set of optional Link capabilities.
type Capabilities uint32

// The capabilities.
const (
	// CapGSO: the link implements GSOLink and GSO reports true: Send
	// hands each run of equal-size packets to one peer to the kernel as
	// one UDP GSO datagram, so a caller gains by sending long batches.
	CapGSO Capabilities = 1 << iota
	// CapRecvInPlace: the link implements InPlaceRecvLink: Recv may hand
	// out packets as slices of the link's own memory (GRO), without a copy.
	CapRecvInPlace
	// CapPoll: the link implements PollLink: any goroutine may poll it
	// (TryRecv), a blocked Recv can be woken, and it has a busy-poll
	// budget.
	CapPoll
)

// String lists the capabilities by name ("gso|recv-in-place|poll"; "none").
func (c Capabilities) String() string {
	var s []string
	for _, n := range []struct {
		c    Capabilities
		name string
	}{{CapGSO, "gso"}, {CapRecvInPlace, "recv-in-place"}, {CapPoll, "poll"}} {
		if c&n.c != 0 {
			s = append(s, n.name)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "|")
}

// CapabilityLink is a Link that states its capabilities. A link that does
// not is judged by the interfaces it implements (CapabilitiesOf).
type CapabilityLink interface {
	Link
	// Capabilities returns the capabilities the link really has; for each
	// one, the link implements its interface.
	Capabilities() Capabilities
}

// GSOLink is a Link that may send with UDP GSO (UDP_SEGMENT).
type GSOLink interface {
	Link
	// GSO reports whether Send uses UDP GSO.
	GSO() bool
}

// InPlaceRecvLink is a Link that can hand received packets out in place.
type InPlaceRecvLink interface {
	Link
	// SetRecvInPlace lets Recv (and TryRecv) set a packet's Buf to a
	// slice of the link's own receive memory instead of copying into the
	// caller's buffer; the slice stays valid until the next Recv or
	// TryRecv. The caller must put its own buffers back before each call.
	SetRecvInPlace(on bool)
}

// PollLink is a Link that any goroutine may poll.
type PollLink interface {
	Link
	// TryRecv is Recv without blocking: it returns 0, nil when nothing is
	// waiting.
	TryRecv(pkts []Packet) (int, error)
	// WakeRecv makes a Recv blocked in another goroutine return (0, nil).
	WakeRecv()
	// BusyPoll is how long a receiver should poll before it blocks
	// (0: not at all).
	BusyPoll() time.Duration
}

// BacklogLink is a Link that can tell whether received datagrams wait in
// the kernel, not yet read by Recv (SocketLink, RawLink). A transport asks
// when a local ACK timer expires: datagrams waiting unread mean this
// process is behind on its input, and the ACK may be among them.
type BacklogLink interface {
	Link
	// RecvBacklog reports whether datagrams wait unread (one system
	// call; not for the data path).
	RecvBacklog() bool
}

// ErrNoCapability is returned by Wrap's methods of a capability the
// wrapped link does not have.
var ErrNoCapability = errors.New("udp: the wrapped link does not have this capability")

// CapabilitiesOf returns l's capabilities: what its Capabilities method
// says if it has one, else those whose interfaces it implements (and for
// CapGSO, whose GSO method reports true).
func CapabilitiesOf(l Link) Capabilities {
	if c, ok := l.(CapabilityLink); ok {
		return c.Capabilities()
	}
	var c Capabilities
	if g, ok := l.(GSOLink); ok && g.GSO() {
		c |= CapGSO
	}
	if _, ok := l.(InPlaceRecvLink); ok {
		c |= CapRecvInPlace
	}
	if _, ok := l.(PollLink); ok {
		c |= CapPoll
	}
	return c
}

// Wrap is embedded by a Link that wraps another and overrides some of its
// methods. It forwards the Link methods and every capability method to the
// wrapped Link, and its Capabilities are the wrapped link's, so a wrapper
// takes the same paths in transport as the link it wraps. A wrapper that
// overrides Recv to see or change what arrives must override TryRecv the
// same way (the poll path receives through TryRecv), or mask CapPoll in a
// Capabilities method of its own.
type Wrap struct {
	Link
}

// Capabilities returns the wrapped link's capabilities.
func (w Wrap) Capabilities() Capabilities { return CapabilitiesOf(w.Link) }

// GSO forwards to the wrapped link (false if it is not a GSOLink).
func (w Wrap) GSO() bool {
	g, ok := w.Link.(GSOLink)
	return ok && g.GSO()
}

// SetRecvInPlace forwards to the wrapped link (nothing if it is not an
// InPlaceRecvLink).
func (w Wrap) SetRecvInPlace(on bool) {
	if l, ok := w.Link.(InPlaceRecvLink); ok {
		l.SetRecvInPlace(on)
	}
}

// TryRecv forwards to the wrapped link (ErrNoCapability if it is not a
// PollLink).
func (w Wrap) TryRecv(pkts []Packet) (int, error) {
	if l, ok := w.Link.(PollLink); ok {
		return l.TryRecv(pkts)
	}
	return 0, ErrNoCapability
}

// WakeRecv forwards to the wrapped link (nothing if it is not a PollLink).
func (w Wrap) WakeRecv() {
	if l, ok := w.Link.(PollLink); ok {
		l.WakeRecv()
	}
}

// BusyPoll forwards to the wrapped link (0 if it is not a PollLink).
func (w Wrap) BusyPoll() time.Duration {
	if l, ok := w.Link.(PollLink); ok {
		return l.BusyPoll()
	}
	return 0
}

// Unwrap returns the wrapped link.
func (w Wrap) Unwrap() Link { return w.Link }

var (
	_ CapabilityLink  = Wrap{}
	_ GSOLink         = Wrap{}
	_ InPlaceRecvLink = Wrap{}
	_ PollLink        = Wrap{}
)
