package udp

import "testing"

func TestSourcePort(t *testing.T) {
	// Ports Linux rxe used for RC/UC QPs in testdata/golden (local QPN = remote QPN).
	golden := []struct {
		qpn  uint32
		port uint16
	}{
		{0x11, 49441}, {0x12, 49476}, {0x13, 49513}, {0x15, 49593}, {0x16, 49636}, {0x17, 49681},
		{0x18, 49728}, {0x19, 49777}, {0x1a, 49828}, {0x1b, 49881}, {0x1c, 49936}, {0x1d, 49993},
		{0x1e, 50052},
	}
	for _, g := range golden {
		if got := FlowSourcePort(g.qpn, g.qpn); got != g.port {
			t.Errorf("FlowSourcePort(%#x, %#x) = %d, want %d (rxe capture)", g.qpn, g.qpn, got, g.port)
		}
	}
	seen := map[uint16]bool{}
	for q := uint32(1); q <= 1000; q++ {
		p := SourcePort(q)
		if p < 0xc000 || p != SourcePort(q) {
			t.Fatalf("SourcePort(%d) = %#x", q, p)
		}
		seen[p] = true
	}
	if len(seen) < 900 {
		t.Errorf("SourcePort spreads 1000 QPs over only %d ports", len(seen))
	}
}
