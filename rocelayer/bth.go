package rocelayer

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
)

// BTH is the gopacket layer of an InfiniBand Base Transport Header and the
// RoCEv2 trailer (pad and ICRC).
//
// After decoding, Contents holds the 12 BTH bytes and Payload the extension
// headers and the payload, without pad and ICRC. SerializeTo appends the pad
// and the ICRC field as the 4-byte trailer and prepends the BTH; with
// SerializeOptions.FixLengths it also sets PadCount from the payload length.
type BTH struct {
	layers.BaseLayer
	// Fields holds every BTH field.
	bth.Fields
	// Info is the opcode table entry of Opcode (set by DecodeFromBytes;
	// ignored by SerializeTo).
	Info bth.Info
	// ICRC is the invariant CRC as carried in the trailer (a little-endian
	// uint32 on the wire, the value icrc.Compute returns).
	ICRC uint32

	pkt packet.Packet
}

// LayerType returns LayerTypeBTH.
func (b *BTH) LayerType() gopacket.LayerType { return LayerTypeBTH }

// CanDecode returns LayerTypeBTH.
func (b *BTH) CanDecode() gopacket.LayerClass { return LayerTypeBTH }

// NextLayerType returns the layer type of the opcode's first extension
// header, or gopacket.LayerTypePayload if it has none.
func (b *BTH) NextLayerType() gopacket.LayerType {
	for _, h := range headerOrder {
		if b.Info.Headers&h.hdr != 0 {
			return h.typ
		}
	}
	return gopacket.LayerTypePayload
}

// Packet returns the validated view of the whole RoCEv2 UDP payload (BTH ..
// ICRC) from the last successful DecodeFromBytes. Its slices alias the
// decoded data.
func (b *BTH) Packet() *packet.Packet { return &b.pkt }

// DecodeFromBytes decodes a whole RoCEv2 UDP payload (BTH, extension headers,
// payload, pad, ICRC). The payload is validated with packet.Parse; its errors
// are returned wrapped (errors.Is works with packet.ErrTruncated and the
// other packet errors).
func (b *BTH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := b.pkt.Parse(data); err != nil {
		b.pkt = packet.Packet{}
		if errors.Is(err, packet.ErrTruncated) {
			df.SetTruncated()
		}
		return fmt.Errorf("rocelayer: BTH: %w", err)
	}
	h := bth.BTH(data[:bth.Size])
	b.Fields = h.Fields()
	b.Info = b.pkt.Info
	b.ICRC = b.pkt.ICRC
	end := len(data) - icrc.Size - h.PadCount()
	b.BaseLayer = layers.BaseLayer{Contents: data[:bth.Size], Payload: data[bth.Size:end]}
	return nil
}

// SerializeTo prepends the BTH and appends the pad (zeros) and the ICRC
// trailer to the bytes already in buf (extension headers and payload, whose
// length must be a multiple of 4 apart from the payload's own pad). The
// trailer holds the ICRC field; compute the real value over the finished IP
// packet with PutICRC or SerializeLayers. With opts.FixLengths PadCount is
// set from the payload length.
func (b *BTH) SerializeTo(buf gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	pad := bth.PadFor(len(buf.Bytes()))
	tr, err := buf.AppendBytes(pad + icrc.Size)
	if err != nil {
		return err
	}
	clear(tr[:pad])
	binary.LittleEndian.PutUint32(tr[pad:], b.ICRC)
	if opts.FixLengths {
		b.PadCount = uint8(pad)
	}
	hdr, err := buf.PrependBytes(bth.Size)
	if err != nil {
		return err
	}
	bth.BTH(hdr).Encode(&b.Fields)
	return nil
}

// decodeBTH decodes a RoCEv2 UDP payload into the BTH layer, one layer per
// extension header, and a gopacket.Payload layer for a non-empty payload.
func decodeBTH(data []byte, p gopacket.PacketBuilder) error {
	b := &BTH{}
	if err := b.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(b)
	rest := b.Payload
	var prev extLayer
	for _, h := range headerOrder {
		if b.Info.Headers&h.hdr == 0 {
			continue
		}
		n := h.hdr.Size()
		if len(rest) < n { // cannot happen after packet.Parse; never panic
			return fmt.Errorf("rocelayer: %v: %w", h.typ, packet.ErrTruncated)
		}
		l := h.make()
		if err := l.DecodeFromBytes(rest, p); err != nil {
			return err
		}
		if prev != nil {
			prev.setNext(h.typ)
		}
		p.AddLayer(l)
		prev = l
		rest = rest[n:]
	}
	return p.NextDecoder(gopacket.LayerTypePayload)
}
