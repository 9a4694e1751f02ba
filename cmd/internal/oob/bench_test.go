package oob

import (
	"fmt"
	"testing"
)

var sinkDest PerfDest

func BenchmarkPerfDestEncode(b *testing.B) {
	var buf [PerfDestSize]byte
	b.ReportAllocs()
	for b.Loop() {
		testDest.Encode(buf[:])
	}
}

// Baseline: the same message built with fmt, as perftest does with sprintf.
func BenchmarkPerfDestSprintfBaseline(b *testing.B) {
	d := testDest
	g := d.GID
	b.ReportAllocs()
	for b.Loop() {
		_ = fmt.Sprintf("%04x:%04x:%06x:%06x:%08x:%016x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%02x:%08x:\x00",
			d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr,
			g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15], d.SRQN)
	}
}

func BenchmarkParsePerfDest(b *testing.B) {
	m := testDest.Marshal()
	b.ReportAllocs()
	for b.Loop() {
		sinkDest, _ = ParsePerfDest(m)
	}
}

// Baseline: parsing with fmt.Sscanf (the GID is left out, so this does less).
func BenchmarkParsePerfDestSscanfBaseline(b *testing.B) {
	m := string(testDest.Marshal())
	b.ReportAllocs()
	for b.Loop() {
		var d PerfDest
		_, _ = fmt.Sscanf(m, "%04x:%04x:%06x:%06x:%08x:%016x:", &d.LID, &d.OutReads, &d.QPN, &d.PSN, &d.RKey, &d.VAddr)
		sinkDest = d
	}
}
