package packet

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/gorocev2/rocev2/bth"
)

// decodeSamples returns packets of every valid opcode (payloads of 0, 3
// and 8 bytes where the opcode carries one) and malformed ones (short,
// TVer 1, an undefined opcode, a bad pad count, payload on an ACK).
func decodeSamples(tb testing.TB) [][]byte {
	build := func(op bth.Opcode, payload []byte) []byte {
		f := sampleFields(op, payload)
		buf := make([]byte, Len(op, len(payload)))
		if _, err := Build(buf, &f); err != nil {
			tb.Fatal(err)
		}
		return buf
	}
	var pkts [][]byte
	for _, op := range validOpcodes() {
		sizes := []int{0}
		if op.Info().Payload {
			sizes = []int{0, 3, 8}
		}
		for _, n := range sizes {
			pkts = append(pkts, build(op, make([]byte, n)))
		}
	}
	ack := build(bth.RCAck, nil)
	write := build(bth.RCWriteOnly, []byte{1, 2})
	badPad := append([]byte(nil), write...)
	badPad[1] |= 0x30 // pad 3 > 2+2
	pkts = append(pkts, ack[:12], append([]byte{0x15}, ack[1:]...), append(ack[:1:1], append([]byte{ack[1] | 1}, ack[2:]...)...),
		badPad, append(append([]byte(nil), ack[:16]...), 1, 2, 3, 4, 0, 0, 0, 0))
	return pkts
}

// TestDecodeNextMatchesDecode: DecodeNext into one reused Packet gives,
// for every pair of consecutive packets (each opcode's layout after each
// other's, and malformed packets between), the Packet and Fault that
// Decode into a fresh Packet gives: the views the previous packet set and
// this one's opcode does not carry are nil. Then random sequences.
func TestDecodeNextMatchesDecode(t *testing.T) {
	pkts := decodeSamples(t)
	check := func(p *Packet, prev, b []byte) {
		t.Helper()
		var fresh Packet
		want := fresh.Decode(b)
		if got := p.DecodeNext(b); got != want {
			t.Fatalf("after %x: DecodeNext(% x) = %v, Decode %v", prev[:1], b, got, want)
		}
		if !reflect.DeepEqual(*p, fresh) {
			t.Fatalf("after opcode %#x: DecodeNext(% x) = %+v, Decode %+v", prev[0], b, *p, fresh)
		}
	}
	for _, a := range pkts {
		for _, b := range pkts {
			var p Packet
			check(&p, []byte{0}, a)
			check(&p, a, b)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var p Packet
	prev := []byte{0}
	for range 20000 {
		b := pkts[rng.IntN(len(pkts))]
		check(&p, prev, b)
		prev = b
	}
}

// TestDecodeAfterAssignedViews: Decode (not DecodeNext) clears every view
// of a Packet whose fields were assigned, whatever it decoded before.
func TestDecodeAfterAssignedViews(t *testing.T) {
	send := build(t, bth.RCSendOnly, []byte{1, 2, 3, 4})
	var p Packet
	if p.DecodeNext(send) != FaultNone {
		t.Fatal("SEND ONLY rejected")
	}
	p.RETH = []byte{9}
	if p.Decode(send) != FaultNone || p.RETH != nil {
		t.Fatalf("Decode left RETH %v", p.RETH)
	}
}

// FuzzDecodeNext: DecodeNext of b after a, into one Packet, gives the
// Packet and Fault that Decode of b into a fresh Packet gives, whatever
// a and b hold.
func FuzzDecodeNext(f *testing.F) {
	pkts := decodeSamples(f)
	for i, a := range pkts {
		f.Add(a, pkts[(i*7+3)%len(pkts)])
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var p, fresh Packet
		p.DecodeNext(a)
		want := fresh.Decode(b)
		if got := p.DecodeNext(b); got != want || !reflect.DeepEqual(p, fresh) {
			t.Fatalf("DecodeNext(% x) after % x = %v %+v, Decode %v %+v", b, a, got, p, want, fresh)
		}
	})
}
