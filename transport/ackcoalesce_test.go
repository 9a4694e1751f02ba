package transport

import (
	"bytes"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/reth"
)

// TestAckCoalescing: the positive ACKs one received batch makes the
// responder send are merged into the last of a run (its PSN and MSN cover
// the others); a NAK is never merged and ends a run; batches are separate.
func TestAckCoalescing(t *testing.T) {
	s, l := scriptedResponder(t, MTU1024, 0x200)
	buf := make([]byte, 4096)
	mr, err := s.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	write := func(psn bth.PSN, i int) []byte {
		f := reqOnly(bth.RCWriteOnly, bytes.Repeat([]byte{byte(i)}, 8))
		f.RETH = reth.Fields{VA: mr.IOVA() + uint64(8*i), RKey: mr.RKey(), DMALength: 8}
		return build(t, s.qp, psn, f)
	}
	type ack struct {
		psn bth.PSN
		syn aeth.Syndrome
		msn uint32
	}
	ok := aeth.ACK(aeth.NoCreditLimit)
	expect := func(what string, want []ack) {
		t.Helper()
		eventually(t, what, func() bool { return len(l.sentPackets(t)) >= len(want) })
		sent := l.sentPackets(t)
		if len(sent) != len(want) {
			t.Fatalf("%s: %d packets sent, want %d", what, len(sent), len(want))
		}
		for i, w := range want {
			p := &sent[i]
			if p.BTH.Opcode() != bth.RCAck || p.BTH.PSN() != w.psn || p.AETH.Syndrome() != w.syn || p.AETH.MSN() != w.msn {
				t.Errorf("%s: packet %d: %v psn %v %v msn %d, want ACK psn %v %v msn %d", what, i,
					p.BTH.Opcode(), p.BTH.PSN(), p.AETH.Syndrome(), p.AETH.MSN(), w.psn, w.syn, w.msn)
			}
		}
	}
	// Five WRITE ONLY with AckReq in one batch: one ACK.
	l.in <- [][]byte{write(0x200, 0), write(0x201, 1), write(0x202, 2), write(0x203, 3), write(0x204, 4)}
	want := []ack{{0x204, ok, 5}}
	expect("one batch of five", want)
	// A batch with a gap: ACK for what came before it, then the PSN
	// sequence error NAK (not merged with anything).
	l.in <- [][]byte{write(0x205, 5), write(0x206, 6), write(0x208, 8)}
	want = append(want, ack{0x206, ok, 7}, ack{0x207, aeth.NAK(aeth.NAKPSNSeqError), 7})
	expect("a batch with a gap", want)
	// The retransmission in its own batch: one ACK again.
	l.in <- [][]byte{write(0x207, 7), write(0x208, 8)}
	want = append(want, ack{0x208, ok, 9})
	expect("the retransmission", want)
	for i := range 9 {
		if !bytes.Equal(buf[8*i:8*i+8], bytes.Repeat([]byte{byte(i)}, 8)) {
			t.Errorf("WRITE %d not placed", i)
		}
	}
	if c := s.dev.Counters(); c.AckDeferred != 4+1+1 {
		t.Errorf("ack_deferred %d, want 6 (ACKs merged into a later one)", c.AckDeferred)
	}
}
