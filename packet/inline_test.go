package packet

import (
	"bytes"
	"testing"

	"github.com/gorocev2/rocev2/bth"
)

// TestDecodeInlineLayoutsMatchWalk: for every valid opcode and a range of
// lengths, Decode's in-line layouts (none, AETH, RETH) give the views and
// payload that the generic walk (views) gives.
func TestDecodeInlineLayoutsMatchWalk(t *testing.T) {
	buf := make([]byte, 256)
	for i := range buf {
		buf[i] = byte(i*7 + 3)
	}
	checked := 0
	for op := 0; op < 256; op++ {
		info := &infos[op]
		if !info.Valid {
			continue
		}
		for n := 0; n <= 120; n++ {
			b := bytes.Clone(buf[:n])
			if n >= bth.Size {
				b[0] = byte(op)
				b[1] &^= 0x3f // pad 0, TVer 0
			}
			var p Packet
			if p.Decode(b) != FaultNone {
				continue
			}
			checked++
			var q Packet
			q.BTH = p.BTH
			q.Info = p.Info
			end := len(b) - ICRCSize - int(p.BTH.PadCount())
			q.Payload = b[q.views(b, bth.Size, info.Headers):end]
			if !same(p.RETH, q.RETH) || !same(p.AETH, q.AETH) || !same(p.ImmDt, q.ImmDt) || !same(p.IETH, q.IETH) ||
				!same(p.DETH, q.DETH) || !same(p.FETH, q.FETH) || !same(p.AtomicETH, q.AtomicETH) || !same(p.AtomicAck, q.AtomicAck) ||
				!same(p.Payload, q.Payload) {
				t.Fatalf("opcode %#x (%v) len %d: Decode's views differ from the generic walk's", op, bth.Opcode(op), n)
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d decodes checked", checked)
	}
}

func same[T ~[]byte](a, b T) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}
