package rocelayer_test

import (
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
)

// frame4K returns an Ethernet/IPv4/UDP RC_SEND_MIDDLE frame with 4 KiB of
// payload and a correct ICRC.
func frame4K(b testing.TB) []byte {
	f := rocelayer.SampleFields(bth.RCSendMiddle, 1)
	f.Payload = make([]byte, 4096)
	eth := &layers.Ethernet{SrcMAC: rocelayer.SampleSrcMAC, DstMAC: rocelayer.SampleDstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP, SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
	udp := &layers.UDP{SrcPort: 0xc001, DstPort: rocelayer.Port}
	buf := gopacket.NewSerializeBuffer()
	if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, append([]gopacket.SerializableLayer{eth, ip, udp}, rocelayer.FromFields(&f)...)...); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkNewPacket decodes a 4 KiB RoCEv2 frame down to its payload and
// verifies the ICRC. Baseline: BenchmarkNewPacketUDPOnly.
func BenchmarkNewPacket(b *testing.B) {
	fr := frame4K(b)
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	for b.Loop() {
		p := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
		if err := rocelayer.VerifyICRC(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewPacketUDPOnly is the baseline: the same frame sent to another
// UDP port, so gopacket stops at UDP (plus a Payload layer).
func BenchmarkNewPacketUDPOnly(b *testing.B) {
	fr := frame4K(b)
	fr[14+20+2], fr[14+20+3] = 0x12, 0x34
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	for b.Loop() {
		gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
	}
}

// BenchmarkBTHDecodeFromBytes decodes the UDP payload into a reused BTH
// layer (the DecodingLayer path). Baseline: packet.Parse on the same bytes.
func BenchmarkBTHDecodeFromBytes(b *testing.B) {
	pay := frame4K(b)[14+20+8:]
	var l rocelayer.BTH
	b.SetBytes(int64(len(pay)))
	b.ReportAllocs()
	for b.Loop() {
		if err := l.DecodeFromBytes(pay, gopacket.NilDecodeFeedback); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPacketParse(b *testing.B) {
	pay := frame4K(b)[14+20+8:]
	var p packet.Packet
	b.SetBytes(int64(len(pay)))
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Parse(pay); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBTHDecodeAllocs(t *testing.T) {
	pay := frame4K(t)[14+20+8:]
	var l rocelayer.BTH
	if n := testing.AllocsPerRun(100, func() { _ = l.DecodeFromBytes(pay, gopacket.NilDecodeFeedback) }); n != 0 {
		t.Errorf("BTH.DecodeFromBytes: %v allocs", n)
	}
}
