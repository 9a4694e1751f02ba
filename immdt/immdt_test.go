package immdt

import (
	"bytes"
	"testing"
)

func TestImmDt(t *testing.T) {
	// golden/rc_write_imm_64.pcap frame 8: ImmDt=0x11220000.
	golden := []byte{0x11, 0x22, 0x00, 0x00}
	if got := ImmDt(golden).Imm(); got != 0x11220000 {
		t.Fatalf("Imm = %#x", got)
	}
	d := make(ImmDt, Size)
	d.SetImm(0x11220004)
	if want := []byte{0x11, 0x22, 0x00, 0x04}; !bytes.Equal(d, want) {
		t.Fatalf("SetImm bytes = % x, want % x", []byte(d), want)
	}
}

func TestIETH(t *testing.T) {
	e := make(IETH, IETHSize)
	e.SetRKey(0x00000cea)
	if want := []byte{0, 0, 0x0c, 0xea}; !bytes.Equal(e, want) {
		t.Fatalf("SetRKey bytes = % x, want % x", []byte(e), want)
	}
	if e.RKey() != 0xcea {
		t.Fatalf("RKey = %#x", e.RKey())
	}
}

func TestAllocs(t *testing.T) {
	d := make(ImmDt, Size)
	e := make(IETH, IETHSize)
	if n := testing.AllocsPerRun(100, func() { d.SetImm(1); _ = d.Imm(); e.SetRKey(2); _ = e.RKey() }); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}
