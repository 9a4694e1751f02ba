package aeth

import (
	"bytes"
	"testing"
	"time"
)

func TestGolden(t *testing.T) {
	// golden/rc_atomic_fadd.pcap frame 25: AETH[ACK credits=31 msn=1]
	// AtomicAckETH[orig=0xd188fff3956a08c4].
	ae := []byte{0x1f, 0x00, 0x00, 0x01}
	want := Fields{Syndrome: ACK(NoCreditLimit), MSN: 1}
	if got := AETH(ae).Fields(); got != want {
		t.Fatalf("Fields = %+v, want %+v", got, want)
	}
	if s := AETH(ae).Syndrome().String(); s != "ACK credits=31" {
		t.Fatalf("String = %q", s)
	}
	out := make(AETH, Size)
	out.Encode(&want)
	if !bytes.Equal(out, ae) {
		t.Fatalf("Encode = % x, want % x", []byte(out), ae)
	}
	aa := []byte{0xd1, 0x88, 0xff, 0xf3, 0x95, 0x6a, 0x08, 0xc4}
	if got := AtomicAck(aa).OrigData(); got != 0xd188fff3956a08c4 {
		t.Fatalf("OrigData = %#x", got)
	}
	o := make(AtomicAck, AtomicAckSize)
	o.SetOrigData(0xd188fff3956a08c4)
	if !bytes.Equal(o, aa) {
		t.Fatalf("SetOrigData = % x", []byte(o))
	}
}

func TestSetters(t *testing.T) {
	a := make(AETH, Size)
	a.SetSyndrome(NAK(NAKRemoteAccessError))
	if want := []byte{0x62, 0, 0, 0}; !bytes.Equal(a, want) {
		t.Errorf("SetSyndrome bytes = % x, want % x", []byte(a), want)
	}
	a = make(AETH, Size)
	a.SetMSN(0xabcdef)
	if want := []byte{0, 0xab, 0xcd, 0xef}; !bytes.Equal(a, want) {
		t.Errorf("SetMSN bytes = % x, want % x", []byte(a), want)
	}
	if a.MSN() != 0xabcdef {
		t.Errorf("MSN = %#x", a.MSN())
	}
	a.Encode(&Fields{Syndrome: RNRNAK(12), MSN: 0x1000005})
	if want := []byte{0x2c, 0, 0, 5}; !bytes.Equal(a, want) {
		t.Errorf("Encode masks MSN: % x, want % x", []byte(a), want)
	}
}

func TestSyndrome(t *testing.T) {
	tests := []struct {
		s     Syndrome
		byte_ uint8
		typ   Type
		val   uint8
		str   string
	}{
		{ACK(NoCreditLimit), 0x1f, TypeACK, 31, "ACK credits=31"},
		{ACK(0), 0x00, TypeACK, 0, "ACK credits=0"},
		{RNRNAK(12), 0x2c, TypeRNRNAK, 12, "RNR_NAK timer=12"},
		{RNRNAK(0), 0x20, TypeRNRNAK, 0, "RNR_NAK timer=0"},
		{RNRNAK(0xff), 0x3f, TypeRNRNAK, 31, "RNR_NAK timer=31"},
		{NAK(NAKPSNSeqError), 0x60, TypeNAK, 0, "NAK PSN_SEQ_ERROR"},
		{NAK(NAKInvalidRequest), 0x61, TypeNAK, 1, "NAK INVALID_REQUEST"},
		{NAK(NAKRemoteAccessError), 0x62, TypeNAK, 2, "NAK REMOTE_ACCESS_ERROR"},
		{NAK(NAKRemoteOperationalError), 0x63, TypeNAK, 3, "NAK REMOTE_OPERATIONAL_ERROR"},
		{NAK(NAKInvalidRDRequest), 0x64, TypeNAK, 4, "NAK INVALID_RD_REQUEST"},
		{NAK(9), 0x69, TypeNAK, 9, "NAK NAK_CODE_9"},
		{Syndrome(0x45), 0x45, TypeReserved, 5, "RESERVED value=5"},
		{Syndrome(0x9f), 0x9f, TypeACK, 31, "ACK credits=31"}, // bit 7 reserved, ignored
	}
	for _, tt := range tests {
		if uint8(tt.s) != tt.byte_ {
			t.Errorf("%v: byte %#x, want %#x", tt.s, uint8(tt.s), tt.byte_)
		}
		if tt.s.Type() != tt.typ {
			t.Errorf("%#x: Type %v, want %v", uint8(tt.s), tt.s.Type(), tt.typ)
		}
		var v uint8
		switch tt.typ {
		case TypeACK:
			v = tt.s.Credits()
		case TypeRNRNAK:
			v = tt.s.RNRTimer()
		default:
			v = uint8(tt.s.NAKCode())
		}
		if v != tt.val {
			t.Errorf("%#x: value %d, want %d", uint8(tt.s), v, tt.val)
		}
		if got := tt.s.String(); got != tt.str {
			t.Errorf("%#x: String %q, want %q", uint8(tt.s), got, tt.str)
		}
	}
}

func TestRNRTimeoutTable(t *testing.T) {
	// The IBTA RNR NAK timer table, in ms, by code (0 is the longest).
	ms := []float64{655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64,
		0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92,
		122.88, 163.84, 245.76, 327.68, 491.52}
	for code, m := range ms {
		want := time.Duration(m*1e6 + 0.5)
		if got := RNRTimeout(uint8(code)); got != want {
			t.Errorf("RNRTimeout(%d) = %v, want %v", code, got, want)
		}
		if code != 0 {
			if got := RNRCode(want); got != uint8(code) {
				t.Errorf("RNRCode(%v) = %d, want %d", want, got, code)
			}
		}
		if code > 1 {
			if got := RNRCode(RNRTimeout(uint8(code-1)) + 1); got != uint8(code) {
				t.Errorf("RNRCode(just above code %d) = %d, want %d", code-1, got, code)
			}
		}
	}
	if got := RNRTimeout(32 + 12); got != RNRTimeout(12) {
		t.Errorf("RNRTimeout does not mask to 5 bits: %v", got)
	}
}

func TestRNRCodeEdges(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want uint8
	}{
		{-time.Second, 1},
		{0, 1},
		{time.Microsecond, 1},
		{10 * time.Microsecond, 1},
		{11 * time.Microsecond, 2},
		{640 * time.Microsecond, 12},
		{641 * time.Microsecond, 13},
		{491520 * time.Microsecond, 31},
		{491520*time.Microsecond + 1, 0},
		{655360 * time.Microsecond, 0},
		{time.Hour, 0},
	}
	for _, tt := range tests {
		if got := RNRCode(tt.d); got != tt.want {
			t.Errorf("RNRCode(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestAllocs(t *testing.T) {
	a := make(AETH, Size)
	aa := make(AtomicAck, AtomicAckSize)
	f := Fields{Syndrome: ACK(NoCreditLimit), MSN: 3}
	n := testing.AllocsPerRun(100, func() {
		a.Encode(&f)
		_ = a.Fields()
		aa.SetOrigData(5)
		_ = aa.OrigData()
		_ = RNRCode(RNRTimeout(12))
	})
	if n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

func FuzzAETH(f *testing.F) {
	f.Add([]byte{0x1f, 0, 0, 1})
	f.Add([]byte{0x60, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < Size {
			return
		}
		fl := AETH(data).Fields()
		out := make(AETH, Size)
		out.Encode(&fl)
		if !bytes.Equal(out, data[:Size]) {
			t.Fatalf("Encode(Fields(x)) = % x, want % x", []byte(out), data[:Size])
		}
		s := fl.Syndrome
		var rebuilt Syndrome
		switch s.Type() {
		case TypeACK:
			rebuilt = ACK(s.Credits())
		case TypeRNRNAK:
			rebuilt = RNRNAK(s.RNRTimer())
		case TypeNAK:
			rebuilt = NAK(s.NAKCode())
		default:
			rebuilt = s & 0x7f
		}
		if rebuilt != s&0x7f {
			t.Fatalf("syndrome %#x rebuilt as %#x", uint8(s), uint8(rebuilt))
		}
		_ = s.String()
		_ = RNRTimeout(s.RNRTimer())
	})
}
