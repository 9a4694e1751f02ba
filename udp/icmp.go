package udp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// ErrUnreachable matches an *ICMPError: the network reported a packet the
// link sent as undeliverable.
var ErrUnreachable = errors.New("udp: destination unreachable")

// ICMPError is an ICMP (or ICMPv6) error the network returned for a
// packet a link sent: nothing listens on UDP 4791 at the destination
// (port unreachable), or the host or network cannot be reached.
type ICMPError struct {
	// Dst is the destination of the packet that bounced.
	Dst netip.Addr
	// From is who reported it: the destination itself (port
	// unreachable) or a router on the way (host/network unreachable).
	From netip.Addr
	// Type and Code are the ICMP (Origin ICMP) or ICMPv6 (ICMPv6 true)
	// type and code, e.g. 3/3 (port unreachable) or 3/1 (host
	// unreachable); ICMPv6 1/4 is port unreachable.
	Type, Code uint8
	ICMPv6     bool
	// Errno is what Linux makes of it: ECONNREFUSED for port
	// unreachable, EHOSTUNREACH, ENETUNREACH, ...
	Errno syscall.Errno
	// Payload is the start of the bounced packet's UDP payload (its BTH
	// and what follows), as far as the ICMP error quoted it: a copy.
	Payload []byte
}

// Error gives the ICMP type and code, the router or host that sent it,
// the bounced packet's destination and the errno the kernel reported.
func (e *ICMPError) Error() string {
	v := ""
	if e.ICMPv6 {
		v = "v6"
	}
	return fmt.Sprintf("udp: ICMP%s type %d code %d from %v for a packet to %v:%d: %v", v, e.Type, e.Code, e.From, e.Dst, Port, e.Errno)
}

// Is makes an ICMPError match ErrUnreachable.
func (e *ICMPError) Is(target error) bool { return target == ErrUnreachable }

// Unwrap returns the errno (errors.Is(err, syscall.ECONNREFUSED) tells a
// port unreachable).
func (e *ICMPError) Unwrap() error { return e.Errno }

// DestQP returns the destination QP of the bounced packet (its BTH's
// DestQP), and false if the ICMP error quoted less than a BTH.
func (e *ICMPError) DestQP() (uint32, bool) {
	if len(e.Payload) < 12 {
		return 0, false
	}
	return uint32(e.Payload[5])<<16 | uint32(binary.BigEndian.Uint16(e.Payload[6:8])), true
}

// ErrorReporter is implemented by links that learn of the ICMP errors the
// network returns for the packets they send (SocketLink, through
// IP_RECVERR / IPV6_RECVERR). The handler is called from the link's own
// goroutine, once per error, and must not block; set it once, before
// sending (transport.NewDevice does).
type ErrorReporter interface {
	SetErrorHandler(func(*ICMPError))
}

// Extended error origins and layout (Linux's struct sock_extended_err:
// errno u32, origin u8, type u8, code u8, pad u8, info u32, data u32,
// then the offender's sockaddr).
const (
	eeOriginICMP  = 2
	eeOriginICMP6 = 3
	eeSize        = 16
)

// parseExtendedErr decodes a struct sock_extended_err with the offender
// address behind it (the data of an IP_RECVERR / IPV6_RECVERR control
// message) into e. It reports false for anything but an ICMP or ICMPv6
// error, or a truncated one. It never panics.
func parseExtendedErr(b []byte, e *ICMPError) bool {
	if len(b) < eeSize {
		return false
	}
	origin := b[4]
	if origin != eeOriginICMP && origin != eeOriginICMP6 {
		return false
	}
	e.Errno = syscall.Errno(binary.NativeEndian.Uint32(b[0:4]))
	e.ICMPv6 = origin == eeOriginICMP6
	e.Type, e.Code = b[5], b[6]
	sa := b[eeSize:]
	if len(sa) >= 2 {
		switch binary.NativeEndian.Uint16(sa[0:2]) {
		case afInet:
			if len(sa) >= 8 {
				e.From = netip.AddrFrom4([4]byte(sa[4:8]))
			}
		case afInet6:
			if len(sa) >= 24 {
				e.From = netip.AddrFrom16([16]byte(sa[8:24])).Unmap()
			}
		}
	}
	return true
}

// Address families as Linux numbers them (sockaddr's family field).
const (
	afInet  = 2
	afInet6 = 10
)
