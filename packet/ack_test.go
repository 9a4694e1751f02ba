package packet

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
)

// TestBuildAckMatchesBuild checks that BuildAck writes the bytes Build
// writes for the same ACK, over random field values (out-of-range bits
// in the 24-bit fields included), and that a short buffer gets nothing.
func TestBuildAckMatchesBuild(t *testing.T) {
	if AckLen != Len(bth.RCAck, 0) {
		t.Fatalf("AckLen %d, Len(RCAck, 0) %d", AckLen, Len(bth.RCAck, 0))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 10000 {
		pkey, qpn, psn := uint16(r.Uint32()), r.Uint32(), bth.PSN(r.Uint32())
		syn, msn := aeth.Syndrome(r.Uint32()), r.Uint32()
		if i == 0 {
			pkey, qpn, psn, syn, msn = bth.DefaultPKey, 0x12, 0, aeth.ACK(aeth.NoCreditLimit), 1
		}
		f := Fields{}
		f.BTH.Opcode, f.BTH.PKey, f.BTH.DestQP, f.BTH.PSN = bth.RCAck, pkey, qpn, psn
		f.AETH.Syndrome, f.AETH.MSN = syn, msn
		want := bytes.Repeat([]byte{0xa5}, 64)
		got := bytes.Repeat([]byte{0xa5}, 64)
		n, err := Build(want, &f)
		if err != nil {
			t.Fatal(err)
		}
		if k := BuildAck(got, pkey, qpn, psn, syn, msn); k != n || !bytes.Equal(got, want) {
			t.Fatalf("pkey %#x qpn %#x psn %#x syn %#x msn %#x: BuildAck %d % x, Build %d % x", pkey, qpn, psn, syn, msn, k, got[:24], n, want[:24])
		}
	}
	short := bytes.Repeat([]byte{0xa5}, AckLen-1)
	if k := BuildAck(short, bth.DefaultPKey, 1, 1, 0, 1); k != 0 || !bytes.Equal(short, bytes.Repeat([]byte{0xa5}, AckLen-1)) {
		t.Fatalf("short buffer: BuildAck %d, buffer % x", k, short)
	}
}
