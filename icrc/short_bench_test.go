package icrc

import "testing"

// benchPrefixCompute measures Prefix.Compute of one IPv4 flow over a UDP
// payload of n bytes (BTH .. ICRC). It uses only the exported API, so the
// same file builds against older versions of the package for A/B runs.
func benchPrefixCompute(b *testing.B, n int) {
	p := NewIPv4Prefix(&IPv4Pseudo{Src: [4]byte{192, 0, 2, 1}, Dst: [4]byte{192, 0, 2, 2}, FlagsFrag: 0x4000, SrcPort: 49152, DstPort: 4791})
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	b.SetBytes(int64(n))
	var s uint32
	for b.Loop() {
		s += p.Compute(0, buf)
	}
	sink = s // bench_test.go
}

// BenchmarkPrefixComputeACK: an RC ACKNOWLEDGE (BTH, AETH, ICRC: 20 bytes).
func BenchmarkPrefixComputeACK(b *testing.B) { benchPrefixCompute(b, 20) }

// BenchmarkPrefixComputeSend8: an RC SEND ONLY of 8 bytes (24 bytes).
func BenchmarkPrefixComputeSend8(b *testing.B) { benchPrefixCompute(b, 24) }

// BenchmarkPrefixComputeSend32: an RC SEND ONLY of 32 bytes (48 bytes, not
// a short payload: the general path).
func BenchmarkPrefixComputeSend32(b *testing.B) { benchPrefixCompute(b, 48) }
