package bth

import (
	"bytes"
	"testing"
)

// A real BTH from golden/rc_write_imm_64.pcap frame 8:
// RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE dqpn=0x00001b psn=0xbdc5c2 AckReq pkey=0xffff pad 0.
var goldenBTH = []byte{0x0b, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x1b, 0x80, 0xbd, 0xc5, 0xc2}

func TestGoldenBTH(t *testing.T) {
	b := BTH(goldenBTH)
	want := Fields{Opcode: RCWriteOnlyImm, PKey: 0xffff, DestQP: 0x1b, AckReq: true, PSN: 0xbdc5c2}
	if got := b.Fields(); got != want {
		t.Fatalf("Fields() = %+v, want %+v", got, want)
	}
	out := make(BTH, Size)
	out.Encode(&want)
	if !bytes.Equal(out, goldenBTH) {
		t.Fatalf("Encode = % x, want % x", []byte(out), goldenBTH)
	}
}

func TestSetters(t *testing.T) {
	tests := []struct {
		name string
		set  func(BTH)
		want []byte // expected bytes after set on a zero header
		get  func(BTH) any
		val  any
	}{
		{"Opcode", func(b BTH) { b.SetOpcode(CNP) }, []byte{0x81, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.Opcode() }, CNP},
		{"SE", func(b BTH) { b.SetSolicitedEvent(true) }, []byte{0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.SolicitedEvent() }, true},
		{"MigReq", func(b BTH) { b.SetMigReq(true) }, []byte{0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.MigReq() }, true},
		{"PadCount", func(b BTH) { b.SetPadCount(3) }, []byte{0, 0x30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.PadCount() }, 3},
		{"PadCount2", func(b BTH) { b.SetPadCount(2) }, []byte{0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.PadCount() }, 2},
		{"TVer", func(b BTH) { b.SetTVer(0xf) }, []byte{0, 0x0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.TVer() }, uint8(0xf)},
		{"PKey", func(b BTH) { b.SetPKey(0x8001) }, []byte{0, 0, 0x80, 0x01, 0, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.PKey() }, uint16(0x8001)},
		{"FECN", func(b BTH) { b.SetFECN(true) }, []byte{0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.FECN() }, true},
		{"BECN", func(b BTH) { b.SetBECN(true) }, []byte{0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0}, func(b BTH) any { return b.BECN() }, true},
		{"DestQP", func(b BTH) { b.SetDestQP(0x123456) }, []byte{0, 0, 0, 0, 0, 0x12, 0x34, 0x56, 0, 0, 0, 0}, func(b BTH) any { return b.DestQP() }, uint32(0x123456)},
		{"DestQPMasked", func(b BTH) { b.SetDestQP(0xff123456) }, []byte{0, 0, 0, 0, 0, 0x12, 0x34, 0x56, 0, 0, 0, 0}, func(b BTH) any { return b.DestQP() }, uint32(0x123456)},
		{"AckReq", func(b BTH) { b.SetAckReq(true) }, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0}, func(b BTH) any { return b.AckReq() }, true},
		{"PSN", func(b BTH) { b.SetPSN(0xabcdef) }, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd, 0xef}, func(b BTH) any { return b.PSN() }, PSN(0xabcdef)},
		{"PSNMasked", func(b BTH) { b.SetPSN(0x1abcdef) }, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd, 0xef}, func(b BTH) any { return b.PSN() }, PSN(0xabcdef)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := make(BTH, Size)
			tt.set(b)
			if !bytes.Equal(b, tt.want) {
				t.Errorf("bytes = % x, want % x", []byte(b), tt.want)
			}
			if got := tt.get(b); got != tt.val {
				t.Errorf("get = %v, want %v", got, tt.val)
			}
			// Setting on an all-ones header must touch only the field.
			ones := BTH(bytes.Repeat([]byte{0xff}, Size))
			tt.set(ones)
			if got := tt.get(ones); got != tt.val {
				t.Errorf("get after set on 0xff header = %v, want %v", got, tt.val)
			}
		})
	}
}

func TestClearBits(t *testing.T) {
	b := BTH(bytes.Repeat([]byte{0xff}, Size))
	b.SetSolicitedEvent(false)
	b.SetMigReq(false)
	b.SetPadCount(0)
	b.SetTVer(0)
	b.SetFECN(false)
	b.SetBECN(false)
	b.SetAckReq(false)
	want := []byte{0xff, 0x00, 0xff, 0xff, 0x3f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff}
	if !bytes.Equal(b, want) {
		t.Fatalf("got % x, want % x", []byte(b), want)
	}
}

func TestEncodeFieldsRoundTrip(t *testing.T) {
	f := Fields{Opcode: RCSendOnlyImm, SolicitedEvent: true, MigReq: true, PadCount: 2, TVer: 0,
		PKey: 0xffff, FECN: true, BECN: true, DestQP: 0xabcdef, AckReq: true, PSN: 0x123456}
	b := BTH(bytes.Repeat([]byte{0xff}, Size)) // Encode must overwrite reserved bits
	b.Encode(&f)
	want := []byte{0x05, 0xe0, 0xff, 0xff, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0x12, 0x34, 0x56}
	if !bytes.Equal(b, want) {
		t.Fatalf("Encode = % x, want % x", []byte(b), want)
	}
	if got := b.Fields(); got != f {
		t.Fatalf("Fields = %+v, want %+v", got, f)
	}
}

func TestPadFor(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 3, 2: 2, 3: 1, 4: 0, 62: 2, 64: 0, 4095: 1} {
		if got := PadFor(n); got != want {
			t.Errorf("PadFor(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestAllocs(t *testing.T) {
	b := make(BTH, Size)
	f := Fields{Opcode: RCWriteOnly, PKey: DefaultPKey, DestQP: 7, PSN: 9}
	n := testing.AllocsPerRun(100, func() {
		b.Encode(&f)
		_ = b.Fields()
		_ = b.Opcode().Info()
		_ = b.PSN().Add(1).Diff(0)
	})
	if n != 0 {
		t.Fatalf("allocs = %v, want 0", n)
	}
}

func FuzzBTH(f *testing.F) {
	f.Add(goldenBTH)
	f.Add(bytes.Repeat([]byte{0xff}, Size))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < Size {
			return
		}
		b := BTH(data[:Size])
		fl := b.Fields()
		out := make(BTH, Size)
		out.Encode(&fl)
		// Encode zeroes only reserved bits: byte 4 low 6 bits, byte 8 low 7 bits.
		masked := append([]byte(nil), data[:Size]...)
		masked[4] &= 0xc0
		masked[8] &= 0x80
		if !bytes.Equal(out, masked) {
			t.Fatalf("Encode(Fields(x)) = % x, want % x", []byte(out), masked)
		}
		_ = fl.Opcode.String()
		_ = fl.PSN.String()
	})
}
