package icrc

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// refPayloadICRC is a naive reference for Prefix.Compute and the per-call
// functions over any UDP payload length: it builds the masked byte string
// (8 x 0xff, the masked IPv4 or IPv6 header with the lengths implied by
// len(udpPayload), the masked UDP header, the payload up to its last 4
// bytes with BTH byte 4 masked if it is covered) and calls
// crc32.ChecksumIEEE. It shares no code with the package.
func refPayloadICRC(h4 *IPv4Pseudo, h6 *IPv6Pseudo, id uint16, udpPayload []byte) uint32 {
	s := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	ul := 8 + len(udpPayload)
	if h6 != nil {
		var ip [40]byte
		ip[0], ip[1], ip[2], ip[3] = 0x6f, 0xff, 0xff, 0xff
		binary.BigEndian.PutUint16(ip[4:], uint16(ul))
		ip[6], ip[7] = 17, 0xff
		copy(ip[8:], h6.Src[:])
		copy(ip[24:], h6.Dst[:])
		s = append(s, ip[:]...)
		s = binary.BigEndian.AppendUint16(s, h6.SrcPort)
		s = binary.BigEndian.AppendUint16(s, h6.DstPort)
	} else {
		var ip [20]byte
		ip[0], ip[1] = 0x45, 0xff
		binary.BigEndian.PutUint16(ip[2:], uint16(20+ul))
		binary.BigEndian.PutUint16(ip[4:], id)
		binary.BigEndian.PutUint16(ip[6:], h4.FlagsFrag)
		ip[8], ip[9], ip[10], ip[11] = 0xff, 17, 0xff, 0xff
		copy(ip[12:], h4.Src[:])
		copy(ip[16:], h4.Dst[:])
		s = append(s, ip[:]...)
		s = binary.BigEndian.AppendUint16(s, h4.SrcPort)
		s = binary.BigEndian.AppendUint16(s, h4.DstPort)
	}
	s = binary.BigEndian.AppendUint16(s, uint16(ul))
	s = append(s, 0xff, 0xff)
	if cov := len(udpPayload) - 4; cov > 0 {
		k := len(s)
		s = append(s, udpPayload[:cov]...)
		if cov > 4 {
			s[k+4] = 0xff
		}
	}
	return crc32.ChecksumIEEE(s)
}

// TestShortPayloadMatchesReference checks Prefix.Compute, whose short
// payloads (16..31 covered bytes) take clmulShort or softShortPayload and whose header
// lengths come from lenTable below lenTableSize, against the naive
// reference for every UDP payload length 0..256, around lenTableSize and
// the 16-bit limit, with random flows, identifications and bytes.
func TestShortPayloadMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	buf := make([]byte, 1<<16)
	lengths := []int{lenTableSize - 1, lenTableSize, lenTableSize + 1, 1<<16 - 8 - 21, 1<<16 - 8 - 20}
	for n := range 257 {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		for range 8 {
			p := buf[:n]
			fill(r, p)
			h4 := &IPv4Pseudo{FlagsFrag: uint16(r.Uint32()), SrcPort: uint16(r.Uint32()), DstPort: uint16(r.Uint32())}
			fill(r, h4.Src[:])
			fill(r, h4.Dst[:])
			h6 := &IPv6Pseudo{SrcPort: uint16(r.Uint32()), DstPort: uint16(r.Uint32())}
			fill(r, h6.Src[:])
			fill(r, h6.Dst[:])
			id := uint16(r.Uint32())
			if r.IntN(4) == 0 {
				id = 0
			}
			p4, p6 := NewIPv4Prefix(h4), NewIPv6Prefix(h6)
			if got, want := p4.Compute(id, p), refPayloadICRC(h4, nil, id, p); got != want {
				t.Fatalf("IPv4 payload %d id %#x: Compute %#x, reference %#x", n, id, got, want)
			}
			if got, want := p6.Compute(id, p), refPayloadICRC(nil, h6, 0, p); got != want {
				t.Fatalf("IPv6 payload %d: Compute %#x, reference %#x", n, got, want)
			}
			if n < bthSize+Size {
				continue
			}
			Store(p, refPayloadICRC(h4, nil, id, p))
			if got, ok := p4.SolveIPv4IDFrom(id^uint16(r.IntN(2)), p); !ok || got != id {
				t.Fatalf("IPv4 payload %d: SolveIPv4IDFrom %#x/%v, want %#x", n, got, ok, id)
			}
		}
	}
}

// TestShortPayloadStates checks clmulShort (where it runs) and
// softShortPayload against finishPayload's general path
// (softUpdate, no masking shortcut) for every covered length they take
// and random start registers.
func TestShortPayloadStates(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	var b [36]byte
	for cov := 16; cov < 32; cov++ {
		for range 2000 {
			fill(r, b[:])
			c := r.Uint32()
			want := softUpdate(c^masks[mPayloadBTH4][b[bthMaskOff]], b[:cov])
			if hasSmall {
				if got := ^clmulShort(^c, b[:cov]); got != want {
					t.Fatalf("cov %d start %#x: clmulShort %#x, want %#x", cov, c, got, want)
				}
			}
			if got := softShortPayload(c, b[:cov]); got != want {
				t.Fatalf("cov %d start %#x: softShortPayload %#x, want %#x", cov, c, got, want)
			}
		}
	}
}

// FuzzPrefixCompute compares Prefix.Compute with the naive reference for
// fuzzed payloads, flows and identifications.
func FuzzPrefixCompute(f *testing.F) {
	f.Add([]byte("0123456789abcdef01234567"), uint16(0), uint32(0x0a000001), false)
	f.Add(make([]byte, 20), uint16(7), uint32(0xc0000201), true)
	f.Fuzz(func(t *testing.T, p []byte, id uint16, addr uint32, v6 bool) {
		if len(p) > 1<<16-8-20 {
			return
		}
		h4 := &IPv4Pseudo{FlagsFrag: 0x4000, SrcPort: uint16(addr), DstPort: 4791}
		binary.BigEndian.PutUint32(h4.Src[:], addr)
		binary.BigEndian.PutUint32(h4.Dst[:], ^addr)
		h6 := &IPv6Pseudo{SrcPort: uint16(addr >> 16), DstPort: 4791}
		binary.BigEndian.PutUint32(h6.Src[12:], addr)
		binary.BigEndian.PutUint32(h6.Dst[:], addr*3)
		if v6 {
			pf := NewIPv6Prefix(h6)
			if got, want := pf.Compute(id, p), refPayloadICRC(nil, h6, 0, p); got != want {
				t.Fatalf("IPv6 payload %d: Compute %#x, reference %#x", len(p), got, want)
			}
			return
		}
		pf := NewIPv4Prefix(h4)
		if got, want := pf.Compute(id, p), refPayloadICRC(h4, nil, id, p); got != want {
			t.Fatalf("IPv4 payload %d id %#x: Compute %#x, reference %#x", len(p), id, got, want)
		}
	})
}
