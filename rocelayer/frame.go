package rocelayer

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
)

// Errors of the frame helpers (errors.Is-able).
var (
	// ErrNoIP means the packet has no IPv4 or IPv6 layer.
	ErrNoIP = errors.New("rocelayer: no IPv4/IPv6 layer")
	// ErrNoUDP means the packet has no UDP layer after its IP layer.
	ErrNoUDP = errors.New("rocelayer: no UDP layer")
	// ErrNotContiguous means the decoded layers do not lie back to back in
	// the packet's data, so the IP packet cannot be cut out of it.
	ErrNotContiguous = errors.New("rocelayer: layers are not contiguous in the packet data")
)

// IPPacket returns the slice of p.Data() that holds the IP packet carrying
// the RoCEv2 payload: from the first byte of the IPv4/IPv6 header to the end
// of the UDP payload (which ends with the ICRC). It aliases p's data, so
// icrc.Verify and icrc.Put can work on it directly. Link-layer padding after
// the IP packet is excluded.
func IPPacket(p gopacket.Packet) ([]byte, error) {
	data := p.Data()
	off := 0
	ipIdx := -1
	ls := p.Layers()
	for i, l := range ls {
		t := l.LayerType()
		if t == layers.LayerTypeIPv4 || t == layers.LayerTypeIPv6 {
			ipIdx = i
			break
		}
		off += len(l.LayerContents())
	}
	if ipIdx < 0 {
		return nil, ErrNoIP
	}
	end := off
	for _, l := range ls[ipIdx:] {
		end += len(l.LayerContents())
		if l.LayerType() == layers.LayerTypeUDP {
			end += len(l.LayerPayload())
			if end > len(data) {
				return nil, ErrNotContiguous
			}
			ip := data[off:end]
			// The layers must lie back to back: the IP header starts at off.
			if c := ls[ipIdx].LayerContents(); len(c) == 0 || len(ip) < len(c) || &ip[0] != &c[0] {
				return nil, ErrNotContiguous
			}
			return ip, nil
		}
	}
	return nil, ErrNoUDP
}

// VerifyICRC verifies the ICRC of the RoCEv2 packet p (icrc.Verify on its IP
// packet). It returns icrc.ErrMismatch (wrapped) when the ICRC is wrong.
func VerifyICRC(p gopacket.Packet) error {
	ip, err := IPPacket(p)
	if err != nil {
		return err
	}
	return icrc.Verify(ip)
}

// PutICRC computes the ICRC of the RoCEv2 frame and stores it in the frame's
// trailer. first is the type of the frame's first layer (e.g.
// layers.LayerTypeEthernet, layers.LayerTypeIPv4).
func PutICRC(frame []byte, first gopacket.LayerType) error {
	p := gopacket.NewPacket(frame, first, gopacket.DecodeOptions{NoCopy: true})
	ip, err := IPPacket(p)
	if err != nil {
		return err
	}
	return icrc.Put(ip)
}

// SerializeLayers serializes ls into buf like gopacket.SerializeLayers and
// then computes the ICRC (PutICRC). ls[0] must be a link or IP layer and the
// stack must contain a UDP layer and a BTH layer.
//
// The UDP layer is always serialized without ComputeChecksums: its checksum
// would cover the ICRC, which is only known afterwards. Its Checksum field is
// written as is; RoCEv2 senders (rxe, RNICs) use 0, which the ICRC masks
// anyway. Other layers get opts unchanged (IPv4 computes its header checksum
// with opts.ComputeChecksums).
func SerializeLayers(buf gopacket.SerializeBuffer, opts gopacket.SerializeOptions, ls ...gopacket.SerializableLayer) error {
	if len(ls) == 0 {
		return errors.New("rocelayer: SerializeLayers: no layers")
	}
	if err := buf.Clear(); err != nil {
		return err
	}
	udpOpts := opts
	udpOpts.ComputeChecksums = false
	for i := len(ls) - 1; i >= 0; i-- {
		o := opts
		if ls[i].LayerType() == layers.LayerTypeUDP {
			o = udpOpts
		}
		if err := ls[i].SerializeTo(buf, o); err != nil {
			return fmt.Errorf("rocelayer: serialize %v: %w", ls[i].LayerType(), err)
		}
	}
	return PutICRC(buf.Bytes(), ls[0].LayerType())
}

// FromFields returns the layers of the RoCEv2 packet described by f: a BTH,
// one layer per extension header of f.BTH.Opcode in wire order, and a
// gopacket.Payload if f.Payload is not empty. The BTH's PadCount is set
// from len(f.Payload) and its ICRC is zero. Serialized (after IP/UDP layers)
// they produce the same bytes as packet.Build.
func FromFields(f *packet.Fields) []gopacket.SerializableLayer {
	info := f.BTH.Opcode.Info()
	b := &BTH{Fields: f.BTH, Info: info}
	b.PadCount = uint8(bth.PadFor(len(f.Payload)))
	out := make([]gopacket.SerializableLayer, 0, 5)
	out = append(out, b)
	for _, h := range headerOrder {
		if info.Headers&h.hdr == 0 {
			continue
		}
		switch h.hdr {
		case bth.HdrRDETH:
			out = append(out, &RDETH{})
		case bth.HdrDETH:
			out = append(out, &DETH{Fields: f.DETH})
		case bth.HdrFETH:
			out = append(out, &FETH{Bits: f.FETH})
		case bth.HdrRETH:
			out = append(out, &RETH{Fields: f.RETH})
		case bth.HdrAtomicETH:
			out = append(out, &AtomicETH{Fields: f.AtomicETH})
		case bth.HdrAETH:
			out = append(out, &AETH{Fields: f.AETH})
		case bth.HdrAtomicAckETH:
			out = append(out, &AtomicAckETH{OrigData: f.AtomicAckOrig})
		case bth.HdrImmDt:
			out = append(out, &ImmDt{Imm: f.Imm})
		case bth.HdrIETH:
			out = append(out, &IETH{RKey: f.IETHRKey})
		case bth.HdrCNPPad:
			out = append(out, &CNPPad{})
		}
	}
	if len(f.Payload) > 0 {
		out = append(out, gopacket.Payload(f.Payload))
	}
	return out
}

// maxGSOSegment bounds the segment sizes GSOSegments tries: the largest
// RoCEv2 packet (4096-byte MTU payload, BTH, the longest extension
// headers, ICRC) fits.
const maxGSOSegment = 4096 + 64

// gsoDatagram is an IP packet carrying a UDP datagram, cut into the parts
// GSO segmentation works on.
type gsoDatagram struct {
	ip  []byte // the whole IP packet
	hl  int    // IP header length
	pay []byte // the UDP payload
}

// parseGSO cuts ip (IPv4 or IPv6 with UDP right after the fixed header)
// into its IP header and UDP payload; ok is false for anything else.
func parseGSO(ip []byte) (d gsoDatagram, ok bool) {
	if len(ip) < 1 {
		return d, false
	}
	var hl, end int
	switch ip[0] >> 4 {
	case 4:
		hl = int(ip[0]&0x0f) * 4
		if hl < 20 || len(ip) < hl+8 || ip[9] != 17 {
			return d, false
		}
		end = int(binary.BigEndian.Uint16(ip[2:]))
	case 6:
		hl = 40
		if len(ip) < hl+8 || ip[6] != 17 {
			return d, false
		}
		end = hl + int(binary.BigEndian.Uint16(ip[4:]))
	default:
		return d, false
	}
	if end > len(ip) || end < hl+8 {
		return d, false
	}
	return gsoDatagram{ip: ip, hl: hl, pay: ip[hl+8 : end]}, true
}

// segment writes segment k of the given size into scratch (room for the
// headers and size bytes) and returns it: the datagram's IP and UDP
// headers with their lengths set and (IPv4) the identification k above
// the datagram's and the header checksum recomputed.
func (d gsoDatagram) segment(scratch []byte, k, size int) []byte {
	hl := d.hl
	off := k * size
	n := min(size, len(d.pay)-off)
	b := scratch[:hl+8+n]
	copy(b, d.ip[:hl+8])
	copy(b[hl+8:], d.pay[off:off+n])
	if hl == 40 {
		binary.BigEndian.PutUint16(b[4:], uint16(8+n))
	} else {
		binary.BigEndian.PutUint16(b[2:], uint16(hl+8+n))
		binary.BigEndian.PutUint16(b[4:], binary.BigEndian.Uint16(d.ip[4:])+uint16(k))
		b[10], b[11] = 0, 0
		var sum uint32
		for i := 0; i < hl; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		binary.BigEndian.PutUint16(b[10:], ^uint16(sum))
	}
	binary.BigEndian.PutUint16(b[hl+4:], uint16(8+n))
	return b
}

// GSOSegments splits ip — an IPv4 or IPv6 packet whose UDP payload is a
// UDP GSO datagram as a capture sees it before segmentation (on lo, a veth
// or the sender's side of a device that segments: `tcpdump -i any` of a
// GSO sender) — into the IP packets Linux makes of it: segments of one
// size, the last possibly shorter, each with its own IP and UDP lengths
// and (IPv4) the identification numbered upward from the datagram's. It
// returns them (fresh buffers) only if every segment's ICRC is valid,
// else nil; a single valid RoCEv2 packet is not a GSO datagram. The cost
// is bounded: segment sizes up to maxGSOSegment, in steps of 4.
//
// A datagram of packets without payload (ACKs, READ requests, atomics)
// is split by GSOHeaderOnlySegments instead.
func GSOSegments(ip []byte) [][]byte {
	d, ok := parseGSO(ip)
	if !ok {
		return nil
	}
	scratch := make([]byte, d.hl+8+maxGSOSegment)
	for size := 16; size <= maxGSOSegment && size < len(d.pay); size += 4 {
		if icrc.Verify(d.segment(scratch, 0, size)) != nil {
			continue
		}
		var segs [][]byte
		for k := 0; k*size < len(d.pay); k++ {
			s := d.segment(scratch, k, size)
			if icrc.Verify(s) != nil {
				segs = nil
				break
			}
			segs = append(segs, append([]byte(nil), s...))
		}
		if segs != nil {
			return segs
		}
	}
	return nil
}

// maxGSOSegments bounds the segments GSOHeaderOnlySegments returns (a
// 64 KiB datagram of 20-byte ACKs has about 3,300).
const maxGSOSegments = 65536 / 16

// HeaderOnlySize returns the length of the RoCEv2 packet at the start of
// a UDP payload when its opcode carries no payload: the BTH, its
// extension headers (an RC ACKNOWLEDGE's SACK block included, if one
// follows the AETH) and the ICRC. It returns 0 for an opcode with a
// payload, an undefined opcode or a pad count other than 0.
func HeaderOnlySize(udpPayload []byte) int {
	if len(udpPayload) < bth.Size {
		return 0
	}
	h := bth.BTH(udpPayload[:bth.Size])
	info := h.Opcode().Info()
	if !info.Valid || info.Payload || h.PadCount() != 0 {
		return 0
	}
	size := bth.Size + info.HeaderLen + packet.ICRCSize
	if h.Opcode() == bth.RCAck {
		size += sackLen(udpPayload[bth.Size+info.HeaderLen:])
	}
	return size
}

// sackLen returns the length of the SACK block at the start of b (what
// follows an RC ACKNOWLEDGE's AETH), or 0 if none starts there.
func sackLen(b []byte) int {
	if len(b) < aeth.SACKHeaderSize {
		return 0
	}
	n := aeth.SACKSize(int(b[3]))
	if n > len(b) || !aeth.IsSACK(b[:n]) {
		return 0
	}
	return n
}

// GSOHeaderOnlySegments splits ip, an IPv4 or IPv6 packet whose UDP
// payload is longer than the packet without payload it starts with (an
// RC ACKNOWLEDGE, READ request, atomic or atomic ACKNOWLEDGE: see
// HeaderOnlySize), as the kernel segments a UDP GSO datagram: gso_size is
// that first packet's length, which a sender batching such packets gives
// them all. The segments (fresh buffers) are returned whatever their
// ICRCs, for the caller to check one by one; nil if ip is not such a
// datagram.
func GSOHeaderOnlySegments(ip []byte) [][]byte {
	d, ok := parseGSO(ip)
	if !ok {
		return nil
	}
	size := HeaderOnlySize(d.pay)
	if size == 0 || len(d.pay) <= size || len(d.pay)/size > maxGSOSegments {
		return nil
	}
	scratch := make([]byte, d.hl+8+size)
	var segs [][]byte
	for k := 0; k*size < len(d.pay); k++ {
		segs = append(segs, append([]byte(nil), d.segment(scratch, k, size)...))
	}
	return segs
}
