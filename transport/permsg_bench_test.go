//go:build linux

package transport

import "testing"

// BenchmarkProtocolOnly8B runs BenchmarkProtocol8B's stack side alone
// (no raw UDP rounds in between), so that a CPU profile or a count of
// lock calls per op covers the transport's per-message path only: one op
// is one 8-byte SEND round trip between two devices in one goroutine.
func BenchmarkProtocolOnly8B(b *testing.B) {
	b.ReportAllocs()
	p := newProtoPingPong(b)
	if err := p.round(100); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	if err := p.round(b.N); err != nil {
		b.Fatal(err)
	}
}
