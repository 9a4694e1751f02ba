package bth

import "testing"

func TestPSNAdd(t *testing.T) {
	tests := []struct {
		p    PSN
		n    int
		want PSN
	}{
		{0, 1, 1},
		{0xfffffe, 1, 0xffffff},
		{0xffffff, 1, 0},
		{0xffffff, 2, 1},
		{0, -1, 0xffffff},
		{5, -10, 0xfffffb},
		{0x800000, 0x800000, 0},
		{0x123456, 1 << 24, 0x123456},
		{0x123456, 0, 0x123456},
	}
	for _, tt := range tests {
		if got := tt.p.Add(tt.n); got != tt.want {
			t.Errorf("%v.Add(%d) = %v, want %v", tt.p, tt.n, got, tt.want)
		}
	}
}

func TestPSNDiffBefore(t *testing.T) {
	tests := []struct {
		p, q   PSN
		diff   int32
		before bool
	}{
		{0, 0, 0, false},
		{1, 0, 1, false},
		{0, 1, -1, true},
		{0, 0xffffff, 1, false}, // wraparound: 0 is one ahead of 0xffffff
		{0xffffff, 0, -1, true},
		{0x000005, 0xfffffb, 10, false},
		{0xfffffb, 0x000005, -10, true},
		{0x7fffff, 0, 0x7fffff, false}, // largest "ahead"
		{0x800000, 0, -0x800000, true}, // half-space boundary counts as behind
		{0, 0x800000, -0x800000, true}, // and symmetrically
		{0x94b760, 0x94b75f, 1, false},
	}
	for _, tt := range tests {
		if got := tt.p.Diff(tt.q); got != tt.diff {
			t.Errorf("%v.Diff(%v) = %d, want %d", tt.p, tt.q, got, tt.diff)
		}
		if got := tt.p.Before(tt.q); got != tt.before {
			t.Errorf("%v.Before(%v) = %v, want %v", tt.p, tt.q, got, tt.before)
		}
		if got := tt.p.After(tt.q); got != (tt.diff > 0) {
			t.Errorf("%v.After(%v) = %v, want %v", tt.p, tt.q, got, tt.diff > 0)
		}
	}
}

func TestPSNAddDiffInverse(t *testing.T) {
	for _, p := range []PSN{0, 1, 0x7fffff, 0x800000, 0xfffff0, 0xffffff} {
		for _, n := range []int{0, 1, -1, 100, -100, 0x7fffff, -0x800000} {
			if got := p.Add(n).Diff(p); got != int32(n) {
				t.Errorf("%v.Add(%d).Diff(%v) = %d", p, n, p, got)
			}
		}
	}
}

func TestPSNString(t *testing.T) {
	for p, want := range map[PSN]string{0: "0x000000", 0x94b760: "0x94b760", 0xffffff: "0xffffff", 0x1000001: "0x000001"} {
		if got := p.String(); got != want {
			t.Errorf("PSN(%#x).String() = %q, want %q", uint32(p), got, want)
		}
	}
}
