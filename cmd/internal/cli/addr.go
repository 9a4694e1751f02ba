package cli

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/gorocev2/rocev2/transport"
)

// The address arguments of the commands, as users type them: "[::1]"
// (brackets, as in a URL) means ::1; "192.0.2.1:18515" is refused with
// the flag that sets the port, since a port glued to the address would
// otherwise be looked up as a host name or fail as "missing port"; an
// IPv6 link-local address without its zone is refused with an example,
// where the socket calls fail with a bare "invalid argument".

// stripBrackets returns s without one pair of enclosing brackets.
func stripBrackets(s string) string {
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		return s[1 : len(s)-1]
	}
	return s
}

// NeedsZone reports whether a is an IPv6 link-local address without the
// zone (interface) that every socket call needs for it.
func NeedsZone(a netip.Addr) bool {
	return a.Is6() && !a.Is4In6() && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()) && a.Zone() == ""
}

// errNeedsZone says that a (named by what) needs its zone.
func errNeedsZone(what string, a netip.Addr) error {
	return fmt.Errorf("%s %v: a link-local address needs its zone, the interface it is on (e.g. %v%%eth0)", what, a, a)
}

// errWithPort refuses an address given with a port; portFlag names the
// flag that sets the port, or is empty when the port is fixed (--bind:
// RoCEv2 is always UDP 4791).
func errWithPort(what, s, portFlag string) error {
	if portFlag == "" {
		return fmt.Errorf("%s %q: give the address alone (RoCEv2 always uses UDP port 4791)", what, s)
	}
	return fmt.Errorf("%s %q: give the address alone; %s sets the port", what, s, portFlag)
}

// hostWithPort reports whether s is an address or a host name followed
// by ":PORT" (an IPv6 address without brackets has more than one colon).
func hostWithPort(s string) bool {
	if _, err := netip.ParseAddrPort(s); err == nil {
		return true
	}
	host, port, ok := strings.Cut(s, ":")
	if !ok || host == "" || port == "" || strings.Contains(port, ":") {
		return false
	}
	for _, r := range port {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// ParseIP parses the IP address of flag what (e.g. "--bind", "--addr"):
// brackets are accepted, a port or a zone-less link-local address is
// refused with what to give instead; portFlag is as for PeerArg.
func ParseIP(what, s, portFlag string) (netip.Addr, error) {
	if hostWithPort(stripBrackets(s)) || (strings.HasPrefix(s, "[") && strings.Contains(s, "]:")) {
		return netip.Addr{}, errWithPort(what, s, portFlag)
	}
	a, err := netip.ParseAddr(stripBrackets(s))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q: not an IP address", what, s)
	}
	if NeedsZone(a) {
		return netip.Addr{}, errNeedsZone(what, a)
	}
	return a.Unmap(), nil
}

// PeerArg checks and normalises the peer a client is given (the server
// argument of pingpong and the perftest commands; what names it in the
// error): an IP address or a host name, without a port (portFlag sets
// it), in brackets or not; a link-local address needs its zone.
func PeerArg(what, s, portFlag string) (string, error) {
	if hostWithPort(s) || (strings.HasPrefix(s, "[") && strings.Contains(s, "]:")) {
		return "", errWithPort(what, s, portFlag)
	}
	s = stripBrackets(s)
	if a, err := netip.ParseAddr(s); err == nil && NeedsZone(a) {
		return "", errNeedsZone(what, a)
	}
	return s, nil
}

// LinkOf returns the name and MTU of the network interface that holds
// local address addr, or of the one whose prefix holds it (lo for every
// 127.0.0.0/8 address); ok is false when no interface does.
func LinkOf(addr netip.Addr) (name string, mtu int, ok bool) {
	a := addr.Unmap()
	ifs, err := net.Interfaces()
	if err != nil {
		return "", 0, false
	}
	bestBits := -1
	for _, ifi := range ifs {
		if a.Zone() != "" && ifi.Name != a.Zone() {
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			n, isNet := x.(*net.IPNet)
			if !isNet {
				continue
			}
			p, okp := netip.AddrFromSlice(n.IP)
			if !okp {
				continue
			}
			p = p.Unmap()
			bits, _ := n.Mask.Size()
			pfx := netip.PrefixFrom(p, bits)
			if p == a.WithZone("") {
				bits = 129 // the address itself beats any prefix
			}
			if pfx.Contains(a.WithZone("")) && bits > bestBits {
				name, mtu, bestBits = ifi.Name, ifi.MTU, bits
			}
		}
	}
	return name, mtu, bestBits >= 0
}

// RXEHeaderRoom is rxe's RXE_MAX_HDR_LENGTH: the bytes of headers its
// port's active MTU leaves room for below the interface's MTU (IPv6, UDP,
// BTH, RETH and the ICRC).
const RXEHeaderRoom = 80

// ActiveMTU is the path MTU a RoCEv2 port on an interface of MTU linkMTU
// carries, as rxe's port reports it (eth_mtu_int_to_enum: the largest IB
// MTU not above linkMTU - 80); ok is false when not even 256 fits.
func ActiveMTU(linkMTU int) (transport.MTU, bool) {
	room := linkMTU - RXEHeaderRoom
	for _, m := range []transport.MTU{transport.MTU4096, transport.MTU2048, transport.MTU1024, transport.MTU512, transport.MTU256} {
		if m.Bytes() <= room {
			return m, true
		}
	}
	return 0, false
}
