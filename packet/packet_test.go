package packet

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/atomiceth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/deth"
	"github.com/gorocev2/rocev2/reth"
)

// sampleFields returns Fields for op with every header field set to a
// distinct non-zero value and the given payload.
func sampleFields(op bth.Opcode, payload []byte) Fields {
	return Fields{
		BTH: bth.Fields{Opcode: op, SolicitedEvent: true, PKey: bth.DefaultPKey, BECN: op == bth.CNP,
			DestQP: 0x00001b, AckReq: true, PSN: 0xbdc5c2},
		RETH:          reth.Fields{VA: 0x55c5fcf133a0, RKey: 0xcea, DMALength: uint32(len(payload))},
		AETH:          aeth.Fields{Syndrome: aeth.ACK(aeth.NoCreditLimit), MSN: 0x123456},
		AtomicETH:     atomiceth.Fields{VA: 0x55f027c98000, RKey: 0xa46, SwapAdd: 0x1111, Compare: 0x2222},
		AtomicAckOrig: 0xd188fff3956a08c4,
		Imm:           0x11220004,
		IETHRKey:      0xabcd,
		DETH:          deth.Fields{QKey: 0x11111111, SrcQP: 0x14},
		Payload:       payload,
	}
}

// expectFields returns what parsing a packet built from f must give back:
// PadCount computed, and header fields the opcode does not carry zeroed.
func expectFields(f Fields) Fields {
	info := f.BTH.Opcode.Info()
	f.BTH.PadCount = uint8(bth.PadFor(len(f.Payload)))
	h := info.Headers
	if !h.Has(bth.HdrRETH) {
		f.RETH = reth.Fields{}
	}
	if !h.Has(bth.HdrAETH) {
		f.AETH = aeth.Fields{}
	}
	if !h.Has(bth.HdrAtomicETH) {
		f.AtomicETH = atomiceth.Fields{}
	}
	if !h.Has(bth.HdrAtomicAckETH) {
		f.AtomicAckOrig = 0
	}
	if !h.Has(bth.HdrImmDt) {
		f.Imm = 0
	}
	if !h.Has(bth.HdrIETH) {
		f.IETHRKey = 0
	}
	if !h.Has(bth.HdrDETH) {
		f.DETH = deth.Fields{}
	}
	return f
}

func sameFields(a, b Fields) bool {
	return a.BTH == b.BTH && a.RETH == b.RETH && a.AETH == b.AETH && a.AtomicETH == b.AtomicETH &&
		a.AtomicAckOrig == b.AtomicAckOrig && a.Imm == b.Imm && a.IETHRKey == b.IETHRKey &&
		a.DETH == b.DETH && a.FETH == b.FETH && bytes.Equal(a.Payload, b.Payload)
}

func validOpcodes() []bth.Opcode {
	var ops []bth.Opcode
	for i := 0; i < 256; i++ {
		if bth.Opcode(i).Valid() {
			ops = append(ops, bth.Opcode(i))
		}
	}
	return ops
}

func TestRoundTripEveryOpcode(t *testing.T) {
	ops := validOpcodes()
	if len(ops) < 38 {
		t.Fatalf("only %d valid opcodes", len(ops))
	}
	for _, op := range ops {
		info := op.Info()
		sizes := []int{0}
		if info.Payload {
			sizes = []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 16, 17, 62, 1024, 4096}
		}
		for _, n := range sizes {
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = byte(i*7 + 1)
			}
			f := sampleFields(op, payload)
			buf := bytes.Repeat([]byte{0xee}, n+128) // Build must overwrite every byte it claims
			got, err := Build(buf, &f)
			if err != nil {
				t.Fatalf("%v/%d: Build: %v", op, n, err)
			}
			if want := Len(op, n); got != want {
				t.Fatalf("%v/%d: Build returned %d, Len says %d", op, n, got, want)
			}
			if want := bth.Size + info.HeaderLen + n + bth.PadFor(n) + ICRCSize; got != want {
				t.Fatalf("%v/%d: length %d, want %d", op, n, got, want)
			}
			if got%4 != 0 {
				t.Errorf("%v/%d: length %d not a multiple of 4", op, n, got)
			}
			pkt := buf[:got]
			if tail := pkt[got-ICRCSize-bth.PadFor(n):]; !bytes.Equal(tail, make([]byte, len(tail))) {
				t.Errorf("%v/%d: pad+ICRC not zero: % x", op, n, tail)
			}
			var p Packet
			if err := p.Parse(pkt); err != nil {
				t.Fatalf("%v/%d: Parse: %v", op, n, err)
			}
			if p.Info != info {
				t.Errorf("%v/%d: Info mismatch", op, n)
			}
			if pf := p.Fields(); !sameFields(pf, expectFields(f)) {
				t.Errorf("%v/%d: Parse(Build(f)).Fields() = %+v, want %+v", op, n, pf, expectFields(f))
			}
			if p.ICRC != 0 {
				t.Errorf("%v/%d: ICRC placeholder %#x", op, n, p.ICRC)
			}
			if cap(p.Payload) != len(p.Payload) {
				t.Errorf("%v/%d: payload cap %d > len %d", op, n, cap(p.Payload), len(p.Payload))
			}
			h := info.Headers
			views := []struct {
				name    string
				present bool
				hdr     bth.Header
			}{
				{"RETH", p.RETH != nil, bth.HdrRETH},
				{"AETH", p.AETH != nil, bth.HdrAETH},
				{"AtomicETH", p.AtomicETH != nil, bth.HdrAtomicETH},
				{"AtomicAck", p.AtomicAck != nil, bth.HdrAtomicAckETH},
				{"ImmDt", p.ImmDt != nil, bth.HdrImmDt},
				{"IETH", p.IETH != nil, bth.HdrIETH},
				{"DETH", p.DETH != nil, bth.HdrDETH},
			}
			for _, v := range views {
				if v.present != h.Has(v.hdr) {
					t.Errorf("%v/%d: view %s present=%v, headers %v", op, n, v.name, v.present, h)
				}
			}
		}
	}
}

func TestBuildHandWritten(t *testing.T) {
	// RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 3 bytes of payload (pad 1).
	f := Fields{
		BTH:     bth.Fields{Opcode: bth.RCWriteOnlyImm, PKey: 0xffff, DestQP: 0x1b, AckReq: true, PSN: 0xbdc5c2},
		RETH:    reth.Fields{VA: 0x55c5fcf133a0, RKey: 0xcea, DMALength: 3},
		Imm:     0x11220000,
		Payload: []byte{0xaa, 0xbb, 0xcc},
	}
	want := []byte{
		0x0b, 0x10, 0xff, 0xff, 0x00, 0x00, 0x00, 0x1b, 0x80, 0xbd, 0xc5, 0xc2, // BTH, PadCnt 1
		0x00, 0x00, 0x55, 0xc5, 0xfc, 0xf1, 0x33, 0xa0, 0x00, 0x00, 0x0c, 0xea, 0x00, 0x00, 0x00, 0x03, // RETH
		0x11, 0x22, 0x00, 0x00, // ImmDt
		0xaa, 0xbb, 0xcc, 0x00, // payload + pad
		0x00, 0x00, 0x00, 0x00, // ICRC placeholder
	}
	buf := make([]byte, 100)
	n, err := Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("Build =\n% x\nwant\n% x", buf[:n], want)
	}

	// RC_ATOMIC_ACKNOWLEDGE from golden/rc_atomic_fadd.pcap frame 25 (ICRC 0xdb857bcc).
	ack := []byte{
		0x12, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x19, 0x00, 0xa1, 0x60, 0x63,
		0x1f, 0x00, 0x00, 0x01,
		0xd1, 0x88, 0xff, 0xf3, 0x95, 0x6a, 0x08, 0xc4,
		0xcc, 0x7b, 0x85, 0xdb,
	}
	var p Packet
	if err := p.Parse(ack); err != nil {
		t.Fatal(err)
	}
	if p.ICRC != 0xdb857bcc {
		t.Errorf("ICRC = %#x, want 0xdb857bcc (little-endian trailer)", p.ICRC)
	}
	if p.AETH.MSN() != 1 || p.AETH.Syndrome() != aeth.ACK(31) || p.AtomicAck.OrigData() != 0xd188fff3956a08c4 {
		t.Errorf("ATOMIC ACK fields: %+v", p.Fields())
	}
	if len(p.Payload) != 0 || p.RETH != nil || p.ImmDt != nil {
		t.Errorf("unexpected views: %+v", p)
	}

	// CNP: BECN, 16 reserved bytes.
	cnp := Fields{BTH: bth.Fields{Opcode: bth.CNP, PKey: 0xffff, BECN: true, DestQP: 0x11}}
	n, err = Build(buf, &cnp)
	if err != nil {
		t.Fatal(err)
	}
	wantCNP := append([]byte{0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00},
		make([]byte, 16+4)...)
	if !bytes.Equal(buf[:n], wantCNP) {
		t.Fatalf("CNP =\n% x\nwant\n% x", buf[:n], wantCNP)
	}
}

func build(t *testing.T, op bth.Opcode, payload []byte) []byte {
	t.Helper()
	f := sampleFields(op, payload)
	buf := make([]byte, Len(op, len(payload)))
	if _, err := Build(buf, &f); err != nil {
		t.Fatal(err)
	}
	return buf
}

func TestParseErrors(t *testing.T) {
	ack := build(t, bth.RCAck, nil)                  // 20 bytes
	write := build(t, bth.RCWriteOnly, []byte{1, 2}) // 12+16+2+2+4 = 36 bytes
	mod := func(b []byte, f func([]byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"15 bytes", make([]byte, 15), ErrTruncated},
		{"BTH only", ack[:12], ErrTruncated},
		{"TVer 1", mod(ack, func(b []byte) { b[1] |= 1 }), ErrBadTVer},
		{"TVer 15", mod(ack, func(b []byte) { b[1] |= 0xf }), ErrBadTVer},
		{"opcode 0x15", mod(ack, func(b []byte) { b[0] = 0x15 }), ErrUnknownOpcode},
		{"opcode 0x1f", mod(ack, func(b []byte) { b[0] = 0x1f }), ErrUnknownOpcode},
		{"opcode RD", mod(ack, func(b []byte) { b[0] = 0x44 }), ErrUnknownOpcode},
		{"opcode 0xff", mod(ack, func(b []byte) { b[0] = 0xff }), ErrUnknownOpcode},
		{"ACK without AETH", ack[:16], ErrTruncated},
		{"ACK short AETH", ack[:19], ErrTruncated},
		{"WRITE_ONLY short RETH", write[:12+15+4], ErrTruncated},
		{"atomic truncated", build(t, bth.RCCompareSwap, nil)[:12+27+4], ErrTruncated},
		{"CNP truncated", build(t, bth.CNP, nil)[:12+15+4], ErrTruncated},
		{"UD truncated DETH", build(t, bth.UDSendOnly, nil)[:12+7+4], ErrTruncated},
		{"ACK with payload", append(append([]byte(nil), ack[:16]...), 0, 0, 0, 0, 0, 0, 0, 0), ErrUnexpectedPayload},
		{"ACK with a SACK block and a trailing word", append(append([]byte(nil), ack[:16]...), 'S', 'R', 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), ErrUnexpectedPayload},
		{"ACK with a SACK block of a wrong version", append(append([]byte(nil), ack[:16]...), 'S', 'R', 2, 1, 0, 0, 0, 0, 0, 0, 0, 0), ErrUnexpectedPayload},
		{"READ request with payload", append(build(t, bth.RCReadRequest, nil), 1, 2, 3, 4), ErrUnexpectedPayload},
		{"CNP with payload", append(build(t, bth.CNP, nil), 0, 0, 0, 0), ErrUnexpectedPayload},
		{"ACK with pad count", mod(ack, func(b []byte) { b[1] |= 0x30 }), ErrBadPadCount},
		// SEND_ONLY of 1 byte has pad 3; cut so only 2 bytes follow the BTH.
		{"pad > payload", build(t, bth.RCSendOnly, []byte{1})[:12+2+4], ErrBadPadCount},
		{"unaligned payload", append(build(t, bth.RCSendOnly, []byte{1, 2, 3, 4}), 9), ErrBadPadCount},
		{"pad count disagrees", mod(build(t, bth.RCSendOnly, []byte{1, 2, 3, 4}), func(b []byte) { b[1] |= 0x20 })[:12+2+4], ErrBadPadCount},
		{"SEND_ONLY empty with pad", mod(build(t, bth.RCSendOnly, nil), func(b []byte) { b[1] |= 0x10 }), ErrBadPadCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Packet
			// Parse must reset every field of p on error, also those a
			// previous successful Parse set (Info, header views, ICRC).
			if err := p.Parse(build(t, bth.RCWriteOnlyImm, []byte{1, 2, 3})); err != nil {
				t.Fatal(err)
			}
			err := p.Parse(tt.b)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Parse = %v, want %v", err, tt.want)
			}
			if !reflect.ValueOf(p).IsZero() {
				t.Errorf("Packet not reset on error: %+v", p)
			}
			t.Logf("%v", err)
			// Decode reports the same reason as a Fault, without
			// allocating, and also resets p.
			var q Packet
			if err := q.Parse(build(t, bth.RCWriteOnlyImm, []byte{1, 2, 3})); err != nil {
				t.Fatal(err)
			}
			if f := q.Decode(tt.b); f.Err() != tt.want {
				t.Errorf("Decode = %v (%v), want %v", f, f.Err(), tt.want)
			}
			if !reflect.ValueOf(q).IsZero() {
				t.Errorf("Packet not reset by Decode: %+v", q)
			}
			if n := testing.AllocsPerRun(10, func() { q.Decode(tt.b) }); n != 0 {
				t.Errorf("Decode of a malformed packet allocates %v times", n)
			}
		})
	}
}

func TestParseSEPayloadEdge(t *testing.T) {
	// A SEND of 1 byte (pad 3): the payload is exactly 1 byte and the views alias the input.
	b := build(t, bth.RCSendOnly, []byte{0x5a})
	var p Packet
	if err := p.Parse(b); err != nil {
		t.Fatal(err)
	}
	if len(p.Payload) != 1 || p.Payload[0] != 0x5a || p.BTH.PadCount() != 3 {
		t.Fatalf("payload % x pad %d", p.Payload, p.BTH.PadCount())
	}
	p.BTH.SetPSN(7)
	if bth.BTH(b).PSN() != 7 {
		t.Fatal("views do not alias the input")
	}
}

func TestBuildErrors(t *testing.T) {
	buf := make([]byte, 8192)
	tests := []struct {
		name string
		buf  []byte
		f    Fields
		want error
	}{
		{"undefined opcode", buf, Fields{BTH: bth.Fields{Opcode: 0x1f}}, ErrUnknownOpcode},
		{"RD opcode", buf, Fields{BTH: bth.Fields{Opcode: 0x44}}, ErrUnknownOpcode},
		{"ACK with payload", buf, Fields{BTH: bth.Fields{Opcode: bth.RCAck}, Payload: []byte{1}}, ErrUnexpectedPayload},
		{"READ request with payload", buf, Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest}, Payload: []byte{1}}, ErrUnexpectedPayload},
		{"CNP with payload", buf, Fields{BTH: bth.Fields{Opcode: bth.CNP}, Payload: []byte{1}}, ErrUnexpectedPayload},
		{"short buffer", buf[:Len(bth.RCWriteOnly, 100)-1], Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly}, Payload: make([]byte, 100)}, ErrShortBuffer},
		{"nil buffer", nil, Fields{BTH: bth.Fields{Opcode: bth.RCAck}}, ErrShortBuffer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := Build(tt.buf, &tt.f)
			if !errors.Is(err, tt.want) || n != 0 {
				t.Fatalf("Build = %d, %v; want 0, %v", n, err, tt.want)
			}
			t.Logf("%v", err)
		})
	}
	// Exactly Len bytes is enough.
	f := Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly}, Payload: make([]byte, 101)}
	if _, err := Build(make([]byte, Len(bth.RCWriteOnly, 101)), &f); err != nil {
		t.Fatal(err)
	}
}

func TestLen(t *testing.T) {
	tests := []struct {
		op   bth.Opcode
		n    int
		want int
	}{
		{bth.RCAck, 0, 20},
		{bth.RCAtomicAck, 0, 28},
		{bth.RCCompareSwap, 0, 44},
		{bth.RCReadRequest, 0, 32},
		{bth.RCWriteOnly, 4096, 12 + 16 + 4096 + 4},
		{bth.RCWriteOnlyImm, 62, 12 + 20 + 62 + 2 + 4},
		{bth.RCSendMiddle, 1024, 1040},
		{bth.UDSendOnly, 512, 12 + 8 + 512 + 4},
		{bth.UDSendOnlyImm, 1, 12 + 12 + 4 + 4},
		{bth.CNP, 0, 32},
	}
	for _, tt := range tests {
		if got := Len(tt.op, tt.n); got != tt.want {
			t.Errorf("Len(%v, %d) = %d, want %d", tt.op, tt.n, got, tt.want)
		}
	}
}

func TestZeroAlloc(t *testing.T) {
	payload := make([]byte, 4096)
	f := sampleFields(bth.RCWriteOnlyImm, payload)
	buf := make([]byte, Len(bth.RCWriteOnlyImm, len(payload)))
	var p Packet
	n := testing.AllocsPerRun(100, func() {
		k, err := Build(buf, &f)
		if err != nil {
			panic(err)
		}
		if err := p.Parse(buf[:k]); err != nil {
			panic(err)
		}
		_ = p.Fields()
	})
	if n != 0 {
		t.Fatalf("Build+Parse allocate %v times per run", n)
	}
}

// FuzzParse checks that Parse never panics and that whatever it accepts
// Build reproduces byte for byte (except the ICRC).
func FuzzParse(f *testing.F) {
	for _, g := range goldenFuzzSeeds(f) {
		f.Add(g.payload)
	}
	for _, op := range validOpcodes() {
		buf := make([]byte, Len(op, 5))
		fl := sampleFields(op, nil)
		if op.Info().Payload {
			fl.Payload = []byte{1, 2, 3, 4, 5}
		}
		n, _ := Build(buf, &fl)
		f.Add(buf[:n])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var p Packet
		if err := p.Parse(data); err != nil {
			return
		}
		fl := p.Fields()
		out := make([]byte, len(data))
		n, err := Build(out, &fl)
		if err != nil {
			t.Fatalf("Build(Parse(x)): %v", err)
		}
		if n != len(data) {
			t.Fatalf("Build length %d, input %d", n, len(data))
		}
		// Build zeroes reserved bits (BTH byte 4 low 6, byte 8 low 7, DETH
		// byte 4), the pad, the CNP reserved bytes and the ICRC; mask those in
		// the input before comparing.
		want := append([]byte(nil), data...)
		want[4] &= 0xc0
		want[8] &= 0x80
		if p.DETH != nil {
			want[bth.Size+4] = 0
		}
		clear(want[len(want)-ICRCSize-p.BTH.PadCount():])
		if p.Info.Headers.Has(bth.HdrCNPPad) {
			off := bth.Size + p.Info.HeaderLen - bth.CNPPadSize
			clear(want[off : off+bth.CNPPadSize])
		}
		if !bytes.Equal(out[:n], want) {
			t.Fatalf("Build(Parse(x)) =\n% x\nwant\n% x", out[:n], want)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	payload := make([]byte, 4096)
	f := sampleFields(bth.RCWriteOnly, payload)
	buf := make([]byte, Len(bth.RCWriteOnly, len(payload)))
	n, err := Build(buf, &f)
	if err != nil {
		b.Fatal(err)
	}
	pkt := buf[:n]
	var p Packet
	b.ReportAllocs()
	b.SetBytes(int64(n))
	for b.Loop() {
		if err := p.Parse(pkt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	payload := make([]byte, 4096)
	f := sampleFields(bth.RCWriteOnly, payload)
	buf := make([]byte, Len(bth.RCWriteOnly, len(payload)))
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := Build(buf, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCopy4K is the baseline for BenchmarkBuild: a bare 4 KiB copy.
func BenchmarkCopy4K(b *testing.B) {
	payload := make([]byte, 4096)
	buf := make([]byte, 4096+32)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		copy(buf[28:], payload)
	}
}

// TestOpcodeTableCopy: the package's copy of the opcode table (infos, read
// by Parse, Build and Len) equals bth's for all 256 opcodes.
func TestOpcodeTableCopy(t *testing.T) {
	for i := range 256 {
		op := bth.Opcode(i)
		if infos[op] != op.Info() {
			t.Errorf("opcode %#02x: infos %+v, bth %+v", i, infos[op], op.Info())
		}
	}
}

// TestSACKAfterAETH: an RC ACKNOWLEDGE may carry exactly one selective
// repeat SACK block after its AETH (aeth.SACK); Parse hands it over as the
// payload and Build writes it back byte for byte. No other opcode may.
func TestSACKAfterAETH(t *testing.T) {
	var sk [aeth.SACKMaxSize]byte
	block := sk[:aeth.EncodeSACK(sk[:], []uint32{0xc0000000, 0, 0, 5})]
	f := Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: 0x11, PSN: 0x123},
		AETH: aeth.Fields{Syndrome: aeth.NAK(aeth.NAKPSNSeqError), MSN: 7}, Payload: block}
	buf := make([]byte, 128)
	n, err := Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	if n != bth.Size+aeth.Size+len(block)+ICRCSize {
		t.Fatalf("length %d", n)
	}
	var p Packet
	if err := p.Parse(buf[:n]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Payload, block) || p.BTH.PadCount() != 0 || p.AETH.MSN() != 7 {
		t.Fatalf("payload % x pad %d msn %d", p.Payload, p.BTH.PadCount(), p.AETH.MSN())
	}
	f.BTH.Opcode = bth.RCAtomicAck
	if _, err := Build(buf, &f); !errors.Is(err, ErrUnexpectedPayload) {
		t.Fatalf("a SACK block after an ATOMIC ACKNOWLEDGE: %v", err)
	}
	f.BTH.Opcode, f.Payload = bth.RCAck, block[:len(block)-4]
	if _, err := Build(buf, &f); !errors.Is(err, ErrUnexpectedPayload) {
		t.Fatalf("a truncated SACK block: %v", err)
	}
}

// stalePacket returns a Packet with every field set to something Decode
// must overwrite: each view a non-nil 4-byte slice, Info another opcode's
// entry, the ICRC non-zero. It fills by reflection, so a field added to
// Packet later is covered too.
func stalePacket(t *testing.T) Packet {
	t.Helper()
	var p Packet
	v := reflect.ValueOf(&p).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if !v.Type().Field(i).IsExported() {
			continue // set: Decode's own record
		}
		switch f.Kind() {
		case reflect.Slice:
			f.Set(reflect.ValueOf([]byte{9, 9, 9, 9}).Convert(f.Type()))
		case reflect.Struct:
			f.Set(reflect.ValueOf(bth.UDSendOnlyImm.Info()))
		case reflect.Uint32:
			f.SetUint(0xdeadbeef)
		default:
			t.Fatalf("stalePacket: field %s of kind %v not handled", v.Type().Field(i).Name, f.Kind())
		}
	}
	return p
}

// TestDecodeOverwritesEveryField: Decode sets each field of a reused
// Packet itself (the views of absent headers to nil) instead of zeroing
// the whole Packet first, so decoding into a Packet full of a previous
// packet's views must give exactly what decoding into a zero Packet
// gives, for every opcode; a rejected packet leaves p zero.
func TestDecodeOverwritesEveryField(t *testing.T) {
	for _, op := range validOpcodes() {
		sizes := []int{0}
		if op.Info().Payload {
			sizes = []int{0, 3, 8, 13}
		}
		for _, n := range sizes {
			pkt := build(t, op, make([]byte, n))
			var fresh Packet
			if f := fresh.Decode(pkt); f != FaultNone {
				t.Fatalf("%v/%d: Decode: %v", op, n, f)
			}
			reused := stalePacket(t)
			if f := reused.Decode(pkt); f != FaultNone {
				t.Fatalf("%v/%d: Decode into a used Packet: %v", op, n, f)
			}
			if !reflect.DeepEqual(reused, fresh) {
				t.Errorf("%v/%d: Decode into a used Packet = %+v, want %+v", op, n, reused, fresh)
			}
		}
	}
	ack := build(t, bth.RCAck, nil)
	for _, bad := range [][]byte{ack[:12], append([]byte{0x15}, ack[1:]...), append(ack[:1:1], append([]byte{ack[1] | 1}, ack[2:]...)...)} {
		p := stalePacket(t)
		if f := p.Decode(bad); f == FaultNone {
			t.Fatalf("Decode(% x) accepted", bad)
		}
		if !reflect.DeepEqual(p, Packet{}) {
			t.Errorf("Decode(% x) rejected but left %+v", bad, p)
		}
	}
}

// TestBuildSplitMatchesBuild: BuildSplit's headers, then the payload, then
// its pad and ICRC placeholder are Build's packet byte for byte, in a
// buffer that held other bytes before (BuildSplit clears the pad and
// placeholder with two 4-byte stores).
func TestBuildSplitMatchesBuild(t *testing.T) {
	for _, op := range validOpcodes() {
		info := op.Info()
		if !info.Payload {
			continue
		}
		for n := range 18 {
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = byte(i*5 + 3)
			}
			f := sampleFields(op, payload)
			want := make([]byte, Len(op, n))
			if _, err := Build(want, &f); err != nil {
				t.Fatalf("%v/%d: Build: %v", op, n, err)
			}
			buf := bytes.Repeat([]byte{0xee}, len(want))
			k, err := BuildSplit(buf, &f, n)
			if err != nil {
				t.Fatalf("%v/%d: BuildSplit: %v", op, n, err)
			}
			if k != len(want)-n {
				t.Fatalf("%v/%d: BuildSplit returned %d, want %d", op, n, k, len(want)-n)
			}
			hl := bth.Size + info.HeaderLen
			got := append(append(append([]byte(nil), buf[:hl]...), payload...), buf[hl:k]...)
			if !bytes.Equal(got, want) {
				t.Errorf("%v/%d: BuildSplit + payload =\n% x\nBuild =\n% x", op, n, got, want)
			}
		}
	}
}
