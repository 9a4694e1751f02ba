package transport

import (
	"bytes"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
)

// TestResponderFlushAtomicWriteUnsupported: the IBTA 1.5 RC FLUSH and
// ATOMIC_WRITE requests, which packet now parses (Linux rxe sends them
// since 6.2), are not executed: the responder answers as for any request
// it does not support, NAK invalid request, moves to ERR and places
// nothing in the target region.
func TestResponderFlushAtomicWriteUnsupported(t *testing.T) {
	for _, op := range []bth.Opcode{bth.RCFlush, bth.RCAtomicWrite} {
		t.Run(op.String(), func(t *testing.T) {
			e := newRespEnv(t, 0)
			fill(e.buf, 7)
			before := bytes.Clone(e.buf)
			var payload []byte
			if op == bth.RCAtomicWrite {
				payload = bytes.Repeat([]byte{0xaa}, 8)
			}
			f := reqOnly(op, payload)
			f.RETH.VA, f.RETH.RKey, f.RETH.DMALength = e.mr.IOVA(), e.mr.RKey(), 8
			f.FETH = 0x11 // selectivity: memory region, placement: global visibility
			e.feed(f, 0)
			sent := e.lb.sent()
			if len(sent) != 1 {
				t.Fatalf("responder sent %d packets %+v, want 1", len(sent), sent)
			}
			if r := sent[0]; r.op != bth.RCAck || r.syn != aeth.NAK(aeth.NAKInvalidRequest) || r.psn != e.psn {
				t.Fatalf("response %v %v psn %v, want NAK invalid request psn %v", r.op, r.syn, r.psn, e.psn)
			}
			if st := e.b.qp.State(); st != QPSErr {
				t.Fatalf("responder state %v, want ERR", st)
			}
			if !bytes.Equal(e.buf, before) {
				t.Fatal("target memory changed")
			}
			noWC(t, e.b.rcq)
		})
	}
}
