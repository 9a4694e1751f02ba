package packet_test

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
)

// ipv4Frame returns an IPv4 packet (20-byte header, UDP to 4791, DF, ID 0)
// carrying an RC_RDMA_WRITE_ONLY with n bytes of payload and a valid ICRC.
func ipv4Frame(tb testing.TB, n int) []byte {
	tb.Helper()
	f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly, PKey: bth.DefaultPKey, DestQP: 0x15, PSN: 0xc8a712, AckReq: true}, Payload: make([]byte, n)}
	f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = 0x55d90dddb000, 0x654, uint32(n)
	for i := range f.Payload {
		f.Payload[i] = byte(i * 7)
	}
	l := packet.Len(f.BTH.Opcode, n)
	ip := make([]byte, 28+l)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	copy(ip[12:], []byte{192, 0, 2, 3, 192, 0, 2, 2})
	binary.BigEndian.PutUint16(ip[20:], 0xc1b9)
	binary.BigEndian.PutUint16(ip[22:], 4791)
	binary.BigEndian.PutUint16(ip[24:], uint16(8+l))
	if _, err := packet.Build(ip[28:], &f); err != nil {
		tb.Fatal(err)
	}
	if err := icrc.Put(ip); err != nil {
		tb.Fatal(err)
	}
	return ip
}

// BenchmarkParseVerify measures what a receiver does per packet — verify the
// ICRC over the whole IP packet and parse the RoCEv2 headers — and, in the
// same run, plain crc32.ChecksumIEEE over the same bytes. The metric
// "x_crc32" is our throughput as a fraction of crc32's (target >= 0.9 at 4 KiB).
func BenchmarkParseVerify(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"64B", 64}, {"1KiB", 1024}, {"4KiB", 4096}} {
		b.Run(size.name, func(b *testing.B) {
			ip := ipv4Frame(b, size.n)
			var p packet.Packet
			b.SetBytes(int64(len(ip)))
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				if err := icrc.Verify(ip); err != nil {
					b.Fatal(err)
				}
				if err := p.Parse(ip[28:]); err != nil {
					b.Fatal(err)
				}
			}
			ours := time.Since(start)
			b.StopTimer()
			var sink uint32
			start = time.Now()
			for range b.N {
				sink += crc32.ChecksumIEEE(ip)
			}
			base := time.Since(start)
			_ = sink
			if ours > 0 {
				b.ReportMetric(float64(base)/float64(ours), "x_crc32")
			}
		})
	}
}

// TestParseVerifyAllocs: the receive path allocates nothing.
func TestParseVerifyAllocs(t *testing.T) {
	ip := ipv4Frame(t, 4096)
	var p packet.Packet
	if a := testing.AllocsPerRun(100, func() {
		if err := icrc.Verify(ip); err != nil {
			t.Fatal(err)
		}
		if err := p.Parse(ip[28:]); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("parse+verify: %v allocs per packet, want 0", a)
	}
}
