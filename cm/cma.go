package cm

import (
	"fmt"
	"net/netip"
)

// rdma_cm (Linux drivers/infiniband/core/cma.c, used by librdmacm) starts
// the private data of every REQ and SIDR_REQ it sends to an IP address with
// a 36-byte header naming the connection's IP endpoints, and maps its port
// spaces onto service IDs.

// Sizes of the rdma_cm header and what it leaves of the private data.
const (
	// CMAHeaderSize is the length of rdma_cm's header (struct cma_hdr).
	CMAHeaderSize = 36
	// CMAREQPrivateDataSize is the private data left to an rdma_cm user
	// in a REQ: 56 bytes.
	CMAREQPrivateDataSize = REQPrivateDataSize - CMAHeaderSize
	// CMASIDRREQPrivateDataSize is the private data left to an rdma_cm
	// user in a SIDR_REQ: 180 bytes.
	CMASIDRREQPrivateDataSize = SIDRREQPrivateDataSize - CMAHeaderSize
	// CMAVersion is the only header version, 0.
	CMAVersion = 0x00
)

// Offsets in the rdma_cm header.
const (
	cmaVersionOff = 0
	cmaIPVerOff   = 1 // IP version in bits 7..4; bits 3..0 reserved
	cmaPortOff    = 2
	cmaSrcOff     = 4  // 16 bytes: IPv6, or 12 zero bytes and IPv4
	cmaDstOff     = 20 // likewise
)

// CMAHeader is a view of rdma_cm's header at the start of a REQ's or
// SIDR_REQ's private data: CMAHeaderSize bytes. An IPv4 address sits in
// the last 4 of its 16 bytes (not IPv4-mapped: the first 12 are zero).
type CMAHeader []byte

// CMAHeaderFields holds the fields of an rdma_cm header.
type CMAHeaderFields struct {
	// Version is the header version, CMAVersion.
	Version uint8
	// SrcPort is the active side's IP port (its rdma_cm ID's port; the
	// destination port is in the service ID).
	SrcPort uint16
	// Src and Dst are the active and passive sides' IP addresses, both
	// IPv4 or both IPv6; the IP version field follows them.
	Src, Dst netip.Addr
}

// Version returns the header version.
func (h CMAHeader) Version() uint8 { return h[cmaVersionOff] }

// SetVersion sets the header version.
func (h CMAHeader) SetVersion(v uint8) { h[cmaVersionOff] = v }

// IPVersion returns the 4-bit IP version, 4 or 6.
func (h CMAHeader) IPVersion() uint8 { return getBits(h[cmaIPVerOff], 4, mask4) }

// SetIPVersion sets the IP version; only the low 4 bits are used.
func (h CMAHeader) SetIPVersion(v uint8) { setBits(&h[cmaIPVerOff], 4, mask4, v) }

// SrcPort returns the source port.
func (h CMAHeader) SrcPort() uint16 { return be16(h[cmaPortOff:]) }

// SetSrcPort sets the source port.
func (h CMAHeader) SetSrcPort(v uint16) { put16(h[cmaPortOff:], v) }

// addr reads the 16-byte address union at off for the header's IP version
// (IPv4: the last 4 bytes); any other version gives the zero Addr.
func (h CMAHeader) addr(off int) netip.Addr {
	switch h.IPVersion() {
	case 4:
		return netip.AddrFrom4([4]byte(h[off+12 : off+16]))
	case 6:
		return netip.AddrFrom16([16]byte(h[off : off+16]))
	}
	return netip.Addr{}
}

// setAddr writes a into the union at off: IPv4 as 12 zero bytes and the
// address, IPv6 (IPv4-mapped included) as is, the zero Addr as 16 zeros.
func (h CMAHeader) setAddr(off int, a netip.Addr) {
	u := h[off : off+16]
	clear(u)
	switch {
	case a.Is4():
		b := a.As4()
		copy(u[12:], b[:])
	case a.Is6():
		b := a.As16()
		copy(u, b[:])
	}
}

// SrcAddr returns the source IP address as the IP version says to read
// it (the zero Addr for a version other than 4 and 6).
func (h CMAHeader) SrcAddr() netip.Addr { return h.addr(cmaSrcOff) }

// SetSrcAddr writes the source address; IPv4 goes in the last 4 bytes.
// It does not change the IP version field.
func (h CMAHeader) SetSrcAddr(a netip.Addr) { h.setAddr(cmaSrcOff, a) }

// DstAddr returns the destination IP address (see SrcAddr).
func (h CMAHeader) DstAddr() netip.Addr { return h.addr(cmaDstOff) }

// SetDstAddr writes the destination address (see SetSrcAddr).
func (h CMAHeader) SetDstAddr(a netip.Addr) { h.setAddr(cmaDstOff, a) }

// Check reports a header rdma_cm would refuse: a version other than
// CMAVersion or an IP version other than 4 and 6.
func (h CMAHeader) Check() error {
	_ = h[CMAHeaderSize-1]
	if v := h.Version(); v != CMAVersion {
		return &Error{Msg: "cma_hdr", Field: "cma_version", Value: uint64(v), Err: ErrUnsupported}
	}
	if v := h.IPVersion(); v != 4 && v != 6 {
		return &Error{Msg: "cma_hdr", Field: "ip_version", Value: uint64(v), Err: ErrUnsupported}
	}
	return nil
}

// Fields decodes the header; it does not Check.
func (h CMAHeader) Fields() CMAHeaderFields {
	_ = h[CMAHeaderSize-1]
	return CMAHeaderFields{Version: h.Version(), SrcPort: h.SrcPort(), Src: h.SrcAddr(), Dst: h.DstAddr()}
}

// Encode writes all CMAHeaderSize bytes from f, the IP version from the
// addresses' family. As in rdma_cm, which goes by the socket address
// family, an IPv4-mapped IPv6 address is IPv6 (Unmap it for an IPv4
// header). The addresses must be valid and of one family; otherwise
// nothing is written and the error says which is wrong.
func (h CMAHeader) Encode(f *CMAHeaderFields) error {
	_ = h[CMAHeaderSize-1]
	v4 := netip.Addr.Is4
	if !f.Src.IsValid() || !f.Dst.IsValid() || v4(f.Src) != v4(f.Dst) {
		return fmt.Errorf("cm: cma_hdr: source %v and destination %v are not two addresses of one family: %w", f.Src, f.Dst, ErrMismatch)
	}
	h.SetVersion(f.Version)
	h[cmaIPVerOff] = 0
	if v4(f.Src) {
		h.SetIPVersion(4)
	} else {
		h.SetIPVersion(6)
	}
	h.SetSrcPort(f.SrcPort)
	h.SetSrcAddr(f.Src)
	h.SetDstAddr(f.Dst)
	return nil
}

// ParseCMAHeader decodes and checks the rdma_cm header at the start of
// privateData (a REQ's or SIDR_REQ's).
func ParseCMAHeader(privateData []byte) (CMAHeaderFields, error) {
	if err := need("cma_hdr", privateData, CMAHeaderSize); err != nil {
		return CMAHeaderFields{}, err
	}
	h := CMAHeader(privateData)
	if err := h.Check(); err != nil {
		return CMAHeaderFields{}, err
	}
	return h.Fields(), nil
}

// PortSpace is an rdma_cm port space (enum rdma_ucm_port_space).
type PortSpace uint16

// The port spaces. A service ID is ps<<16 | port.
const (
	PSIPoIB PortSpace = 0x0002
	PSIB    PortSpace = 0x013f
	PSTCP   PortSpace = 0x0106 // RC connections (rping, most users)
	PSUDP   PortSpace = 0x0111 // UD, resolved with SIDR
)

// The service IDs rdma_cm listens on for IP port spaces:
// CMAServiceIDBase under CMAServiceIDMask (Linux IB_CMA_SERVICE_ID).
const (
	CMAServiceIDBase = 0x0000000001000000
	CMAServiceIDMask = 0xffffffffff000000
)

// String returns "TCP", "UDP", "IB", "IPoIB" or the hex value.
func (ps PortSpace) String() string {
	switch ps {
	case PSIPoIB:
		return "IPoIB"
	case PSIB:
		return "IB"
	case PSTCP:
		return "TCP"
	case PSUDP:
		return "UDP"
	}
	return fmt.Sprintf("PortSpace(%#04x)", uint16(ps))
}

// ServiceID returns the service ID of port in port space ps, as rdma_cm
// builds it: ps<<16 | port (TCP port 7174 is 0x0000000001061c06).
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// SplitServiceID returns the port space and port of an rdma_cm service ID,
// and whether sid is one: its top 32 bits zero and its port space one of
// the four.
func SplitServiceID(sid uint64) (ps PortSpace, port uint16, ok bool) {
	ps, port = PortSpace(sid>>16), uint16(sid)
	switch {
	case sid>>32 != 0:
		return 0, 0, false
	case ps == PSIPoIB || ps == PSIB || ps == PSTCP || ps == PSUDP:
		return ps, port, true
	}
	return 0, 0, false
}
