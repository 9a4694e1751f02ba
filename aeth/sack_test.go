package aeth

import (
	"bytes"
	"testing"
)

func TestSACK(t *testing.T) {
	var b [SACKMaxSize]byte
	n := EncodeSACK(b[:], []uint32{0x80000001, 0, 0x00010000})
	s := SACK(b[:n])
	if n != 16 || !IsSACK(s) || s.Words() != 3 || s.Bits() != 96 {
		t.Fatalf("n %d IsSACK %v words %d bits %d", n, IsSACK(s), s.Words(), s.Bits())
	}
	if !bytes.Equal(b[:4], []byte{'S', 'R', 1, 3}) {
		t.Fatalf("header % x", b[:4])
	}
	for _, c := range []struct {
		j    int
		want bool
	}{{0, true}, {1, false}, {31, true}, {32, false}, {79, true}, {80, false}, {95, false}, {96, false}, {-1, false}} {
		if got := s.Has(c.j); got != c.want {
			t.Errorf("Has(%d) = %v, want %v", c.j, got, c.want)
		}
	}
	if h := s.Highest(); h != 79 {
		t.Errorf("Highest = %d, want 79", h)
	}
	n = EncodeSACK(b[:], []uint32{0})
	if h := SACK(b[:n]).Highest(); h != -1 {
		t.Errorf("Highest of an empty bitmap = %d", h)
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header only", []byte{'S', 'R', 1, 0}},
		{"zero words", []byte{'S', 'R', 1, 0, 0, 0, 0, 0}},
		{"bad magic", []byte{'S', 'X', 1, 1, 0, 0, 0, 0}},
		{"bad version", []byte{'S', 'R', 2, 1, 0, 0, 0, 0}},
		{"length mismatch", []byte{'S', 'R', 1, 2, 0, 0, 0, 0}},
		{"too many words", append([]byte{'S', 'R', 1, 9}, make([]byte, 36)...)},
		{"trailing byte", []byte{'S', 'R', 1, 1, 0, 0, 0, 0, 0}},
	} {
		if IsSACK(c.b) {
			t.Errorf("%s: IsSACK(% x) = true", c.name, c.b)
		}
	}
}

func FuzzSACK(f *testing.F) {
	var b [SACKMaxSize]byte
	f.Add(b[:EncodeSACK(b[:], []uint32{0xdeadbeef, 1})])
	f.Add([]byte{'S', 'R', 1, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		if !IsSACK(data) {
			return
		}
		s := SACK(data)
		words := make([]uint32, s.Words())
		for i := range words {
			words[i] = s.Word(i)
		}
		out := make([]byte, SACKSize(len(words)))
		EncodeSACK(out, words)
		if !bytes.Equal(out, data) {
			t.Fatalf("re-encoded % x, want % x", out, data)
		}
		h := s.Highest()
		for j := 0; j < s.Bits()+2; j++ {
			if s.Has(j) && j > h {
				t.Fatalf("bit %d set above Highest %d", j, h)
			}
		}
		if h >= 0 && !s.Has(h) {
			t.Fatalf("Highest %d not set", h)
		}
	})
}
