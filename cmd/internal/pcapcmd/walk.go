package pcapcmd

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/rocelayer"
)

// EtherTypes, IP protocol numbers and UDP ports the walk knows.
const (
	etIPv4    = 0x0800
	etIPv6    = 0x86dd
	etTEB     = 0x6558 // transparent Ethernet bridging (GRE)
	etERSPAN  = 0x88be // ERSPAN type II (type I without GRE sequence)
	etERSPAN3 = 0x22eb // ERSPAN type III
	etRoCEv1  = 0x8915 // RoCE v1: GRH and BTH right after the Ethernet header

	protoIPIP   = 4
	protoUDP    = 17
	protoIPv6   = 41
	protoGRE    = 47
	protoFrag6  = 44
	portVXLAN   = 4789
	portGeneve  = 6081
	maxEncapDep = 8 // encapsulations the walk goes through
)

// isVLAN reports whether et is a VLAN tag's TPID: 802.1Q, 802.1ad and the
// pre-standard QinQ TPIDs 0x9100 and 0x9200.
func isVLAN(et uint16) bool {
	switch et {
	case 0x8100, 0x88a8, 0x9100, 0x9200:
		return true
	}
	return false
}

// kind is what the walk found in a frame.
type kind uint8

// What a frame holds.
const (
	kindOther       kind = iota // no RoCEv2 packet
	kindRoCE                    // a RoCEv2 packet (found.ip)
	kindRoCEBadIP               // a RoCEv2 packet whose IP header is damaged (found.why)
	kindBadIPOther              // another frame whose IP header is bad (found.why)
	kindFragment                // an IP fragment held for reassembly
	kindUnsupported             // an encapsulation check does not decode (found.why)
	kindNotChecked              // a RoCEv2 packet check cannot verify (found.why)
	kindRoCEv1                  // a RoCE v1 frame (EtherType 0x8915): not RoCEv2
)

// found is what the walk found in a frame.
type found struct {
	kind kind
	// ip is the IP packet carrying the RoCEv2 packet (kindRoCE): the
	// innermost one, from its header to its total length or to the end
	// of what the capture kept.
	ip []byte
	// via names the encapsulations crossed, outermost first.
	via []string
	// why says what is wrong or not checked (kindFragment: the IP
	// version, "IPv4" or "IPv6").
	why string
	// csumZero is set when the RoCEv2 packet's IPv4 header checksum is 0
	// (offloaded at the capture point); csumBad says how it is wrong.
	csumZero bool
	csumBad  string
	// frag says which frames a reassembled packet came from.
	frag string
	// roceFrag marks a fragment whose first fragment is RoCEv2's.
	roceFrag bool
}

// walker finds the RoCEv2 packet of a frame through link layers, VLAN
// tags, tunnels and IPv4 and IPv6 fragments.
type walker struct {
	cut   bool // the capture kept less than the frame
	num   int  // the frame's number
	depth int
	via   []string
	frags *reassembly
}

// frame walks a frame whose link layer gives EtherType et before pkt.
func (w *walker) frame(num int, cut bool, et uint16, pkt []byte) found {
	w.cut, w.num, w.depth, w.via = cut, num, 0, nil
	return w.ether(et, pkt)
}

// ether walks what follows an EtherType, VLAN tags first.
func (w *walker) ether(et uint16, b []byte) found {
	for isVLAN(et) {
		if len(b) < 4 {
			return found{}
		}
		et, b = binary.BigEndian.Uint16(b[2:]), b[4:]
	}
	switch et {
	case etIPv4:
		return w.ipv4(b)
	case etIPv6:
		return w.ipv6(b)
	case etRoCEv1:
		return found{kind: kindRoCEv1, via: w.via}
	}
	return found{}
}

// ethernet walks an Ethernet frame inside a tunnel.
func (w *walker) ethernet(b []byte, tunnel string) found {
	if len(b) < 14 {
		return found{}
	}
	if w.depth++; w.depth > maxEncapDep {
		return found{kind: kindUnsupported, why: fmt.Sprintf("more than %d encapsulations", maxEncapDep)}
	}
	w.via = append(w.via, tunnel)
	return w.ether(binary.BigEndian.Uint16(b[12:]), b[14:])
}

// inner walks an IP packet inside a tunnel.
func (w *walker) inner(et uint16, b []byte, tunnel string) found {
	if w.depth++; w.depth > maxEncapDep {
		return found{kind: kindUnsupported, why: fmt.Sprintf("more than %d encapsulations", maxEncapDep)}
	}
	w.via = append(w.via, tunnel)
	return w.ether(et, b)
}

// udpDst returns the UDP destination port of a UDP header at b[off:]
// (false if the header is not whole: a frame cut inside it cannot be told
// from other traffic).
func udpDst(b []byte, off int) (uint16, bool) {
	if off < 0 || len(b) < off+8 {
		return 0, false
	}
	return binary.BigEndian.Uint16(b[off+2:]), true
}

// ipv4 walks an IPv4 packet.
func (w *walker) ipv4(b []byte) found {
	if len(b) < 20 {
		return w.shortIP("IPv4", len(b))
	}
	hl := int(b[0]&0x0f) * 4
	tl := int(binary.BigEndian.Uint16(b[2:]))
	proto := b[9]
	why := ""
	switch {
	case b[0]>>4 != 4:
		why = fmt.Sprintf("IPv4 header with version %d", b[0]>>4)
	case hl < 20:
		why = fmt.Sprintf("IPv4 header length %d bytes (IHL %d)", hl, hl/4)
	case len(b) < hl:
		if w.cut {
			return found{}
		}
		why = fmt.Sprintf("IPv4 header length %d bytes beyond the %d bytes of the frame", hl, len(b))
	case tl < hl:
		why = fmt.Sprintf("IPv4 total length %d below its header length %d", tl, hl)
	}
	if why != "" {
		return w.badIPv4(b, why)
	}
	f := found{}
	if sum := pcaptap.IPChecksum(b[:hl]); sum != 0 {
		stored := binary.BigEndian.Uint16(b[10:])
		if stored == 0 {
			f.csumZero = true
		} else {
			f.csumBad = fmt.Sprintf("IPv4 header checksum 0x%04x is wrong, should be 0x%04x", stored, pcaptap.IPChecksum(zeroCsum(b[:hl])))
		}
	}
	if f.csumBad != "" && hl > 20 && proto == protoUDP {
		// An IHL made larger hides the UDP header behind "options".
		if dst, ok := udpDst(b, hl); !ok || dst != rocelayer.Port {
			if w.badIPv4(b, "").kind == kindRoCEBadIP {
				return w.badIPv4(b, fmt.Sprintf("%s over a %d-byte header", f.csumBad, hl))
			}
		}
	}
	pkt := b[:min(tl, len(b))]
	if binary.BigEndian.Uint16(b[6:])&0x3fff != 0 { // MF or a fragment offset
		return w.fragment(pkt, hl, f)
	}
	return w.ipPayload(pkt, proto, hl, f)
}

// zeroCsum returns a copy of IPv4 header h with its checksum zeroed.
func zeroCsum(h []byte) []byte {
	c := append([]byte(nil), h...)
	c[10], c[11] = 0, 0
	return c
}

// shortIP is the verdict on an IP header cut short.
func (w *walker) shortIP(v string, n int) found {
	if w.cut || n == 0 {
		return found{}
	}
	return found{kind: kindBadIPOther, why: fmt.Sprintf("%s header truncated: %d bytes", v, n)}
}

// badIPv4 is the verdict on an IPv4 header that does not decode: a
// damaged RoCEv2 packet if a UDP header to port 4791 follows a 20-byte
// header (an IHL made 1 or 15 would hide it among the other frames),
// another frame with a bad IP header if not.
func (w *walker) badIPv4(b []byte, why string) found {
	if len(b) >= 20 && b[9] == protoUDP {
		if dst, ok := udpDst(b, 20); ok && dst == rocelayer.Port {
			return found{kind: kindRoCEBadIP, why: why + " (a UDP header to port 4791 follows a 20-byte header)", via: w.via}
		}
	}
	return found{kind: kindBadIPOther, why: why}
}

// ipPayload walks what follows an IP header (at b[off:]) of protocol
// proto; f carries what the IP header said.
func (w *walker) ipPayload(b []byte, proto uint8, off int, f found) found {
	switch proto {
	case protoUDP:
		return w.udp(b, off, f)
	case protoIPIP:
		return w.inner(etIPv4, b[off:], "IPv4-in-IP")
	case protoIPv6:
		return w.inner(etIPv6, b[off:], "IPv6-in-IP")
	case protoGRE:
		return w.gre(b[off:])
	}
	return w.otherIP(f)
}

// otherIP is the verdict on an IP packet that is not RoCEv2.
func (w *walker) otherIP(f found) found {
	switch {
	case f.csumBad != "":
		return found{kind: kindBadIPOther, why: f.csumBad}
	case f.csumZero:
		return found{kind: kindBadIPOther, why: "IPv4 header checksum 0 (offloaded at the capture point?)"}
	}
	return found{}
}

// udp walks a UDP header at b[off:] of IP packet b.
func (w *walker) udp(b []byte, off int, f found) found {
	dst, ok := udpDst(b, off)
	if !ok && w.cut && off >= 0 && len(b) >= off+4 && binary.BigEndian.Uint16(b[off+2:]) == rocelayer.Port {
		// The capture cut the UDP header after its destination port
		// (a snap length of 38 to 41 on Ethernet): RoCEv2, truncated.
		dst, ok = rocelayer.Port, true
	}
	switch {
	case !ok:
		return w.otherIP(f)
	case dst == rocelayer.Port:
		f.kind, f.ip, f.via = kindRoCE, b, w.via
		return f
	case dst == portVXLAN && len(b) >= off+16:
		return w.ethernet(b[off+16:], "VXLAN")
	case dst == portGeneve && len(b) >= off+16:
		return w.geneve(b[off+8:])
	}
	return w.otherIP(f)
}

// geneve walks a Geneve header (after its UDP header).
func (w *walker) geneve(b []byte) found {
	opt := int(b[0]&0x3f) * 4
	if len(b) < 8+opt {
		return found{}
	}
	switch et := binary.BigEndian.Uint16(b[2:]); et {
	case etTEB:
		return w.ethernet(b[8+opt:], "Geneve")
	case etIPv4, etIPv6:
		return w.inner(et, b[8+opt:], "Geneve")
	default:
		return found{kind: kindUnsupported, why: fmt.Sprintf("Geneve protocol 0x%04x not decoded", et)}
	}
}

// GRE header flags.
const (
	greChecksum = 0x8000
	greRouting  = 0x4000
	greKey      = 0x2000
	greSeq      = 0x1000
)

// gre walks a GRE header and what it carries: Ethernet (0x6558, ERSPAN
// I, II and III) or IP.
func (w *walker) gre(b []byte) found {
	if len(b) < 4 {
		return found{}
	}
	flags, et := binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:])
	if flags&7 != 0 || flags&greRouting != 0 {
		return found{kind: kindUnsupported, why: fmt.Sprintf("GRE version %d or source routing (flags 0x%04x) not decoded", flags&7, flags)}
	}
	off := 4
	for _, bit := range []uint16{greChecksum, greKey, greSeq} {
		if flags&bit != 0 {
			off += 4
		}
	}
	if len(b) < off {
		return found{}
	}
	p := b[off:]
	switch et {
	case etTEB:
		return w.ethernet(p, "GRE")
	case etIPv4, etIPv6:
		return w.inner(et, p, "GRE")
	case etERSPAN:
		if flags&greSeq == 0 { // type I: no ERSPAN header
			return w.ethernet(p, "GRE/ERSPAN I")
		}
		if len(p) < 8 {
			return found{}
		}
		return w.ethernet(p[8:], "GRE/ERSPAN II")
	case etERSPAN3:
		if len(p) < 12 {
			return found{}
		}
		n := 12
		if p[11]&1 != 0 { // O: a platform-specific subheader follows
			n += 8
		}
		if len(p) < n {
			return found{}
		}
		return w.ethernet(p[n:], "GRE/ERSPAN III")
	}
	return found{kind: kindUnsupported, why: fmt.Sprintf("GRE protocol 0x%04x not decoded", et)}
}

// IPv6 extension headers the walk steps over.
const (
	ipv6HopByHop = 0
	ipv6Routing  = 43
	ipv6DestOpts = 60
)

// ipv6 walks an IPv6 packet.
func (w *walker) ipv6(b []byte) found {
	if len(b) < 40 {
		return w.shortIP("IPv6", len(b))
	}
	if b[0]>>4 != 6 {
		return found{kind: kindBadIPOther, why: fmt.Sprintf("IPv6 header with version %d", b[0]>>4)}
	}
	pkt := b[:min(40+int(binary.BigEndian.Uint16(b[4:])), len(b))]
	nh, off, prevNH := b[6], 40, 6
	var ext []string
	for len(ext) < 8 {
		switch nh {
		case ipv6HopByHop, ipv6Routing, ipv6DestOpts:
			if len(pkt) < off+2 {
				return found{}
			}
			ext = append(ext, map[uint8]string{0: "Hop-by-Hop", 43: "Routing", 60: "Destination Options"}[nh])
			nh, off, prevNH = pkt[off], off+(int(pkt[off+1])+1)*8, off
			continue
		case protoFrag6:
			if len(pkt) < off+8 {
				return found{}
			}
			// Every fragment, an atomic one (offset 0, M 0) too, goes
			// through reassembly: Linux removes the Fragment header
			// before UDP sees the datagram.
			return w.fragment6(pkt, off, prevNH)
		}
		break
	}
	if len(ext) == 0 {
		return w.ipPayload(pkt, nh, off, found{})
	}
	if dst, ok := udpDst(pkt, off); ok && nh == protoUDP && dst == rocelayer.Port {
		return found{kind: kindNotChecked, via: w.via, why: fmt.Sprintf("RoCEv2 packet after IPv6 extension headers (%s): ICRC not checked (whether it covers them is not settled)", strings.Join(ext, ", "))}
	}
	return found{}
}
