package icrc

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sort"
	"testing"
)

// wantGolden is the number of RoCEv2 packets per capture, from
// testdata/golden/INDEX.md (at the repository root).
var wantGolden = map[string]int{
	"host_ud_interop":   10,
	"nvmeof_rdma_linux": 492,
	"rc_atomic_cswap":   10,
	"rc_atomic_fadd":    10,
	"rc_read_4096":      25,
	"rc_read_64":        10,
	"rc_send_4096":      50,
	"rc_send_64":        20,
	"rc_send_bw_64":     10,
	"rc_send_imm_62":    10,
	"rc_write_4096":     25,
	"rc_write_64":       10,
	"rc_write_imm_3000": 20,
	"rc_write_imm_64":   10,
	"rdmacm_rping":      41,
	"uc_send_4096":      40,
	"ud_send_512":       10,
}

func TestGoldenCounts(t *testing.T) {
	g := readGolden(t)
	for name, want := range wantGolden {
		if got := len(g[name]); got != want {
			t.Errorf("%s: %d RoCEv2 packets, INDEX.md says %d", name, got, want)
		}
	}
	for name := range g {
		if _, ok := wantGolden[name]; !ok {
			t.Errorf("%s.pcap is not in the expected list; update wantGolden from INDEX.md", name)
		}
	}
}

// TestGoldenVerify checks every golden RoCEv2 packet: Verify accepts it, the
// fast path, the masked-prefix path and the naive reference agree with the
// stored ICRC, ComputeIPv4 from the UDP payload gives the same value, and
// SolveIPv4ID recovers the real identification.
func TestGoldenVerify(t *testing.T) {
	total := 0
	for name, ps := range readGolden(t) {
		for _, p := range ps {
			total++
			ip := p.ip
			end := ipEnd(ip)
			stored := binary.LittleEndian.Uint32(ip[end-4:])
			if err := Verify(ip); err != nil {
				t.Errorf("%s frame %d: Verify: %v", name, p.frame, err)
				continue
			}
			got, err := Compute(ip)
			if err != nil || got != stored {
				t.Errorf("%s frame %d: Compute = %#08x, %v; stored %#08x", name, p.frame, got, err, stored)
			}
			l, _ := parse(ip)
			if c := computeMaskedPrefix(ip, l); c != stored {
				t.Errorf("%s frame %d: masked-prefix path %#08x, stored %#08x", name, p.frame, c, stored)
			}
			if c := refICRC(ip[:end]); c != stored {
				t.Errorf("%s frame %d: reference %#08x, stored %#08x", name, p.frame, c, stored)
			}
			if ip[0]>>4 != 4 {
				t.Errorf("%s frame %d: expected IPv4 goldens", name, p.frame)
				continue
			}
			h, payload := pseudo4(ip)
			if c := ComputeIPv4(h, payload); c != stored {
				t.Errorf("%s frame %d: ComputeIPv4 %#08x, stored %#08x", name, p.frame, c, stored)
			}
			if Load(payload) != stored {
				t.Errorf("%s frame %d: Load %#08x, stored %#08x", name, p.frame, Load(payload), stored)
			}
			wantID := h.ID
			h.ID = 0x1234 // ignored
			if id, ok := SolveIPv4ID(h, payload); !ok || id != wantID {
				t.Errorf("%s frame %d: SolveIPv4ID = %#04x, %v; want %#04x", name, p.frame, id, ok, wantID)
			}
			// Put over a copy with a zeroed ICRC restores it.
			cp := append([]byte(nil), ip...)
			binary.LittleEndian.PutUint32(cp[end-4:], 0)
			if err := Put(cp); err != nil || binary.LittleEndian.Uint32(cp[end-4:]) != stored {
				t.Errorf("%s frame %d: Put: %v, wrote %#08x, want %#08x", name, p.frame, err, binary.LittleEndian.Uint32(cp[end-4:]), stored)
			}
		}
	}
	t.Logf("verified %d golden RoCEv2 packets", total)
}

// TestGoldenMaskedFields changes every masked field of every golden packet to
// random values (and every single value for the first packet of each capture);
// the ICRC stays valid.
func TestGoldenMaskedFields(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	g := readGolden(t)
	for _, name := range sortedNames(g) {
		ps := g[name]
		for k, p := range ps {
			ip := append([]byte(nil), p.ip...)
			hl := int(ip[0]&0xf) * 4
			fields := []struct {
				name string
				off  int
			}{{"TOS/ECN", 1}, {"TTL", 8}, {"IPv4 checksum hi", 10}, {"IPv4 checksum lo", 11},
				{"UDP checksum hi", hl + 6}, {"UDP checksum lo", hl + 7}, {"BTH byte 4 (FECN/BECN)", hl + 8 + 4}}
			for _, f := range fields {
				orig := ip[f.off]
				vals := []byte{byte(r.Uint32()), ^orig, 0, 0xff, 0x03, 0xc0}
				if k == 0 {
					vals = vals[:0]
					for v := range 256 {
						vals = append(vals, byte(v))
					}
				}
				for _, v := range vals {
					ip[f.off] = v
					if err := Verify(ip); err != nil {
						t.Fatalf("%s frame %d: %s = %#02x: Verify: %v", name, p.frame, f.name, v, err)
					}
				}
				ip[f.off] = orig
			}
		}
	}
}

// TestGoldenBitFlips flips single bits of covered bytes: every bit of every
// covered byte of the first packet of each capture, and 64 random bits of every
// other packet. Verify must fail each time (CRC-32 detects every single-bit
// error); flips in bytes past the IP and UDP length/protocol fields must be
// reported as ErrMismatch. Flips of the ICRC itself must fail too.
func TestGoldenBitFlips(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	flips := 0
	g := readGolden(t)
	for _, name := range sortedNames(g) {
		ps := g[name]
		for k, p := range ps {
			ip := append([]byte(nil), p.ip...)
			end := ipEnd(ip)
			hl := int(ip[0]&0xf) * 4
			try := func(i int, bit byte) {
				if maskedBits(ip, i)&bit != 0 {
					return
				}
				flips++
				ip[i] ^= bit
				err := Verify(ip)
				ip[i] ^= bit
				if err == nil {
					t.Fatalf("%s frame %d: flipping bit %#02x of byte %d still verifies", name, p.frame, bit, i)
				}
				// Bytes the parser does not interpret: ID, addresses, ports,
				// BTH and beyond, and the ICRC.
				structural := i == 0 || (i >= 2 && i < 4) || (i >= 6 && i < 8) || i == 9 || i == hl+4 || i == hl+5
				if !structural && !errors.Is(err, ErrMismatch) {
					t.Fatalf("%s frame %d: flipping bit %#02x of byte %d: %v, want ErrMismatch", name, p.frame, bit, i, err)
				}
			}
			if k == 0 {
				for i := range end {
					for b := range 8 {
						try(i, 1<<b)
					}
				}
			} else {
				for range 64 {
					try(r.IntN(end), 1<<r.IntN(8))
				}
			}
		}
	}
	t.Logf("%d single-bit flips rejected", flips)
}

// sortedNames returns the capture names in order, so that seeded random
// sampling is reproducible.
func sortedNames(g map[string][]goldenPacket) []string {
	names := make([]string, 0, len(g))
	for n := range g {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
