// Package udp is the network under the RoCEv2 transport: a small batch-oriented
// Link interface (shaped like wireguard-go's conn.Bind) and its implementations.
//
// A Link moves RoCEv2 UDP payloads (BTH .. ICRC) to and from UDP port 4791. It
// owns the one thing only the network layer can know: the IP and UDP header the
// packet really travels with. So Send fills in the ICRC for that header, and
// Recv verifies it and never hands a packet with a bad ICRC to the transport.
//
// Implementations:
//   - SocketLink (Linux): a kernel UDP socket bound to addr:4791 receives
//     (read without blocking, waited for through Go's poller only while the
//     receiver waits: see rxConn) and a blocking send-only socket outside
//     the poller sends from an ephemeral port (see fdConn), batched with
//     sendmmsg/recvmmsg, UDP GRO on receive, optional UDP GSO on send and
//     optional per-QP source ports. IPv6 is verified fully; IPv4 with the
//     identification solved (icrc.SolveIPv4ID), since a UDP socket never
//     sees the IP header.
//   - RawLink (Linux, CAP_NET_RAW): an IPv4 raw socket that receives and
//     verifies the ICRC over the real header, and an IPPROTO_RAW socket that
//     sends with rxe's exact IP/UDP header.
//
// The in-memory network with seeded faults, switch ports and virtual time
// that the tests and simulators run over is package memnet (udp/memnet), a
// Link implementation outside this package: importing udp (or transport)
// does not pull it in. What a Link implementation outside udp needs to
// behave like these is exported here: CheckSend, CheckRecv, ComputeICRC,
// NormAddr and MinPacketSize.
//
// # Zero-copy send and verify-then-place
//
// A SocketLink sends a packet whose payload lies in the caller's memory
// (Packet.Payload, CapZeroCopy / ZeroCopyLink) without copying it into
// a packet buffer: the payload is one iovec of the datagram (or of its
// GSO segment), the headers and the pad and ICRC two more in Buf, and
// the ICRC is computed over the payload where it lies
// (icrc.Prefix.ComputeSplit) just before the sendmmsg copies it into the
// kernel. The contract is the verbs one: memory a work request reads
// must not change until the request has completed. A payload changed
// after its ICRC was computed leaves as a packet whose ICRC fails at the
// receiver, which drops it; the bytes on the wire of a zero-copy send
// are exactly those of a copying one. Links without the capability
// (RawLink, memnet) refuse such packets (ErrPayload), and udp.Wrap
// forwards it only to wrappers that say they handle them
// (Wrap.PassPayload).
//
// On receive a SocketLink can leave the ICRC check to its caller
// (CapDeferVerify / DeferVerifyLink): transport.Device then checks each
// packet right before it handles it, so that placing its payload in
// registered memory copies bytes the check has just pulled into L1, and
// a packet whose ICRC fails is dropped before any byte of it is used.
// A link whose receives change only the slots they return, in the
// buffers given unless in place (CapRecvPrefix / PrefixRecvLink:
// SocketLink, memnet), spares the device the restore of every slot it
// gives a receive.
//
// Every backend counts what it drops (Stats): bad ICRC, malformed, other,
// and the datagrams the kernel dropped at a full receive buffer.
//
// Addresses: IPv4-mapped IPv6 addresses (the RoCEv2 GID form) are accepted
// everywhere and treated as IPv4; Recv reports IPv4 sources as plain IPv4.
//
// # Layering
//
// udp is the stack's only way to the network: transport imports it and no
// socket code of its own. Of this module udp imports only icrc (a wire
// package, for the ICRC of every packet) and udp/share (the steering
// program of a shared address, which imports nothing of this module); it
// knows nothing of queue pairs or memory. Its socket and raw backends are Linux-only; the Link
// interface and the options build everywhere.
package udp

import (
	"errors"
	"net/netip"
)

// Port is the IANA UDP destination port of RoCEv2.
const Port = 4791

// MaxPacketSize is the largest UDP payload (BTH .. ICRC) a Link sends or
// receives: a 4096-byte IB MTU payload plus room for every header.
const MaxPacketSize = 4096 + 128

// minPacketSize is the smallest UDP payload that can be RoCEv2: a BTH and an ICRC.
const minPacketSize = 12 + 4

// Packet is one RoCEv2 datagram as the transport sees it.
type Packet struct {
	// Buf is the UDP payload: BTH .. ICRC. On Send the ICRC trailer (the
	// last 4 bytes) is filled in by the Link. On Recv the caller provides
	// a buffer with cap >= MaxPacketSize; Recv reslices it to the packet.
	Buf []byte
	// Addr is the destination IP on Send and the source IP on Recv.
	Addr netip.Addr
	// SrcPort is the UDP source port to use on Send (one per QP flow) and
	// the sender's source port on Recv. A Link that cannot use the port
	// asked for (SocketLink without SourcePorts) sets it on Send to the
	// port the packet left from.
	SrcPort uint16
	// TOS is the IP TOS / traffic class byte to set on Send (the low two
	// bits are ECN) and as received on Recv, when the backend can read it.
	TOS uint8
	// Payload, when not nil on Send, is the packet's payload held outside
	// Buf — in registered memory, sent without a copy (zero-copy send;
	// only a link with CapZeroCopy takes it, see ZeroCopyLink). Buf then
	// holds the packet without its payload: the BTH and extension
	// headers, the pad bytes and the ICRC trailer; the datagram on the
	// wire is Buf[:PayloadAt()] + Payload + Buf[PayloadAt():], and its
	// ICRC is computed from Payload's bytes as they are when Send reads
	// them. Payload must not change until Send returns (the verbs rule: a
	// region must not change while a work request that reads it is
	// outstanding); a change after the ICRC was computed leaves a packet
	// whose ICRC fails at the receiver. Recv never sets it.
	Payload []byte
	// Hold, when not nil, guards Payload's memory for the sender (see
	// PayloadHold): whoever calls Link.Send acquires it first and does
	// not send the packet when that fails, and releases it once Send
	// has returned. Links ignore it.
	Hold PayloadHold
}

// PayloadHold guards the memory a Packet's Payload lies in (registered
// memory that its owner may take back: memreg's Hold). Acquire reports
// whether the memory may still be read and, if so, keeps it readable
// until Release.
type PayloadHold interface {
	Acquire() bool
	Release()
}

// PayloadAt returns where a Packet with Payload set takes it: the offset
// in Buf after the headers, before the pad bytes (the BTH's PadCnt) and
// the 4-byte ICRC. It is only meaningful when len(Buf) >= MinPacketSize.
func (p *Packet) PayloadAt() int {
	return len(p.Buf) - icrcSize - int(p.Buf[1]>>4&3)
}

// Len returns the packet's length on the wire (its UDP payload): Buf and
// Payload.
func (p *Packet) Len() int { return len(p.Buf) + len(p.Payload) }

// AppendWire appends the packet's UDP payload as it goes on the wire to
// dst: Buf, or for a packet with Payload set the concatenation Send
// sends. A link wrapper that records or inspects what is sent (a capture)
// uses it.
func (p *Packet) AppendWire(dst []byte) []byte {
	if p.Payload == nil {
		return append(dst, p.Buf...)
	}
	at := p.PayloadAt()
	dst = append(dst, p.Buf[:at]...)
	dst = append(dst, p.Payload...)
	return append(dst, p.Buf[at:]...)
}

// icrcSize is the length of the ICRC trailer.
const icrcSize = 4

// ECN codepoints in the low two bits of TOS.
const (
	ECNNotECT = 0 // not ECN-capable transport
	ECNECT1   = 1 // ECN-capable transport (1)
	ECNECT0   = 2 // ECN-capable transport (0)
	ECNCE     = 3 // congestion experienced
	ECNMask   = 3
)

// Link is a RoCEv2 network attachment: one local IP address, UDP port 4791.
//
// Goroutine safety: Send may be called from any number of goroutines at
// once and concurrently with Recv; Recv is called by one goroutine at a
// time (a device's receive goroutine); Close may be called at any time and
// unblocks Recv. Every implementation (SocketLink, RawLink, memnet.MemLink)
// follows this contract.
//
// A Link of one's own may deliver in process by handing each packet to
// the peer device's transport.Device.HandlePacket, even from inside Send
// (the peer's answers then come back into this device's HandlePacket
// within the same Send); HandlePacket does not wait there for a QP that
// Send's caller holds.
type Link interface {
	// Send sends every packet or returns an error; it fills each packet's ICRC for the IP/UDP
	// header the backend will actually put on the wire. Buffers may be reused when Send returns.
	Send(pkts []Packet) error
	// Recv blocks until at least one packet arrives and fills pkts[:n]; the caller provides
	// Buf with cap >= MaxPacketSize (Recv reslices Buf to the packet length). Packets with a
	// bad ICRC or that are not RoCEv2 are dropped and counted, never returned.
	// After Close, Recv returns net.ErrClosed.
	Recv(pkts []Packet) (n int, err error)
	// LocalAddr is the IP address the link sends from and receives on.
	LocalAddr() netip.Addr
	// BatchSize is the number of packets Send and Recv handle per call efficiently.
	BatchSize() int
	// Stats returns a snapshot of the link's counters.
	Stats() Stats
	// Close releases the link and unblocks Recv.
	Close() error
}

// Stats are a Link's cumulative counters.
type Stats struct {
	SentPkts      uint64 // packets handed to the network by Send
	RcvdPkts      uint64 // packets returned by Recv
	DropBadICRC   uint64 // received packets dropped because the ICRC did not verify
	DropMalformed uint64 // received datagrams too short (or otherwise not RoCEv2)
	DropOther     uint64 // received packets dropped for any other reason (queue overflow, ...)
	// DropKernel counts datagrams the kernel dropped on the receiving
	// socket before Recv saw them (receive buffer full): SO_MEMINFO's drop
	// count on the socket backends, 0 on the in-memory link.
	DropKernel uint64
	// DropNoDF counts the IPv4 datagrams of DropBadICRC whose ICRC
	// was valid only without DF, from a source that sends with DF
	// (SocketLink: a corruption; or the first datagrams of a source that
	// sends without DF, until it is learned).
	DropNoDF uint64
	// ICMPErrors counts the ICMP errors (port, host or network
	// unreachable) the network returned for packets the link sent
	// (SocketLink; see ErrorReporter).
	ICMPErrors uint64
}

// Errors returned by Links. They are matched with errors.Is.
var (
	// ErrPacketSize: a packet given to Send is shorter than BTH+ICRC or longer than MaxPacketSize.
	ErrPacketSize = errors.New("udp: packet size out of range")
	// ErrShortBuffer: a Packet.Buf given to Recv that the call may fill
	// (the first BatchSize, or all with GRO or on a memnet.MemLink) has cap <
	// MaxPacketSize.
	ErrShortBuffer = errors.New("udp: receive buffer cap smaller than MaxPacketSize")
	// ErrAddress: an address is invalid for this link (zero, or the wrong IP family).
	ErrAddress = errors.New("udp: invalid address")
	// ErrPayload: a packet given to Send has Payload set but the link
	// has no zero-copy send (CapZeroCopy), or its Buf has no room for
	// the headers, the pad and the ICRC around the payload.
	ErrPayload = errors.New("udp: packet payload outside Buf not supported here")
)

// SourcePort returns a stable UDP source port for a QP: 0xc000 | (hash(qpn) &
// 0x3fff), so that each QP is one ordered flow through ECMP and RSS. The hash is
// the kernel's hash_32 (multiplication by the 32-bit golden ratio), which older
// rxe versions used for exactly this.
func SourcePort(qpn uint32) uint16 {
	h := (qpn & 0xffffff) * 0x61c88647 >> (32 - 14)
	return 0xc000 | uint16(h&0x3fff)
}

// FlowSourcePort returns the UDP source port Linux rxe (and the kernel's
// rdma_get_udp_sport) uses for an RC/UC QP with local QPN lqpn connected to
// remote QPN rqpn when the address vector carries no flow label: the flow
// label is derived from lqpn*rqpn and folded into 14 bits above 0xc000.
// Matching it makes our flows look exactly like rxe's in captures.
func FlowSourcePort(lqpn, rqpn uint32) uint16 {
	v := uint64(lqpn) * uint64(rqpn)
	v ^= v >> 20
	v ^= v >> 40
	fl := uint32(v & 0xfffff)
	low := fl & 0x3fff
	low ^= (fl & 0xfc000) >> 14
	return uint16(low) | 0xc000
}

// normAddr returns a in the form links are keyed by: IPv4-mapped IPv6 (the
// RoCEv2 GID form) becomes plain IPv4, and any zone is removed.
//
// A plain IPv4 address (the usual destination) is returned as it is, in
// line: it is neither mapped nor zoned, and Unmap with WithZone cost ~34
// instructions, twice per Send (checkSend, buildSend) — TestNormAddr.
func normAddr(a netip.Addr) netip.Addr {
	if a.Is4() {
		return a
	}
	return normAddrSlow(a)
}

// normAddrSlow is normAddr of an address that is not plain IPv4.
func normAddrSlow(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}
