package pcaptap

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/udp"
)

// refRecord is a record as a tap writes it, made the plain way, one packet
// at a time and without the writer's caches: the wire bytes put together
// (udp.Packet.AppendWire), the frame's headers built by header4/header6,
// the source port, flags and IPv4 identification found by solving the
// ICRC (icrc.SolveIPv4ID) for the candidates in the writer's order, or
// identification 0 with DF for a cut record and for a packet no candidate
// fits.
func refRecord(t time.Time, snap int, src, dst netip.Addr, p *udp.Packet) []byte {
	src, dst = src.Unmap(), dst.Unmap()
	payload := p.AppendWire(nil)
	frame := make([]byte, ethSize+ipv6Size+udpSize+len(payload))
	port, id, flags := p.SrcPort, uint16(0), uint16(dfFlag)
	var n int
	if src.Is4() {
		if len(frame)-ipv6Size+ipv4Size <= snap {
		find:
			for _, sp := range ports(p.SrcPort) {
				for _, fl := range [2]uint16{dfFlag, 0} {
					h := icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), FlagsFrag: fl, SrcPort: sp, DstPort: udp.Port}
					if sid, ok := icrc.SolveIPv4ID(&h, payload); ok {
						port, id, flags = sp, sid, fl
						break find
					}
				}
			}
		}
		n = header4(frame, src, dst, port, p.TOS, id, flags, len(payload))
		copy(frame[ethSize+ipv4Size+udpSize:], payload)
	} else {
		if len(frame) <= snap {
			for _, sp := range ports(p.SrcPort) {
				h := icrc.IPv6Pseudo{Src: src.As16(), Dst: dst.As16(), SrcPort: sp, DstPort: udp.Port}
				if icrc.ComputeIPv6(&h, payload) == icrc.Load(payload) {
					port = sp
					break
				}
			}
		}
		n = header6(frame, src, dst, port, p.TOS, len(payload))
		copy(frame[ethSize+ipv6Size+udpSize:], payload)
	}
	keep := min(n, snap)
	rec := make([]byte, 16+keep)
	binary.LittleEndian.PutUint32(rec[0:], uint32(t.Unix()))
	binary.LittleEndian.PutUint32(rec[4:], uint32(t.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(rec[8:], uint32(keep))
	binary.LittleEndian.PutUint32(rec[12:], uint32(n))
	copy(rec[16:], frame[:keep])
	return rec
}

// gsoBatch returns what a GSO send of count packets of size payload bytes
// (the last one last bytes) from src:sport to dst hands a tap: ICRCs for
// identifications first, first+1, …, DF, TOS tos.
func gsoBatch(t *testing.T, src, dst netip.Addr, sport uint16, tos uint8, first uint16, count, size, last int) []udp.Packet {
	pkts := make([]udp.Packet, count)
	for i := range pkts {
		n := size
		if i == count-1 {
			n = last
		}
		b := build(t, n, uint32(1000+i))
		var c uint32
		if s, d := src.Unmap(), dst.Unmap(); s.Is4() {
			c = icrc.ComputeIPv4(&icrc.IPv4Pseudo{Src: s.As4(), Dst: d.As4(), FlagsFrag: dfFlag, ID: first + uint16(i), SrcPort: sport, DstPort: udp.Port}, b)
		} else {
			c = icrc.ComputeIPv6(&icrc.IPv6Pseudo{Src: s.As16(), Dst: d.As16(), SrcPort: sport, DstPort: udp.Port}, b)
		}
		icrc.Store(b, c)
		pkts[i] = udp.Packet{Buf: b, Addr: dst, SrcPort: sport, TOS: tos}
	}
	return pkts
}

// TestBatchRecordsMatchReference: what writeBatch records for the
// segments of GSO sends (IPv4 and IPv6, payload in Buf and zero-copy, a
// last shorter segment, two destinations and two TOS values alternating,
// received GRO batches with identifications other than 0, a packet whose
// ICRC fits no header, IPv4-mapped addresses), whole and with snap
// lengths that cut inside the payload, the BTH, the IP header and the
// Ethernet header, is byte for byte what refRecord makes of each packet
// alone; and WritePacket records the same as writeBatch.
func TestBatchRecordsMatchReference(t *testing.T) {
	at := time.Unix(1_700_000_000, 123_456_789)
	type batch struct {
		local netip.Addr
		sent  bool
		pkts  []udp.Packet
	}
	var batches []batch
	for _, fam := range [][3]string{{"192.0.2.1", "192.0.2.2", "192.0.2.3"}, {"2001:db8::1", "2001:db8::2", "2001:db8::3"}} {
		l, d1, d2 := netip.MustParseAddr(fam[0]), netip.MustParseAddr(fam[1]), netip.MustParseAddr(fam[2])
		for _, zc := range []bool{false, true} {
			sends := [][]udp.Packet{
				gsoBatch(t, l, d1, 0xc123, 2, 0, 64, 1024, 300),
				gsoBatch(t, l, d2, 0xc124, 2, 0, 8, 1024, 1024),
				gsoBatch(t, l, d1, 0xc123, 3, 0, 5, 1024, 1),
				gsoBatch(t, l, d1, udp.Port, 0, 0, 3, 256, 40),
			}
			mixed := append(append([]udp.Packet{}, sends[0][:3]...), sends[1][:3]...)
			sends = append(sends, mixed)
			for _, s := range sends {
				if zc {
					for i := range s {
						s[i] = zeroCopy(s[i])
					}
				}
				batches = append(batches, batch{l, true, s})
			}
		}
		// Received: segments of a GRO batch (identifications from 0x1234
		// on), and from the other peer's port 4791.
		batches = append(batches, batch{l, false, gsoBatch(t, d1, l, 0xd000, 2, 0x1234, 16, 1024, 500)})
		batches = append(batches, batch{l, false, gsoBatch(t, d2, l, udp.Port, 0, 7, 2, 60, 60)})
		for i := range batches[len(batches)-2].pkts {
			batches[len(batches)-2].pkts[i].Addr = d1
		}
		for i := range batches[len(batches)-1].pkts {
			batches[len(batches)-1].pkts[i].Addr = d2
		}
	}
	// A packet no header fits (its ICRC is wrong), and IPv4-mapped
	// addresses.
	bad := gsoBatch(t, netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), 0xc123, 0, 0, 2, 100, 100)
	bad[1].Buf[len(bad[1].Buf)-1] ^= 1
	batches = append(batches, batch{netip.MustParseAddr("192.0.2.1"), true, bad})
	mapped := gsoBatch(t, netip.MustParseAddr("::ffff:192.0.2.1"), netip.MustParseAddr("::ffff:192.0.2.2"), 0xc125, 0, 0, 4, 512, 200)
	batches = append(batches, batch{netip.MustParseAddr("::ffff:192.0.2.1"), true, mapped})

	for _, snap := range []int{0, 128, 70, 54, 30, 10} {
		var got, per bytes.Buffer
		w, err := NewWriterSnap(&got, snap)
		if err != nil {
			t.Fatal(err)
		}
		wp, err := NewWriterSnap(&per, snap)
		if err != nil {
			t.Fatal(err)
		}
		w.now = func() time.Time { return at }
		wp.now = w.now
		want := append([]byte{}, got.Bytes()...) // the file header
		records := 0
		for _, b := range batches {
			if n := w.writeBatch(b.local, b.sent, b.pkts); n != len(b.pkts) {
				t.Fatalf("snap %d: %d of %d recorded", snap, n, len(b.pkts))
			}
			for i := range b.pkts {
				p := &b.pkts[i]
				src, dst := b.local, p.Addr
				if !b.sent {
					src, dst = dst, src
				}
				want = append(want, refRecord(at, w.SnapLen(), src, dst, p)...)
				if err := wp.WritePacket(src, dst, p.SrcPort, p.TOS, p.AppendWire(nil)); err != nil {
					t.Fatal(err)
				}
				records++
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := wp.Close(); err != nil {
			t.Fatal(err)
		}
		if w.Packets() != uint64(records) || countRecords(t, got.Bytes()) != records {
			t.Errorf("snap %d: writer counted %d, file holds %d records, want %d", snap, w.Packets(), countRecords(t, got.Bytes()), records)
		}
		wantUnverified := uint64(0)
		if snap == 0 {
			wantUnverified = 1
		}
		if w.Unverified() != wantUnverified {
			t.Errorf("snap %d: %d unverified, want %d", snap, w.Unverified(), wantUnverified)
		}
		if !bytes.Equal(got.Bytes(), want) {
			i := 0
			for i < min(got.Len(), len(want)) && got.Bytes()[i] == want[i] {
				i++
			}
			t.Errorf("snap %d: the file (%d bytes) differs from the reference (%d bytes) from byte %d on", snap, got.Len(), len(want), i)
		}
		if !bytes.Equal(per.Bytes(), got.Bytes()) {
			t.Errorf("snap %d: WritePacket one at a time wrote a different file than writeBatch", snap)
		}
	}
}
