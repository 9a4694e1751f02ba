package bench

import (
	"slices"
	"testing"
)

// TestReadResponseChunks checks the READ baseline's response datagrams:
// an only response carries BTH + AETH + ICRC (20 bytes), a first and a
// last one 20, a middle one 16 (no AETH).
func TestReadResponseChunks(t *testing.T) {
	for _, c := range []struct {
		size, mtu int
		want      []int
	}{
		{64, 4096, []int{84}},
		{4096, 4096, []int{4116}},
		{4097, 4096, []int{4116, 21}},
		{3 * 1024, 1024, []int{1044, 1040, 1044}},
		{65536, 4096, append(append([]int{4116}, slices.Repeat([]int{4112}, 14)...), 4116)},
	} {
		if got := readResponseChunks(c.size, c.mtu); !slices.Equal(got, c.want) {
			t.Errorf("readResponseChunks(%d, %d) = %v, want %v", c.size, c.mtu, got, c.want)
		}
	}
}

// TestGSOGroups checks how a stream of datagram sizes is cut into GSO
// datagrams: runs of one size, a shorter datagram ends its run, a longer
// one starts a new run, and the segment and byte limits hold.
func TestGSOGroups(t *testing.T) {
	type g struct{ total, seg, n int }
	for _, c := range []struct {
		name   string
		stream []int
		want   []g
	}{
		{"one", []int{84}, []g{{84, 84, 1}}},
		{"equal", []int{32, 32, 32}, []g{{96, 32, 3}}},
		{"short ends a run", []int{100, 100, 50, 100}, []g{{250, 100, 3}, {100, 100, 1}}},
		{"longer starts a run", []int{4112, 4116, 4116}, []g{{4112, 4112, 1}, {8232, 4116, 2}}},
		{"segment limit", slices.Repeat([]int{32}, gsoSegs+1), []g{{32 * gsoSegs, 32, gsoSegs}, {32, 32, 1}}},
		{"byte limit", slices.Repeat([]int{4116}, 16), []g{{15 * 4116, 4116, 15}, {4116, 4116, 1}}},
	} {
		total, seg, n := gsoGroups(c.stream)
		var got []g
		for i := range total {
			got = append(got, g{total[i], seg[i], n[i]})
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: gsoGroups(%v) = %v, want %v", c.name, c.stream, got, c.want)
		}
	}
}
