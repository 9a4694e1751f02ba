package icrc

import (
	"encoding/binary"
	"testing"

	"github.com/gorocev2/rocev2/test/goldendir"
)

// FuzzVerify feeds arbitrary bytes to every entry point. Nothing may panic;
// whatever Compute accepts, Put then Verify must accept and both compute paths
// must agree. The bytes are also used as a UDP payload (BTH ..) of well-formed
// IPv4 and IPv6 packets, which must round-trip through Put and Verify, agree
// with ComputeIPv4/ComputeIPv6 and let SolveIPv4ID recover the ID. Seeds
// include the golden packets when they are available.
func FuzzVerify(f *testing.F) {
	if _, err := goldendir.Dir(); err == nil {
		for _, ps := range readGolden(f) {
			for i, p := range ps {
				if i < 3 {
					f.Add(p.ip)
				}
			}
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0x45})
	f.Add([]byte{0x60, 0, 0, 0, 0, 24, 17, 64})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = Verify(data)
		c, err := Compute(data)
		l, perr := parse(data)
		if (err == nil) != (perr == nil) {
			t.Fatalf("Compute: %v, parse: %v", err, perr)
		}
		end, quick := quickIPv4(data)
		if quick != (perr == nil && !l.v6 && l.hl == ipv4MinSize) || (quick && end != l.end) {
			t.Fatalf("quickIPv4 = %d, %v; parse = %+v, %v", end, quick, l, perr)
		}
		if err == nil {
			if m := computeMaskedPrefix(data, l); m != c {
				t.Fatalf("fast path %#08x, masked-prefix path %#08x", c, m)
			}
			cp := append([]byte(nil), data...)
			if err := Put(cp); err != nil {
				t.Fatalf("Compute accepted, Put: %v", err)
			}
			if err := Verify(cp); err != nil {
				t.Fatalf("Put then Verify: %v", err)
			}
		}
		_ = Load(data)

		var h4 IPv4Pseudo
		var h6 IPv6Pseudo
		if len(data) >= 40 {
			copy(h4.Src[:], data[0:4])
			copy(h4.Dst[:], data[4:8])
			h4.ID = binary.BigEndian.Uint16(data[8:])
			h4.SrcPort = binary.BigEndian.Uint16(data[10:])
			h6.SrcPort = h4.SrcPort
			copy(h6.Src[:], data[8:24])
			copy(h6.Dst[:], data[24:40])
		}
		h4.FlagsFrag = 0x4000
		h4.DstPort, h6.DstPort = 4791, 4791
		_ = ComputeIPv4(&h4, data)
		_ = ComputeIPv6(&h6, data)
		_, _ = SolveIPv4ID(&h4, data)

		// data as the UDP payload of well-formed packets.
		if len(data) < bthSize+Size || len(data) > 65535-ipv6Size-udpSize {
			return
		}
		p := &pkt{src4: h4.Src, dst4: h4.Dst, id: h4.ID, flags: 0x4000, sport: h4.SrcPort, dport: 4791,
			ttl: 64, src6: h6.Src, dst6: h6.Dst, hop: 64, body: data[bthSize : len(data)-Size]}
		copy(p.bth[:], data)
		for _, v6 := range []bool{false, true} {
			p.v6 = v6
			ip := p.build()
			if err := Put(ip); err != nil {
				t.Fatalf("v6=%v: Put on a well-formed packet: %v", v6, err)
			}
			if err := Verify(ip); err != nil {
				t.Fatalf("v6=%v: Put then Verify: %v", v6, err)
			}
			stored := binary.LittleEndian.Uint32(ip[len(ip)-Size:])
			if v6 {
				if c := ComputeIPv6(&h6, ip[ipv6Size+udpSize:]); c != stored {
					t.Fatalf("ComputeIPv6 %#08x, Put %#08x", c, stored)
				}
				continue
			}
			payload := ip[ipv4MinSize+udpSize:]
			if c := ComputeIPv4(&h4, payload); c != stored {
				t.Fatalf("ComputeIPv4 %#08x, Put %#08x", c, stored)
			}
			if id, ok := SolveIPv4ID(&h4, payload); !ok || id != h4.ID {
				t.Fatalf("SolveIPv4ID = %#04x, %v; want %#04x", id, ok, h4.ID)
			}
		}
	})
}
