package rocelayer

import (
	"net"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
)

// Sample is one frame of SampleFrames.
type Sample struct {
	// Fields are the RoCEv2 fields the frame was built from.
	Fields packet.Fields
	// Frame is the whole Ethernet frame (IPv4, UDP, RoCEv2 with its ICRC).
	Frame []byte
}

// Addresses of the sample frames (TEST-NET-1, locally administered MACs).
var (
	SampleSrcIP  = net.IPv4(192, 0, 2, 1).To4()
	SampleDstIP  = net.IPv4(192, 0, 2, 2).To4()
	SampleSrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	SampleDstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

// SampleOpcodes returns every RC, UC and UD opcode of the opcode table
// followed by CNP, in numeric order, but RC FLUSH and ATOMIC_WRITE (IBTA
// 1.5): tshark 4.0, which test/tshark compares the samples with, does not
// decode them, and the stack does not execute them.
func SampleOpcodes() []bth.Opcode {
	var ops []bth.Opcode
	for o := 0; o < 256; o++ {
		op := bth.Opcode(o)
		in := op.Info()
		if !in.Valid || in.Kind == bth.KindFlush || in.Kind == bth.KindAtomicWrite {
			continue
		}
		switch in.Transport {
		case bth.TransportRC, bth.TransportUC, bth.TransportUD, bth.TransportCNP:
			ops = append(ops, op)
		}
	}
	return ops
}

// SampleFields returns deterministic, distinct field values for one packet
// of opcode op; i makes values differ between packets.
func SampleFields(op bth.Opcode, i int) packet.Fields {
	in := op.Info()
	f := packet.Fields{BTH: bth.Fields{
		Opcode: op,
		PKey:   bth.DefaultPKey,
		DestQP: 0x000011 + uint32(i),
		PSN:    bth.PSN(0xfffff0).Add(i * 3), // crosses the 24-bit wrap
	}}
	if in.Request && (in.Pos == bth.PosLast || in.Pos == bth.PosOnly) {
		f.BTH.AckReq = true
	}
	if in.Imm || in.Inv {
		f.BTH.SolicitedEvent = i%2 == 0
	}
	if in.Kind == bth.KindCNP {
		f.BTH.BECN = true // as RNICs send it; PSN and flags zero
		f.BTH.PSN = 0
	}
	if in.Payload {
		n := 1 + (i*37)%200 // every pad count shows up
		f.Payload = make([]byte, n)
		for j := range f.Payload {
			f.Payload[j] = byte(i + j*7)
		}
	}
	f.BTH.PadCount = uint8(bth.PadFor(len(f.Payload)))
	f.RETH.VA = 0x55d90dddb000 + uint64(i)*0x40
	f.RETH.RKey = 0x00000654 + uint32(i)
	f.RETH.DMALength = uint32(len(f.Payload))
	if in.Kind == bth.KindReadRequest {
		f.RETH.DMALength = 4096
	}
	f.AETH.Syndrome = aeth.ACK(aeth.NoCreditLimit)
	f.AETH.MSN = 0x000100 + uint32(i)
	f.AtomicETH.VA = 0x555fe1721000 + uint64(i)*8
	f.AtomicETH.RKey = 0x00000bba + uint32(i)
	f.AtomicETH.SwapAdd = 0x0102030405060708 + uint64(i)
	f.AtomicETH.Compare = 0x1112131415161718 + uint64(i)
	f.AtomicAckOrig = 0xbb263160900a2152 + uint64(i)
	f.Imm = 0x11220000 + uint32(i)
	f.IETHRKey = 0x00000700 + uint32(i)
	f.DETH.QKey = 0x11111111
	f.DETH.SrcQP = 0x004242 + uint32(i)
	return f
}

// SampleFrames returns one Ethernet/IPv4/UDP frame for every opcode of
// SampleOpcodes, built with FromFields and SerializeLayers, with correct IPv4
// checksums and ICRCs.
func SampleFrames() ([]Sample, error) {
	var out []Sample
	for i, op := range SampleOpcodes() {
		f := SampleFields(op, i)
		eth := &layers.Ethernet{SrcMAC: SampleSrcMAC, DstMAC: SampleDstMAC, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
			SrcIP: SampleSrcIP, DstIP: SampleDstIP}
		udp := &layers.UDP{SrcPort: layers.UDPPort(0xc000 | (f.BTH.DestQP & 0x3fff)), DstPort: Port}
		ls := append([]gopacket.SerializableLayer{eth, ip, udp}, FromFields(&f)...)
		buf := gopacket.NewSerializeBuffer()
		if err := SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
			return nil, err
		}
		out = append(out, Sample{Fields: f, Frame: append([]byte(nil), buf.Bytes()...)})
	}
	return out, nil
}
