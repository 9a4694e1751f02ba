package reth

import (
	"bytes"
	"testing"
)

// From golden/rc_write_imm_64.pcap frame 8: RETH[va=0x55c5fcf133a0 rkey=0x00000cea len=64].
var golden = []byte{0, 0, 0x55, 0xc5, 0xfc, 0xf1, 0x33, 0xa0, 0, 0, 0x0c, 0xea, 0, 0, 0, 0x40}

func TestGolden(t *testing.T) {
	want := Fields{VA: 0x55c5fcf133a0, RKey: 0xcea, DMALength: 64}
	if got := RETH(golden).Fields(); got != want {
		t.Fatalf("Fields = %+v, want %+v", got, want)
	}
	out := make(RETH, Size)
	out.Encode(&want)
	if !bytes.Equal(out, golden) {
		t.Fatalf("Encode = % x, want % x", []byte(out), golden)
	}
}

func TestSetters(t *testing.T) {
	tests := []struct {
		name string
		set  func(RETH)
		get  func(RETH) uint64
		val  uint64
		want []byte
	}{
		{"VA", func(r RETH) { r.SetVA(0x0102030405060708) }, func(r RETH) uint64 { return r.VA() }, 0x0102030405060708,
			[]byte{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"RKey", func(r RETH) { r.SetRKey(0xdeadbeef) }, func(r RETH) uint64 { return uint64(r.RKey()) }, 0xdeadbeef,
			[]byte{0, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0}},
		{"DMALength", func(r RETH) { r.SetDMALength(0x80000000) }, func(r RETH) uint64 { return uint64(r.DMALength()) }, 0x80000000,
			[]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := make(RETH, Size)
			tt.set(r)
			if !bytes.Equal(r, tt.want) {
				t.Errorf("bytes = % x, want % x", []byte(r), tt.want)
			}
			if got := tt.get(r); got != tt.val {
				t.Errorf("get = %#x, want %#x", got, tt.val)
			}
		})
	}
}

func TestAllocs(t *testing.T) {
	r := make(RETH, Size)
	f := Fields{VA: 1, RKey: 2, DMALength: 3}
	if n := testing.AllocsPerRun(100, func() { r.Encode(&f); _ = r.Fields() }); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

func FuzzRETH(f *testing.F) {
	f.Add(golden)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < Size {
			return
		}
		fl := RETH(data).Fields()
		out := make(RETH, Size)
		out.Encode(&fl)
		if !bytes.Equal(out, data[:Size]) {
			t.Fatalf("Encode(Fields(x)) = % x, want % x", []byte(out), data[:Size])
		}
	})
}
