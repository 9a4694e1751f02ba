package pcaptap

import (
	"io"
	"net/netip"
	"testing"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/udp"
)

// BenchmarkWritePacket is the cost of recording one 1024-byte RoCEv2
// packet (ICRC valid for identification 0 and DF, as a socket link sends)
// into a buffered writer over io.Discard, whole and headers-only.
func BenchmarkWritePacket(b *testing.B) {
	src, dst := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	p := build(b, 1024, 1)
	h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), FlagsFrag: dfFlag, SrcPort: 0xc123, DstPort: 4791}
	icrc.Store(p, icrc.ComputeIPv4(&h, p))
	for _, snap := range []int{0, 128} {
		b.Run(map[int]string{0: "whole", 128: "snaplen128"}[snap], func(b *testing.B) {
			w, err := NewWriterSnap(io.Discard, snap)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if err := w.WritePacket(src, dst, 0xc123, 0, p); err != nil {
					b.Fatal(err)
				}
			}
			if w.Unverified() != 0 {
				b.Fatalf("%d unverified", w.Unverified())
			}
		})
	}
}

// BenchmarkWriteBatch is the cost per packet of recording what one GSO
// send of 64 packets of 1024 bytes hands a Tap (identifications 0..63, as
// the kernel numbers a GSO datagram's segments), whole and headers-only.
func BenchmarkWriteBatch(b *testing.B) {
	src, dst := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	pkts := make([]udp.Packet, 64)
	for i := range pkts {
		p := build(b, 1024, uint32(i))
		h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), FlagsFrag: dfFlag, ID: uint16(i), SrcPort: 0xc123, DstPort: 4791}
		icrc.Store(p, icrc.ComputeIPv4(&h, p))
		pkts[i] = udp.Packet{Buf: p, Addr: dst, SrcPort: 0xc123}
	}
	for _, snap := range []int{0, 128} {
		b.Run(map[int]string{0: "whole", 128: "snaplen128"}[snap], func(b *testing.B) {
			w, err := NewWriterSnap(io.Discard, snap)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(pkts) * len(pkts[0].Buf)))
			b.ReportAllocs()
			for b.Loop() {
				if n := w.writeBatch(src, true, pkts); n != len(pkts) {
					b.Fatalf("%d of %d recorded", n, len(pkts))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(pkts)), "ns/packet")
			if w.Unverified() != 0 {
				b.Fatalf("%d unverified", w.Unverified())
			}
		})
	}
}
