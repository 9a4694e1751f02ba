package pcaptap

import (
	"bytes"
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
// the kernel numbers a GSO datagram's segments), whole and headers-only,
// with the payload in Buf and zero-copy (the payload in Packet.Payload, as
// a socket link with CapZeroCopy sends a RDMA WRITE's).
func BenchmarkWriteBatch(b *testing.B) {
	src, dst := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	pkts := make([]udp.Packet, 64)
	zc := make([]udp.Packet, 64)
	for i := range pkts {
		p := build(b, 1024, uint32(i))
		h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), FlagsFrag: dfFlag, ID: uint16(i), SrcPort: 0xc123, DstPort: 4791}
		icrc.Store(p, icrc.ComputeIPv4(&h, p))
		pkts[i] = udp.Packet{Buf: p, Addr: dst, SrcPort: 0xc123}
		zc[i] = zeroCopy(pkts[i])
	}
	for _, c := range []struct {
		name string
		snap int
		pkts []udp.Packet
	}{{"whole", 0, pkts}, {"snaplen128", 128, pkts}, {"zerocopy/whole", 0, zc}, {"zerocopy/snaplen128", 128, zc}} {
		b.Run(c.name, func(b *testing.B) {
			w, err := NewWriterSnap(io.Discard, c.snap)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(pkts) * len(pkts[0].Buf)))
			b.ReportAllocs()
			for b.Loop() {
				if n := w.writeBatch(src, true, c.pkts); n != len(c.pkts) {
					b.Fatalf("%d of %d recorded", n, len(c.pkts))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(c.pkts)), "ns/packet")
			if w.Unverified() != 0 {
				b.Fatalf("%d unverified", w.Unverified())
			}
		})
	}
}

// zeroCopy returns p as a zero-copy send hands it to a link: Buf without
// the payload (the BTH, pad and ICRC of a SEND_ONLY), the payload in
// Payload.
func zeroCopy(p udp.Packet) udp.Packet {
	at := len(p.Buf) - 4 - int(p.Buf[1]>>4&3)
	buf := append(append([]byte{}, p.Buf[:12]...), p.Buf[at:]...)
	return udp.Packet{Buf: buf, Payload: bytes.Clone(p.Buf[12:at]), Addr: p.Addr, SrcPort: p.SrcPort, TOS: p.TOS}
}
