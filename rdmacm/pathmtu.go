package rdmacm

import (
	"net"
	"net/netip"

	"github.com/gorocev2/rocev2/transport"
)

// IBoEHeaderBytes is what Linux's rdma_cm takes off an interface's MTU
// for a RoCE path's headers (iboe_get_mtu, include/rdma/ib_addr.h): GRH
// 40, UDP 8, BTH 12, XRC extension 4, AtomicETH 28 and ICRC 4. It is 16
// more than rxe's port (RXE_MAX_HDR_LENGTH, 80): on an interface of MTU
// 1104 to 1119 rxe's port reports 1024, rdma_cm's path 512.
const IBoEHeaderBytes = 40 + 8 + 12 + 4 + 28 + 4

// IBoEPathMTU is the path MTU Linux's rdma_cm gives a RoCE connection
// over an interface of MTU linkMTU (cma_resolve_iboe_route's
// iboe_get_mtu): the largest IB MTU not above linkMTU - IBoEHeaderBytes;
// ok is false when not even 256 fits.
func IBoEPathMTU(linkMTU int) (mtu transport.MTU, ok bool) {
	room := linkMTU - IBoEHeaderBytes
	for _, m := range []transport.MTU{transport.MTU4096, transport.MTU2048, transport.MTU1024, transport.MTU512, transport.MTU256} {
		if m.Bytes() <= room {
			return m, true
		}
	}
	return 0, false
}

// defaultPathMTU is the path MTU Dial asks for when Options.PathMTU is
// zero: 1024, or less on an interface too small for it, as rdma_cm
// picks (IBoEPathMTU of the MTU of the interface holding local; 256
// when not even that fits). A device whose address is on no interface
// (an in-memory network) keeps 1024. Not more than 1024 on a larger
// interface either, where rdma_cm would take up to 4096: what this
// package has always asked for there, and what rxe's port reports on a
// 1500-byte Ethernet.
func defaultPathMTU(local netip.Addr) transport.MTU {
	linkMTU, ok := interfaceMTU(local)
	if !ok {
		return transport.MTU1024
	}
	m, ok := IBoEPathMTU(linkMTU)
	if !ok {
		return transport.MTU256
	}
	return min(m, transport.MTU1024)
}

// interfaceMTU returns the MTU of the interface holding a (the one its
// zone names, for a link-local address). A variable for tests.
var interfaceMTU = func(a netip.Addr) (int, bool) {
	zone := a.Zone()
	a = a.Unmap().WithZone("")
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, false
	}
	for _, ifi := range ifs {
		if zone != "" && ifi.Name != zone {
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			pfx, ok := ad.(*net.IPNet)
			if !ok {
				continue
			}
			if ip, ok := netip.AddrFromSlice(pfx.IP); ok && ip.Unmap() == a {
				return ifi.MTU, true
			}
		}
	}
	return 0, false
}
