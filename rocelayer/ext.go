package rocelayer

import (
	"encoding/binary"
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/atomiceth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/deth"
	"github.com/gorocev2/rocev2/immdt"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
)

// Sizes of the headers without a package of their own.
const (
	// CNPPadSize is the length of the reserved bytes of a RoCEv2 CNP.
	CNPPadSize = 16
	// RDETHSize is the length of an RDETH.
	RDETHSize = 4
)

// extLayer is an extension header layer as the BTH decoder builds them.
type extLayer interface {
	gopacket.DecodingLayer
	gopacket.Layer
	setNext(gopacket.LayerType)
}

// headerOrder lists the extension headers in wire order, with their layer
// types and constructors.
var headerOrder = [...]struct {
	hdr  bth.Header
	typ  gopacket.LayerType
	make func() extLayer
}{
	{bth.HdrRDETH, LayerTypeRDETH, func() extLayer { return &RDETH{} }},
	{bth.HdrDETH, LayerTypeDETH, func() extLayer { return &DETH{} }},
	{bth.HdrFETH, LayerTypeFETH, func() extLayer { return &FETH{} }},
	{bth.HdrRETH, LayerTypeRETH, func() extLayer { return &RETH{} }},
	{bth.HdrAtomicETH, LayerTypeAtomicETH, func() extLayer { return &AtomicETH{} }},
	{bth.HdrAETH, LayerTypeAETH, func() extLayer { return &AETH{} }},
	{bth.HdrAtomicAckETH, LayerTypeAtomicAckETH, func() extLayer { return &AtomicAckETH{} }},
	{bth.HdrImmDt, LayerTypeImmDt, func() extLayer { return &ImmDt{} }},
	{bth.HdrIETH, LayerTypeIETH, func() extLayer { return &IETH{} }},
	{bth.HdrCNPPad, LayerTypeCNPPad, func() extLayer { return &CNPPad{} }},
}

// extBase holds what every extension header layer shares: contents/payload
// and the type of the layer that follows it.
type extBase struct {
	layers.BaseLayer
	next gopacket.LayerType
}

// NextLayerType returns the type of the next extension header as set by the
// BTH decoder, or gopacket.LayerTypePayload.
func (e *extBase) NextLayerType() gopacket.LayerType {
	if e.next == 0 {
		return gopacket.LayerTypePayload
	}
	return e.next
}

func (e *extBase) setNext(t gopacket.LayerType) { e.next = t }

// split checks that data holds a header of n bytes and sets Contents and
// Payload.
func (e *extBase) split(data []byte, n int, t gopacket.LayerType, df gopacket.DecodeFeedback) error {
	if len(data) < n {
		df.SetTruncated()
		return fmt.Errorf("rocelayer: %v: %w: %d bytes, need %d", t, packet.ErrTruncated, len(data), n)
	}
	e.BaseLayer = layers.BaseLayer{Contents: data[:n], Payload: data[n:]}
	e.next = 0
	return nil
}

// decodeExt is the gopacket decoder of a standalone extension header layer.
func decodeExt(l extLayer, data []byte, p gopacket.PacketBuilder) error {
	if err := l.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(l)
	return p.NextDecoder(l.NextLayerType())
}

func decodeRETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&RETH{}, data, p)
}
func decodeAETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&AETH{}, data, p)
}
func decodeAtomicETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&AtomicETH{}, data, p)
}
func decodeAtomicAckETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&AtomicAckETH{}, data, p)
}
func decodeImmDt(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&ImmDt{}, data, p)
}
func decodeIETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&IETH{}, data, p)
}
func decodeDETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&DETH{}, data, p)
}
func decodeCNPPad(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&CNPPad{}, data, p)
}
func decodeRDETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&RDETH{}, data, p)
}

// RETH is the gopacket layer of an RDMA Extended Transport Header.
type RETH struct {
	extBase
	// Fields holds VA, RKey and DMALength.
	reth.Fields
}

// LayerType returns LayerTypeRETH.
func (r *RETH) LayerType() gopacket.LayerType { return LayerTypeRETH }

// CanDecode returns LayerTypeRETH.
func (r *RETH) CanDecode() gopacket.LayerClass { return LayerTypeRETH }

// DecodeFromBytes decodes the first reth.Size bytes of data.
func (r *RETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := r.split(data, reth.Size, LayerTypeRETH, df); err != nil {
		return err
	}
	r.Fields = reth.RETH(data).Fields()
	return nil
}

// SerializeTo prepends the RETH.
func (r *RETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(reth.Size)
	if err != nil {
		return err
	}
	reth.RETH(h).Encode(&r.Fields)
	return nil
}

// AETH is the gopacket layer of an ACK Extended Transport Header.
type AETH struct {
	extBase
	// Fields holds Syndrome and MSN.
	aeth.Fields
}

// LayerType returns LayerTypeAETH.
func (a *AETH) LayerType() gopacket.LayerType { return LayerTypeAETH }

// CanDecode returns LayerTypeAETH.
func (a *AETH) CanDecode() gopacket.LayerClass { return LayerTypeAETH }

// DecodeFromBytes decodes the first aeth.Size bytes of data.
func (a *AETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := a.split(data, aeth.Size, LayerTypeAETH, df); err != nil {
		return err
	}
	a.Fields = aeth.AETH(data).Fields()
	return nil
}

// SerializeTo prepends the AETH.
func (a *AETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(aeth.Size)
	if err != nil {
		return err
	}
	aeth.AETH(h).Encode(&a.Fields)
	return nil
}

// AtomicETH is the gopacket layer of an Atomic Extended Transport Header.
type AtomicETH struct {
	extBase
	// Fields holds VA, RKey, SwapAdd and Compare.
	atomiceth.Fields
}

// LayerType returns LayerTypeAtomicETH.
func (a *AtomicETH) LayerType() gopacket.LayerType { return LayerTypeAtomicETH }

// CanDecode returns LayerTypeAtomicETH.
func (a *AtomicETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicETH }

// DecodeFromBytes decodes the first atomiceth.Size bytes of data.
func (a *AtomicETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := a.split(data, atomiceth.Size, LayerTypeAtomicETH, df); err != nil {
		return err
	}
	a.Fields = atomiceth.AtomicETH(data).Fields()
	return nil
}

// SerializeTo prepends the AtomicETH.
func (a *AtomicETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(atomiceth.Size)
	if err != nil {
		return err
	}
	atomiceth.AtomicETH(h).Encode(&a.Fields)
	return nil
}

// AtomicAckETH is the gopacket layer of an Atomic ACK Extended Transport
// Header.
type AtomicAckETH struct {
	extBase
	// OrigData is the original remote data the atomic operation found.
	OrigData uint64
}

// LayerType returns LayerTypeAtomicAckETH.
func (a *AtomicAckETH) LayerType() gopacket.LayerType { return LayerTypeAtomicAckETH }

// CanDecode returns LayerTypeAtomicAckETH.
func (a *AtomicAckETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicAckETH }

// DecodeFromBytes decodes the first aeth.AtomicAckSize bytes of data.
func (a *AtomicAckETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := a.split(data, aeth.AtomicAckSize, LayerTypeAtomicAckETH, df); err != nil {
		return err
	}
	a.OrigData = aeth.AtomicAck(data).OrigData()
	return nil
}

// SerializeTo prepends the AtomicAckETH.
func (a *AtomicAckETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(aeth.AtomicAckSize)
	if err != nil {
		return err
	}
	aeth.AtomicAck(h).SetOrigData(a.OrigData)
	return nil
}

// ImmDt is the gopacket layer of the Immediate Data header.
type ImmDt struct {
	extBase
	// Imm is the immediate data as a big-endian uint32.
	Imm uint32
}

// LayerType returns LayerTypeImmDt.
func (i *ImmDt) LayerType() gopacket.LayerType { return LayerTypeImmDt }

// CanDecode returns LayerTypeImmDt.
func (i *ImmDt) CanDecode() gopacket.LayerClass { return LayerTypeImmDt }

// DecodeFromBytes decodes the first immdt.Size bytes of data.
func (i *ImmDt) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := i.split(data, immdt.Size, LayerTypeImmDt, df); err != nil {
		return err
	}
	i.Imm = immdt.ImmDt(data).Imm()
	return nil
}

// SerializeTo prepends the ImmDt.
func (i *ImmDt) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(immdt.Size)
	if err != nil {
		return err
	}
	immdt.ImmDt(h).SetImm(i.Imm)
	return nil
}

// IETH is the gopacket layer of the Invalidate Extended Transport Header.
type IETH struct {
	extBase
	// RKey is the R_Key to invalidate.
	RKey uint32
}

// LayerType returns LayerTypeIETH.
func (i *IETH) LayerType() gopacket.LayerType { return LayerTypeIETH }

// CanDecode returns LayerTypeIETH.
func (i *IETH) CanDecode() gopacket.LayerClass { return LayerTypeIETH }

// DecodeFromBytes decodes the first immdt.IETHSize bytes of data.
func (i *IETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := i.split(data, immdt.IETHSize, LayerTypeIETH, df); err != nil {
		return err
	}
	i.RKey = immdt.IETH(data).RKey()
	return nil
}

// SerializeTo prepends the IETH.
func (i *IETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(immdt.IETHSize)
	if err != nil {
		return err
	}
	immdt.IETH(h).SetRKey(i.RKey)
	return nil
}

// DETH is the gopacket layer of a Datagram Extended Transport Header.
type DETH struct {
	extBase
	// Fields holds QKey and SrcQP.
	deth.Fields
}

// LayerType returns LayerTypeDETH.
func (d *DETH) LayerType() gopacket.LayerType { return LayerTypeDETH }

// CanDecode returns LayerTypeDETH.
func (d *DETH) CanDecode() gopacket.LayerClass { return LayerTypeDETH }

// DecodeFromBytes decodes the first deth.Size bytes of data.
func (d *DETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := d.split(data, deth.Size, LayerTypeDETH, df); err != nil {
		return err
	}
	d.Fields = deth.DETH(data).Fields()
	return nil
}

// SerializeTo prepends the DETH.
func (d *DETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(deth.Size)
	if err != nil {
		return err
	}
	deth.DETH(h).Encode(&d.Fields)
	return nil
}

// CNPPad is the gopacket layer of the 16 reserved bytes of a RoCEv2 CNP.
type CNPPad struct {
	extBase
	// Reserved holds the reserved bytes (zero when sent).
	Reserved [CNPPadSize]byte
}

// LayerType returns LayerTypeCNPPad.
func (c *CNPPad) LayerType() gopacket.LayerType { return LayerTypeCNPPad }

// CanDecode returns LayerTypeCNPPad.
func (c *CNPPad) CanDecode() gopacket.LayerClass { return LayerTypeCNPPad }

// DecodeFromBytes decodes the first CNPPadSize bytes of data.
func (c *CNPPad) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := c.split(data, CNPPadSize, LayerTypeCNPPad, df); err != nil {
		return err
	}
	copy(c.Reserved[:], data)
	return nil
}

// SerializeTo prepends the reserved bytes.
func (c *CNPPad) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(CNPPadSize)
	if err != nil {
		return err
	}
	copy(h, c.Reserved[:])
	return nil
}

// RDETH is the gopacket layer of a Reliable Datagram Extended Transport
// Header (RD is not used by RoCEv2 peers; the layer exists for completeness).
type RDETH struct {
	extBase
	// EECnxt is the 24-bit end-to-end context.
	EECnxt uint32
}

// LayerType returns LayerTypeRDETH.
func (r *RDETH) LayerType() gopacket.LayerType { return LayerTypeRDETH }

// CanDecode returns LayerTypeRDETH.
func (r *RDETH) CanDecode() gopacket.LayerClass { return LayerTypeRDETH }

// DecodeFromBytes decodes the first RDETHSize bytes of data.
func (r *RDETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := r.split(data, RDETHSize, LayerTypeRDETH, df); err != nil {
		return err
	}
	r.EECnxt = binary.BigEndian.Uint32(data) & 0xffffff
	return nil
}

// SerializeTo prepends the RDETH (reserved byte zero).
func (r *RDETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(RDETHSize)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(h, r.EECnxt&0xffffff)
	return nil
}

// FETH is the gopacket layer of the Flush Extended Transport Header of an
// RC FLUSH (IBTA 1.5; Linux struct rxe_feth): 4 bytes, the placement type
// in bits 0-3 and the selectivity level in bits 4-5.
type FETH struct {
	extBase
	// Bits is the header as a big-endian word.
	Bits uint32
}

// LayerType returns LayerTypeFETH.
func (f *FETH) LayerType() gopacket.LayerType { return LayerTypeFETH }

// CanDecode returns LayerTypeFETH.
func (f *FETH) CanDecode() gopacket.LayerClass { return LayerTypeFETH }

// PlacementType returns the placement type (bits 0-3).
func (f *FETH) PlacementType() uint8 { return uint8(f.Bits & 0x0f) }

// SelectivityLevel returns the selectivity level (bits 4-5).
func (f *FETH) SelectivityLevel() uint8 { return uint8(f.Bits>>4) & 0x03 }

// DecodeFromBytes decodes the first bth.FETHSize bytes of data.
func (f *FETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if err := f.split(data, bth.FETHSize, LayerTypeFETH, df); err != nil {
		return err
	}
	f.Bits = binary.BigEndian.Uint32(data)
	return nil
}

// SerializeTo prepends the FETH.
func (f *FETH) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(bth.FETHSize)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(h, f.Bits)
	return nil
}

func decodeFETH(data []byte, p gopacket.PacketBuilder) error {
	return decodeExt(&FETH{}, data, p)
}
