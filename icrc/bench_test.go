package icrc

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

var sink uint32

// benchPacket returns a valid IPv4 RoCEv2 packet of exactly size bytes
// (IP header .. ICRC).
func benchPacket(size int, v6 bool) []byte {
	hdr := 20 + 8 + 12 + 4
	if v6 {
		hdr = 40 + 8 + 12 + 4
	}
	r := rand.New(rand.NewPCG(uint64(size), 1))
	ip := randPkt(r, v6, size-hdr).build()
	if err := Put(ip); err != nil {
		panic(err)
	}
	return ip
}

func benchVerify(b *testing.B, ip []byte) {
	b.SetBytes(int64(len(ip)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Verify(ip); err != nil {
			b.Fatal(err)
		}
	}
}

// benchBaseline is plain crc32.ChecksumIEEE over the same bytes.
func benchBaseline(b *testing.B, ip []byte) {
	b.SetBytes(int64(len(ip)))
	b.ReportAllocs()
	for b.Loop() {
		sink = crc32.ChecksumIEEE(ip)
	}
}

// Sizes are whole IP packets (IP header .. ICRC).
func BenchmarkVerify64(b *testing.B)             { benchVerify(b, benchPacket(64, false)) }
func BenchmarkCRC32Baseline64(b *testing.B)      { benchBaseline(b, benchPacket(64, false)) }
func BenchmarkVerify1K(b *testing.B)             { benchVerify(b, benchPacket(1024, false)) }
func BenchmarkCRC32Baseline1K(b *testing.B)      { benchBaseline(b, benchPacket(1024, false)) }
func BenchmarkVerify4K(b *testing.B)             { benchVerify(b, benchPacket(4096, false)) }
func BenchmarkCRC32Baseline4K(b *testing.B)      { benchBaseline(b, benchPacket(4096, false)) }
func BenchmarkVerifyIPv6_4K(b *testing.B)        { benchVerify(b, benchPacket(4096, true)) }
func BenchmarkVerifyMTU4096(b *testing.B)        { benchVerify(b, benchPacket(4096+44, false)) }
func BenchmarkCRC32BaselineMTU4096(b *testing.B) { benchBaseline(b, benchPacket(4096+44, false)) }

// BenchmarkVerifyOptions4K uses the slower masked-prefix path (IPv4 options).
func BenchmarkVerifyOptions4K(b *testing.B) {
	r := rand.New(rand.NewPCG(4096, 2))
	p := randPkt(r, false, 4096-44-8)
	p.options = make([]byte, 8)
	ip := p.build()
	if err := Put(ip); err != nil {
		b.Fatal(err)
	}
	benchVerify(b, ip)
}

func BenchmarkPut4K(b *testing.B) {
	ip := benchPacket(4096, false)
	b.SetBytes(int64(len(ip)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Put(ip); err != nil {
			b.Fatal(err)
		}
	}
}

func benchComputeIPv4(b *testing.B, size int) {
	h, p := pseudo4(benchPacket(size, false))
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		sink = ComputeIPv4(h, p)
	}
}

func BenchmarkComputeIPv4_64(b *testing.B) { benchComputeIPv4(b, 64) }
func BenchmarkComputeIPv4_4K(b *testing.B) { benchComputeIPv4(b, 4096) }

func BenchmarkComputeIPv6_4K(b *testing.B) {
	h, p := pseudo6(benchPacket(4096, true))
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		sink = ComputeIPv6(h, p)
	}
}

func benchSolve(b *testing.B, size int) {
	h, p := pseudo4(benchPacket(size, false))
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := SolveIPv4ID(h, p); !ok {
			b.Fatal("not solved")
		}
	}
}

func BenchmarkSolveIPv4ID64(b *testing.B) { benchSolve(b, 64) }
func BenchmarkSolveIPv4ID4K(b *testing.B) { benchSolve(b, 4096) }

func BenchmarkComputeIPv4_1K(b *testing.B) { benchComputeIPv4(b, 1024) }
func BenchmarkSolveIPv4ID1K(b *testing.B)  { benchSolve(b, 1024) }

// BenchmarkMultModP is the multiplication modulo P that SolveIPv4ID does
// after its CRC.
func BenchmarkMultModP(b *testing.B) {
	x, y := uint32(0x9e3779b9), idInverse(4100)
	for b.Loop() {
		x = multModP(x, y) | 1
	}
	sink = x
}

// BenchmarkMulModP is BenchmarkMultModP for the windowed mulModP.
func BenchmarkMulModP(b *testing.B) {
	x, y := uint32(0x9e3779b9), idInverse(4100)
	for b.Loop() {
		x = mulModP(x, y) | 1
	}
	sink = x
}

// BenchmarkUpdateShort is update against hash/crc32 over the short pieces
// of a small packet (28 B of BTH+RETH, a 64-byte WRITE's 92 covered bytes,
// 200 B), where clmulSmall runs on CPUs with PCLMULQDQ. The tables the
// portable tail uses are warm here; on the data path they are often not.
func BenchmarkUpdateShort(b *testing.B) {
	buf := make([]byte, 256)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for _, n := range []int{28, 92, 200} {
		b.Run(fmt.Sprintf("update/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			var c uint32
			for range b.N {
				c = update(c, buf[:n])
			}
			sink = c
		})
		b.Run(fmt.Sprintf("crc32/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			var c uint32
			for range b.N {
				c = crc32.Update(c, crc32.IEEETable, buf[:n])
			}
			sink = c
		})
	}
}
