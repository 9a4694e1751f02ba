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
	// CapZeroCopy: the link implements ZeroCopyLink and ZeroCopy reports
	// true: Send takes packets whose payload is held outside Buf
	// (Packet.Payload) and sends it from where it lies, with no copy
	// into a packet buffer.
	CapZeroCopy
	// CapDeferVerify: the link implements DeferVerifyLink: Recv may leave
	// the ICRC check of the packets it returns to the caller, who makes
	// it right before it uses the packet's bytes.
	CapDeferVerify
	// CapRecvPrefix: the link implements PrefixRecvLink and RecvPrefix
	// reports true: Recv and TryRecv leave every slot past the n packets
	// they return with the buffer it was given, and the n in it too
	// unless receiving in place, so a caller that puts its own buffers
	// back before each receive need only do so for the slots the last one
	// returned in place.
	CapRecvPrefix
)

// String lists the capabilities by name ("gso|recv-in-place|poll"; "none").
func (c Capabilities) String() string {
	var s []string
	for _, n := range []struct {
		c    Capabilities
		name string
	}{{CapGSO, "gso"}, {CapRecvInPlace, "recv-in-place"}, {CapPoll, "poll"}, {CapZeroCopy, "zero-copy"}, {CapDeferVerify, "defer-verify"}, {CapRecvPrefix, "recv-prefix"}} {
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

// ZeroCopyLink is a Link that may send a packet's payload from memory
// outside its Buf (Packet.Payload): a scatter-gather send whose iovecs
// point into the caller's (registered) memory for the payload and into
// Buf for the headers, pad and ICRC, the ICRC computed over the payload
// where it lies. A link without it refuses such packets (ErrPayload); the
// caller then copies the payload into Buf.
type ZeroCopyLink interface {
	Link
	// ZeroCopy reports whether Send takes packets with Payload set.
	ZeroCopy() bool
}

// DeferVerifyLink is a Link that can leave the ICRC check of what Recv
// returns to its caller: verify-then-place per packet. A receiver that
// places packet data into registered memory must never write a byte of
// a packet whose ICRC fails there, and the ICRC is known only after the
// packet's last byte, so the check must come first; made by Recv for a
// whole batch (64 packets of 4 KiB: 256 KiB), it leaves the first
// packets out of the nearest cache by the time they are placed. Made
// by the caller right before the packet's placement, the placement copy
// reads bytes the check has just brought into L1. As with
// PrefixRecvLink, a type that embeds a link directly instead of through
// Wrap inherits SetDeferVerify and VerifyICRC: if it overrides Recv or
// TryRecv to look at packets, it must not offer them (embed Wrap, which
// never forwards deferred verification).
type DeferVerifyLink interface {
	Link
	// SetDeferVerify(true) makes Recv and TryRecv return packets whose
	// ICRC is not checked yet (from the next call on): the caller must
	// call VerifyICRC on each before it uses any of its bytes, and drop
	// it if that fails. Only a caller that does so may turn it on.
	SetDeferVerify(on bool)
	// VerifyICRC checks the ICRC of a packet the last Recv or TryRecv
	// returned unchecked and reports whether it is valid; a failure is
	// counted (Stats.DropBadICRC, and the packet leaves RcvdPkts). Call
	// it from the goroutine that received the packet, before its next
	// Recv or TryRecv.
	VerifyICRC(p *Packet) bool
}

// PrefixRecvLink is a Link whose receives change only the slots they
// return, and those only within the memory they were given unless it
// hands packets out in place. A caller whose slots must hold its own
// buffers before each receive (after one in place, or one that moved
// buffers between slots) then restores the n slots the last receive
// returned when receiving in place, and none otherwise, instead of every
// slot it gave: a ping-pong receives one packet at a time into 8 or more
// slots. Like wireguard-go's optional Bind methods, it is asked for by
// name; Wrap does not forward it (a wrapper that overrides Recv may move
// packets between slots). A type that embeds a link directly (say
// *SocketLink) instead of through Wrap inherits RecvPrefix with it: if it
// overrides Recv or TryRecv, it must override RecvPrefix too (returning
// false unless its own receives keep the promise), or embed Wrap.
type PrefixRecvLink interface {
	Link
	// RecvPrefix reports whether every Recv and TryRecv that returns n
	// (error or not; 0 when it returns none) leaves each slot past n with
	// the memory its Buf was given: the same backing array, the same
	// capacity (only the slice's length may change; the bytes in it and
	// the other fields may be anything); and each slot up to n holds its
	// packet in that memory too (Buf resliced to the packet), except
	// while receiving in place (InPlaceRecvLink switched on), when Buf
	// may be the link's own memory instead.
	RecvPrefix() bool
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
	if z, ok := l.(ZeroCopyLink); ok && z.ZeroCopy() {
		c |= CapZeroCopy
	}
	if _, ok := l.(DeferVerifyLink); ok {
		c |= CapDeferVerify
	}
	if p, ok := l.(PrefixRecvLink); ok && p.RecvPrefix() {
		c |= CapRecvPrefix
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
//
// Deferred verification (CapDeferVerify) is never forwarded: a wrapper
// that looks at what Recv returns must see only packets whose ICRC was
// checked. Nor is CapRecvPrefix: a wrapper that overrides Recv (drops or
// reorders what the wrapped link returned) may leave other slots changed.
//
// Zero-copy send (CapZeroCopy) is an exception too: a wrapper that overrides
// Send and looks at Buf would see packets without their payload, so Wrap
// forwards it only when the wrapper says its Send handles Packet.Payload
// (PassPayload: it forwards such packets unchanged, or reads them through
// Packet.AppendWire).
type Wrap struct {
	Link
	// PassPayload: the wrapper's Send takes packets with Payload set
	// (see above); then the wrapped link's CapZeroCopy is forwarded.
	PassPayload bool
}

// Capabilities returns the wrapped link's capabilities (CapZeroCopy only
// with PassPayload; never CapDeferVerify or CapRecvPrefix).
func (w Wrap) Capabilities() Capabilities {
	c := CapabilitiesOf(w.Link) &^ (CapDeferVerify | CapRecvPrefix)
	if !w.PassPayload {
		c &^= CapZeroCopy
	}
	return c
}

// ZeroCopy forwards to the wrapped link when PassPayload is set (false
// otherwise, or if it is not a ZeroCopyLink).
func (w Wrap) ZeroCopy() bool {
	z, ok := w.Link.(ZeroCopyLink)
	return w.PassPayload && ok && z.ZeroCopy()
}

// GSO forwards to the wrapped link (false if it is not a GSOLink).
func (w Wrap) GSO() bool {
	g, ok := w.Link.(GSOLink)
	return ok && g.GSO()
}

// SetErrorHandler forwards to the wrapped link (nothing if it is not an
// ErrorReporter): the ICMP errors a wrapped socket link learns of still
// reach the device (dest_unreachable, a CM request ended at once).
func (w Wrap) SetErrorHandler(h func(*ICMPError)) {
	if r, ok := w.Link.(ErrorReporter); ok {
		r.SetErrorHandler(h)
	}
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
	_ ZeroCopyLink    = Wrap{}
)
