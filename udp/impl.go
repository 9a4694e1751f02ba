package udp

import "net/netip"

// This file exports what a Link implementation outside this package (the
// in-memory network of package memnet, test doubles) needs to behave like
// the links here: the same argument checks and the same ICRC.

// MinPacketSize is the smallest UDP payload that can be RoCEv2: a BTH and
// an ICRC. Links drop shorter datagrams as malformed.
const MinPacketSize = minPacketSize

// CheckSend validates the packets given to a Link's Send on a link whose
// address is local: every length in [MinPacketSize, MaxPacketSize] and
// every destination valid and of local's IP family, and no Payload set
// (such a link has no zero-copy send). The errors match ErrPacketSize,
// ErrAddress and ErrPayload.
func CheckSend(pkts []Packet, local netip.Addr) error {
	return checkSend(pkts, NormAddr(local), false)
}

// CheckRecv validates the packets given to a Link's Recv that it may fill,
// the first limit: every Buf has room for MaxPacketSize bytes (else an
// error matching ErrShortBuffer).
func CheckRecv(pkts []Packet, limit int) error { return checkRecv(pkts, limit) }

// ComputeICRC returns the ICRC of a RoCEv2 UDP payload (BTH .. ICRC)
// travelling src:srcPort -> dst:4791 in an IPv4 datagram with DF and
// identification id, or in an IPv6 datagram (id unused). src and dst are
// normalised (NormAddr) and of the same family.
func ComputeICRC(src, dst netip.Addr, srcPort, id uint16, payload []byte) uint32 {
	return computeICRC(src, dst, srcPort, id, payload)
}

// NormAddr returns a in the form links are keyed by: an IPv4-mapped IPv6
// address (the RoCEv2 GID form) becomes plain IPv4, and any zone is removed.
func NormAddr(a netip.Addr) netip.Addr { return normAddr(a) }
