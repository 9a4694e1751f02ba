package deth

import (
	"bytes"
	"testing"
)

// From golden/ud_send_512.pcap: DETH[qkey=0x11111111 srcqp=0x000014].
var golden = []byte{0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x14}

func TestGolden(t *testing.T) {
	want := Fields{QKey: 0x11111111, SrcQP: 0x14}
	if got := DETH(golden).Fields(); got != want {
		t.Fatalf("Fields = %+v, want %+v", got, want)
	}
	out := DETH(bytes.Repeat([]byte{0xff}, Size))
	out.Encode(&want)
	if !bytes.Equal(out, golden) {
		t.Fatalf("Encode = % x, want % x", []byte(out), golden)
	}
}

func TestSetters(t *testing.T) {
	d := make(DETH, Size)
	d.SetQKey(0x80010000)
	if want := []byte{0x80, 0x01, 0, 0, 0, 0, 0, 0}; !bytes.Equal(d, want) {
		t.Errorf("SetQKey bytes = % x, want % x", []byte(d), want)
	}
	if d.QKey() != 0x80010000 {
		t.Errorf("QKey = %#x", d.QKey())
	}
	d = make(DETH, Size)
	d.SetSrcQP(0xabcdef)
	if want := []byte{0, 0, 0, 0, 0, 0xab, 0xcd, 0xef}; !bytes.Equal(d, want) {
		t.Errorf("SetSrcQP bytes = % x, want % x", []byte(d), want)
	}
	if d.SrcQP() != 0xabcdef {
		t.Errorf("SrcQP = %#x", d.SrcQP())
	}
	d.SetSrcQP(0xff000001)
	if d.SrcQP() != 1 || d[4] != 0 {
		t.Errorf("SrcQP not masked to 24 bits: % x", []byte(d))
	}
}

func TestAllocs(t *testing.T) {
	d := make(DETH, Size)
	f := Fields{QKey: 1, SrcQP: 2}
	if n := testing.AllocsPerRun(100, func() { d.Encode(&f); _ = d.Fields() }); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

func FuzzDETH(f *testing.F) {
	f.Add(golden)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < Size {
			return
		}
		fl := DETH(data).Fields()
		if fl.SrcQP > 0xffffff {
			t.Fatalf("SrcQP %#x exceeds 24 bits", fl.SrcQP)
		}
		out := make(DETH, Size)
		out.Encode(&fl)
		want := append([]byte(nil), data[:Size]...)
		want[4] = 0 // reserved
		if !bytes.Equal(out, want) {
			t.Fatalf("Encode(Fields(x)) = % x, want % x", []byte(out), want)
		}
	})
}
