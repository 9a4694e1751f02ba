package atomiceth

import (
	"bytes"
	"testing"
)

func TestGolden(t *testing.T) {
	// golden/rc_atomic_fadd.pcap frame 20:
	// AtomicETH[va=0x55f027c98000 rkey=0x00000a46 swap_add=0x1 compare=0x0].
	golden := []byte{
		0, 0, 0x55, 0xf0, 0x27, 0xc9, 0x80, 0x00,
		0, 0, 0x0a, 0x46,
		0, 0, 0, 0, 0, 0, 0, 1,
		0, 0, 0, 0, 0, 0, 0, 0,
	}
	want := Fields{VA: 0x55f027c98000, RKey: 0xa46, SwapAdd: 1}
	if got := AtomicETH(golden).Fields(); got != want {
		t.Fatalf("Fields = %+v, want %+v", got, want)
	}
	out := make(AtomicETH, Size)
	out.Encode(&want)
	if !bytes.Equal(out, golden) {
		t.Fatalf("Encode = % x, want % x", []byte(out), golden)
	}
}

func TestSetters(t *testing.T) {
	type acc struct {
		set func(AtomicETH, uint64)
		get func(AtomicETH) uint64
		off int
		n   int
	}
	tests := map[string]acc{
		"VA":      {func(a AtomicETH, v uint64) { a.SetVA(v) }, func(a AtomicETH) uint64 { return a.VA() }, 0, 8},
		"RKey":    {func(a AtomicETH, v uint64) { a.SetRKey(uint32(v)) }, func(a AtomicETH) uint64 { return uint64(a.RKey()) }, 8, 4},
		"SwapAdd": {func(a AtomicETH, v uint64) { a.SetSwapAdd(v) }, func(a AtomicETH) uint64 { return a.SwapAdd() }, 12, 8},
		"Compare": {func(a AtomicETH, v uint64) { a.SetCompare(v) }, func(a AtomicETH) uint64 { return a.Compare() }, 20, 8},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			a := make(AtomicETH, Size)
			val := uint64(0x0102030405060708) >> (64 - 8*tt.n)
			tt.set(a, val)
			want := make([]byte, Size)
			for i := 0; i < tt.n; i++ {
				want[tt.off+i] = byte(val >> (8 * (tt.n - 1 - i)))
			}
			if !bytes.Equal(a, want) {
				t.Errorf("bytes = % x, want % x", []byte(a), want)
			}
			if got := tt.get(a); got != val {
				t.Errorf("get = %#x, want %#x", got, val)
			}
		})
	}
}

func TestAllocs(t *testing.T) {
	a := make(AtomicETH, Size)
	f := Fields{VA: 1, RKey: 2, SwapAdd: 3, Compare: 4}
	if n := testing.AllocsPerRun(100, func() { a.Encode(&f); _ = a.Fields() }); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

func FuzzAtomicETH(f *testing.F) {
	f.Add(make([]byte, Size))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < Size {
			return
		}
		fl := AtomicETH(data).Fields()
		out := make(AtomicETH, Size)
		out.Encode(&fl)
		if !bytes.Equal(out, data[:Size]) {
			t.Fatalf("Encode(Fields(x)) = % x, want % x", []byte(out), data[:Size])
		}
	})
}
