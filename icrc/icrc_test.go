package icrc

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestIPv6Vector cross-checks one hand-built IPv6 RoCEv2 packet (an RC SEND
// ONLY with 5 bytes of payload and 3 pad bytes) against the naive reference
// and against a literal, hand-written masked byte string.
func TestIPv6Vector(t *testing.T) {
	p := &pkt{v6: true, tc: 0xb8, flow: 0xabcde, hop: 64, sport: 0xc123, dport: 4791, udpSum: 0x1234,
		bth:  [12]byte{0x04, 0x30, 0xff, 0xff, 0xc0, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56},
		body: []byte{'h', 'e', 'l', 'l', 'o', 0, 0, 0}}
	copy(p.src6[:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	copy(p.dst6[:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})
	ip := p.build()

	literal := []byte{
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // masked LRH
		0x6f, 0xff, 0xff, 0xff, 0x00, 0x20, 17, 0xff, // version 6, TC + flow label masked, payload length 32, UDP, hop limit masked
		0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, // src
		0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, // dst
		0xc1, 0x23, 0x12, 0xb7, 0x00, 0x20, 0xff, 0xff, // UDP, checksum masked
		0x04, 0x30, 0xff, 0xff, 0xff, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56, // BTH, byte 4 masked
		'h', 'e', 'l', 'l', 'o', 0, 0, 0,
	}
	want := crc32.ChecksumIEEE(literal)
	if r := refICRC(ip); r != want {
		t.Fatalf("reference %#08x, literal %#08x", r, want)
	}
	got, err := Compute(ip)
	if err != nil || got != want {
		t.Fatalf("Compute = %#08x, %v; want %#08x", got, err, want)
	}
	h, payload := pseudo6(ip)
	if c := ComputeIPv6(h, payload); c != want {
		t.Fatalf("ComputeIPv6 = %#08x, want %#08x", c, want)
	}
	if err := Put(ip); err != nil {
		t.Fatal(err)
	}
	if Load(payload) != want || binary.LittleEndian.Uint32(ip[len(ip)-4:]) != want {
		t.Fatalf("Put stored %x, want %#08x little-endian", ip[len(ip)-4:], want)
	}
	if err := Verify(ip); err != nil {
		t.Fatal(err)
	}
}

// TestIPv6Masking: traffic class, flow label, hop limit, UDP checksum and BTH
// byte 4 are masked; the version nibble, payload length, next header,
// addresses, ports, UDP length and the rest are covered.
func TestIPv6Masking(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		ip := randPkt(r, true, r.IntN(300)).build()
		if err := Put(ip); err != nil {
			t.Fatal(err)
		}
		if c := refICRC(ip); c != binary.LittleEndian.Uint32(ip[len(ip)-4:]) {
			t.Fatalf("trial %d: Put wrote %x, reference %#08x", trial, ip[len(ip)-4:], c)
		}
		h, payload := pseudo6(ip)
		if c := ComputeIPv6(h, payload); c != Load(payload) {
			t.Fatalf("trial %d: ComputeIPv6 %#08x, stored %#08x", trial, c, Load(payload))
		}
		// Masked: traffic class (bits 4..11), flow label (bits 12..31), hop limit.
		for range 8 {
			cp := append([]byte(nil), ip...)
			w := binary.BigEndian.Uint32(cp)
			w = w&0xf0000000 | r.Uint32()&0x0fffffff
			binary.BigEndian.PutUint32(cp, w)
			cp[7] = byte(r.Uint32())
			cp[46], cp[47] = byte(r.Uint32()), byte(r.Uint32())
			cp[52] = byte(r.Uint32())
			if err := Verify(cp); err != nil {
				t.Fatalf("trial %d: masked fields changed: %v", trial, err)
			}
		}
		// Covered: every bit outside the masked ones.
		for i := range len(ip) {
			bit := byte(1) << r.IntN(8)
			if maskedBits(ip, i)&bit != 0 {
				continue
			}
			ip[i] ^= bit
			if Verify(ip) == nil {
				t.Fatalf("trial %d: flipping bit %#02x of byte %d still verifies", trial, bit, i)
			}
			ip[i] ^= bit
		}
	}
}

// TestPathsAgree compares the table-driven fast path with the masked-prefix
// path and the reference over random IPv4 (with and without options) and IPv6
// packets, and checks ComputeIPv4/ComputeIPv6 against Compute.
func TestPathsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := range 2000 {
		p := randPkt(r, trial%3 == 0, r.IntN(200))
		if trial%3 == 1 {
			p.options = make([]byte, 4*r.IntN(11))
			fill(r, p.options)
		}
		if r.IntN(4) == 0 {
			p.body = make([]byte, 5000+r.IntN(5000)) // hardware path, large
			fill(r, p.body)
		}
		ip := p.build()
		l, err := parse(ip)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		want := refICRC(ip)
		if c := compute(ip, l); c != want {
			t.Fatalf("trial %d (v6=%v, %d option bytes): compute %#08x, reference %#08x", trial, p.v6, len(p.options), c, want)
		}
		if c := computeMaskedPrefix(ip, l); c != want {
			t.Fatalf("trial %d: masked-prefix %#08x, reference %#08x", trial, c, want)
		}
		switch {
		case p.v6:
			h, payload := pseudo6(ip)
			if c := ComputeIPv6(h, payload); c != want {
				t.Fatalf("trial %d: ComputeIPv6 %#08x, reference %#08x", trial, c, want)
			}
		case len(p.options) == 0:
			h, payload := pseudo4(ip)
			if c := ComputeIPv4(h, payload); c != want {
				t.Fatalf("trial %d: ComputeIPv4 %#08x, reference %#08x", trial, c, want)
			}
		}
	}
}

// TestIPv4Options: options are covered as they are; TOS/TTL/checksum stay
// masked; Put then Verify round trips.
func TestIPv4Options(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	p := randPkt(r, false, 64)
	p.options = []byte{0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00} // router alert, NOPs, EOL
	ip := p.build()
	if err := Put(ip); err != nil {
		t.Fatal(err)
	}
	if err := Verify(ip); err != nil {
		t.Fatal(err)
	}
	if c := refICRC(ip); c != binary.LittleEndian.Uint32(ip[len(ip)-4:]) {
		t.Fatalf("reference %#08x", c)
	}
	ip[1], ip[8], ip[10], ip[11] = 1, 2, 3, 4
	ip[28+6], ip[28+7], ip[28+8+4] = 5, 6, 7
	if err := Verify(ip); err != nil {
		t.Fatalf("masked fields with options: %v", err)
	}
	ip[21] ^= 1 // an option byte
	if err := Verify(ip); !errors.Is(err, ErrMismatch) {
		t.Fatalf("option byte changed: %v, want ErrMismatch", err)
	}
}

// TestPadding: bytes after the IP length (Ethernet padding) are ignored, and
// Put writes the ICRC at the end given by the length fields.
func TestPadding(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, v6 := range []bool{false, true} {
		ip := randPkt(r, v6, 0).build()
		n := len(ip)
		padded := append(ip, 0xde, 0xad)
		if err := Put(padded); err != nil {
			t.Fatal(err)
		}
		if padded[n] != 0xde || padded[n+1] != 0xad {
			t.Fatalf("v6=%v: Put wrote into the padding", v6)
		}
		if err := Verify(padded); err != nil {
			t.Fatal(err)
		}
		if err := Verify(padded[:n]); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMalformed(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	good4 := randPkt(r, false, 8).build()
	good6 := randPkt(r, true, 8).build()
	mod := func(b []byte, f func([]byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	tests := []struct {
		name string
		ip   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"version 5", mod(good4, func(b []byte) { b[0] = 0x55 }), ErrVersion},
		{"IPv4 short header", good4[:19], ErrTruncated},
		{"IPv4 IHL 4", mod(good4, func(b []byte) { b[0] = 0x44 }), ErrHeaderLength},
		{"IPv4 total length > buffer", good4[:len(good4)-1], ErrTruncated},
		{"IPv4 total length too small", mod(good4, func(b []byte) { binary.BigEndian.PutUint16(b[2:], 20+8+12+3) }), ErrTruncated},
		{"IPv4 IHL 15 beyond packet", mod(good4[:48], func(b []byte) { b[0] = 0x4f; binary.BigEndian.PutUint16(b[2:], 48) }), ErrTruncated},
		{"IPv4 TCP", mod(good4, func(b []byte) { b[9] = 6 }), ErrNotUDP},
		{"IPv4 MF", mod(good4, func(b []byte) { b[6] = 0x20 }), ErrFragment},
		{"IPv4 fragment offset", mod(good4, func(b []byte) { b[7] = 1 }), ErrFragment},
		{"IPv4 UDP length", mod(good4, func(b []byte) { b[25]++ }), ErrLength},
		{"IPv6 short header", good6[:39], ErrTruncated},
		{"IPv6 hop-by-hop ext header", mod(good6, func(b []byte) { b[6] = 0 }), ErrNotUDP},
		{"IPv6 fragment ext header", mod(good6, func(b []byte) { b[6] = 44 }), ErrNotUDP},
		{"IPv6 payload length > buffer", good6[:len(good6)-1], ErrTruncated},
		{"IPv6 jumbogram", mod(good6, func(b []byte) { b[4], b[5] = 0, 0 }), ErrTruncated},
		{"IPv6 UDP length", mod(good6, func(b []byte) { b[45]-- }), ErrLength},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Compute(tc.ip); !errors.Is(err, tc.want) {
				t.Errorf("Compute: %v, want %v", err, tc.want)
			}
			if err := Verify(tc.ip); !errors.Is(err, tc.want) {
				t.Errorf("Verify: %v, want %v", err, tc.want)
			}
			cp := append([]byte(nil), tc.ip...)
			if err := Put(cp); !errors.Is(err, tc.want) {
				t.Errorf("Put: %v, want %v", err, tc.want)
			}
			if string(cp) != string(tc.ip) {
				t.Errorf("Put modified a malformed packet")
			}
		})
	}
	// A valid packet with a wrong ICRC.
	ip := mod(good4, func(b []byte) {})
	if err := Put(ip); err != nil {
		t.Fatal(err)
	}
	ip[len(ip)-1] ^= 0x80
	if err := Verify(ip); err != ErrMismatch {
		t.Fatalf("Verify: %v, want ErrMismatch", err)
	}
}

func TestLoadStore(t *testing.T) {
	b := []byte{1, 2, 3, 4, 5, 6}
	if got := Load(b); got != 0x06050403 {
		t.Fatalf("Load = %#08x", got)
	}
	Store(b, 0xa1b2c3d4)
	if string(b) != "\x01\x02\xd4\xc3\xb2\xa1" {
		t.Fatalf("Store wrote % x", b)
	}
	if Load(b[:3]) != 0 {
		t.Fatal("Load of a short slice is not 0")
	}
}

// TestShortPseudoPayload: the pseudo-header functions never panic on short
// payloads.
func TestShortPseudoPayload(t *testing.T) {
	var h4 IPv4Pseudo
	var h6 IPv6Pseudo
	for n := range 20 {
		b := make([]byte, n)
		ComputeIPv4(&h4, b)
		ComputeIPv6(&h6, b)
		if _, ok := SolveIPv4ID(&h4, b); ok && n < 16 {
			t.Fatalf("SolveIPv4ID accepted a %d-byte payload", n)
		}
	}
}

// TestNoAllocs: the success paths do not allocate.
func TestNoAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	ip4 := randPkt(r, false, 1024).build()
	ip6 := randPkt(r, true, 1024).build()
	p := randPkt(r, false, 64)
	p.options = make([]byte, 12)
	ipo := p.build()
	for _, ip := range [][]byte{ip4, ip6, ipo} {
		if err := Put(ip); err != nil {
			t.Fatal(err)
		}
	}
	h4, pl4 := pseudo4(ip4)
	h6, pl6 := pseudo6(ip6)
	fns := map[string]func(){
		"Verify v4":       func() { _ = Verify(ip4) },
		"Verify v6":       func() { _ = Verify(ip6) },
		"Verify options":  func() { _ = Verify(ipo) },
		"Put v4":          func() { _ = Put(ip4) },
		"Compute v6":      func() { _, _ = Compute(ip6) },
		"ComputeIPv4":     func() { ComputeIPv4(h4, pl4) },
		"ComputeIPv6":     func() { ComputeIPv6(h6, pl6) },
		"SolveIPv4ID":     func() { SolveIPv4ID(h4, pl4) },
		"Verify mismatch": func() { ip4[40] ^= 1; _ = Verify(ip4); ip4[40] ^= 1 },
	}
	for name, f := range fns {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s: %v allocs per run", name, a)
		}
	}
}
