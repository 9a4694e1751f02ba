// Package rocelayer adds RoCEv2 to gopacket: a layer for the InfiniBand Base
// Transport Header (BTH) and one for each extension header, registered on UDP
// destination port 4791, so that
//
//	gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
//
// decodes Ethernet / IPv4 or IPv6 / UDP / BTH / extension headers / Payload.
//
// The BTH layer is validated with package packet (opcode table, lengths, pad
// count, TVer); it strips the pad and the 4-byte ICRC trailer and keeps the
// ICRC in its ICRC field. Every layer implements gopacket.SerializableLayer:
//
//	gopacket.SerializeLayers(buf, opts, eth, ip4, udp, bthLayer, rethLayer, gopacket.Payload(data))
//
// writes a complete frame whose ICRC trailer holds the BTH layer's ICRC field;
// SerializeLayers in this package (or PutICRC afterwards) computes the real
// ICRC over the serialized IP packet.
//
// Decoding is done by the BTH decoder, which adds the BTH layer and then one
// layer per extension header of the opcode, in wire order. The extension
// layers therefore only know which layer follows them when they were created
// by that decoder; used alone (for example in a gopacket.DecodingLayerParser)
// they report gopacket.LayerTypePayload as their next layer.
//
// A wire package: of this module it imports only the other wire packages
// (the header packages, icrc, packet), besides gopacket. It serves the
// command's pcap tools and the tests; nothing in the stack itself uses it.
package rocelayer

import (
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Port is the UDP destination port of RoCEv2.
const Port = 4791

// Layer type numbers, in the range gopacket reserves for application-specific
// types (1000-1999).
const (
	layerNumBTH = 1790 + iota
	layerNumRETH
	layerNumAETH
	layerNumAtomicETH
	layerNumAtomicAckETH
	layerNumImmDt
	layerNumIETH
	layerNumDETH
	layerNumCNPPad
	layerNumRDETH
)

// Layer types of RoCEv2 headers.
var (
	// LayerTypeBTH is the Base Transport Header; its decoder decodes the
	// whole RoCEv2 UDP payload (BTH, extension headers, payload, ICRC).
	LayerTypeBTH = gopacket.RegisterLayerType(layerNumBTH, gopacket.LayerTypeMetadata{Name: "BTH", Decoder: gopacket.DecodeFunc(decodeBTH)})
	// LayerTypeRETH is the RDMA Extended Transport Header (16 bytes).
	LayerTypeRETH = gopacket.RegisterLayerType(layerNumRETH, gopacket.LayerTypeMetadata{Name: "RETH", Decoder: gopacket.DecodeFunc(decodeRETH)})
	// LayerTypeAETH is the ACK Extended Transport Header (4 bytes).
	LayerTypeAETH = gopacket.RegisterLayerType(layerNumAETH, gopacket.LayerTypeMetadata{Name: "AETH", Decoder: gopacket.DecodeFunc(decodeAETH)})
	// LayerTypeAtomicETH is the Atomic Extended Transport Header (28 bytes).
	LayerTypeAtomicETH = gopacket.RegisterLayerType(layerNumAtomicETH, gopacket.LayerTypeMetadata{Name: "AtomicETH", Decoder: gopacket.DecodeFunc(decodeAtomicETH)})
	// LayerTypeAtomicAckETH is the Atomic ACK Extended Transport Header (8 bytes).
	LayerTypeAtomicAckETH = gopacket.RegisterLayerType(layerNumAtomicAckETH, gopacket.LayerTypeMetadata{Name: "AtomicAckETH", Decoder: gopacket.DecodeFunc(decodeAtomicAckETH)})
	// LayerTypeImmDt is the Immediate Data header (4 bytes).
	LayerTypeImmDt = gopacket.RegisterLayerType(layerNumImmDt, gopacket.LayerTypeMetadata{Name: "ImmDt", Decoder: gopacket.DecodeFunc(decodeImmDt)})
	// LayerTypeIETH is the Invalidate Extended Transport Header (4 bytes).
	LayerTypeIETH = gopacket.RegisterLayerType(layerNumIETH, gopacket.LayerTypeMetadata{Name: "IETH", Decoder: gopacket.DecodeFunc(decodeIETH)})
	// LayerTypeDETH is the Datagram Extended Transport Header (8 bytes).
	LayerTypeDETH = gopacket.RegisterLayerType(layerNumDETH, gopacket.LayerTypeMetadata{Name: "DETH", Decoder: gopacket.DecodeFunc(decodeDETH)})
	// LayerTypeCNPPad is the 16 reserved bytes of a RoCEv2 CNP.
	LayerTypeCNPPad = gopacket.RegisterLayerType(layerNumCNPPad, gopacket.LayerTypeMetadata{Name: "CNPPad", Decoder: gopacket.DecodeFunc(decodeCNPPad)})
	// LayerTypeFETH is the Flush Extended Transport Header of an RC FLUSH (4 bytes).
	LayerTypeFETH = gopacket.RegisterLayerType(layerNumFETH, gopacket.LayerTypeMetadata{Name: "FETH", Decoder: gopacket.DecodeFunc(decodeFETH)})
	// LayerTypeRDETH is the Reliable Datagram Extended Transport Header (4 bytes).
	LayerTypeRDETH = gopacket.RegisterLayerType(layerNumRDETH, gopacket.LayerTypeMetadata{Name: "RDETH", Decoder: gopacket.DecodeFunc(decodeRDETH)})
)

func init() {
	layers.RegisterUDPPortLayerType(layers.UDPPort(Port), LayerTypeBTH)
}
