package bth

import "testing"

func TestMTU(t *testing.T) {
	tests := []struct {
		m     MTU
		bytes int
		str   string
	}{
		{MTU256, 256, "256"}, {MTU512, 512, "512"}, {MTU1024, 1024, "1024"},
		{MTU2048, 2048, "2048"}, {MTU4096, 4096, "4096"},
		{0, 0, "MTU(0)"}, {6, 0, "MTU(6)"}, {15, 0, "MTU(15)"}, {255, 0, "MTU(255)"},
	}
	for _, tt := range tests {
		if got := tt.m.Bytes(); got != tt.bytes {
			t.Errorf("MTU(%d).Bytes() = %d, want %d", uint8(tt.m), got, tt.bytes)
		}
		if got := tt.m.Valid(); got != (tt.bytes != 0) {
			t.Errorf("MTU(%d).Valid() = %v", uint8(tt.m), got)
		}
		if got := tt.m.String(); got != tt.str {
			t.Errorf("MTU(%d).String() = %q, want %q", uint8(tt.m), got, tt.str)
		}
		got, ok := MTUFromBytes(tt.bytes)
		if tt.bytes != 0 && (!ok || got != tt.m) {
			t.Errorf("MTUFromBytes(%d) = %v, %v; want %v", tt.bytes, got, ok, tt.m)
		}
	}
	for _, n := range []int{0, 1, 128, 1500, 8192, -1024} {
		if m, ok := MTUFromBytes(n); ok {
			t.Errorf("MTUFromBytes(%d) = %v, true; want false", n, m)
		}
	}
}
