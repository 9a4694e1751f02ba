package transport

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/udp"
)

// TestAckLast: ACKs at the head of a QP's output move behind the requests
// after them, keeping the order within each; anything else (a READ
// response or atomic ACK among them, an ACK not at the head, only ACKs)
// stays as it is.
func TestAckLast(t *testing.T) {
	const (
		ack  = bth.RCAck
		send = bth.RCSendOnly
		wr   = bth.RCWriteOnly
		rdr  = bth.RCReadResponseOnly
		aack = bth.RCAtomicAck
	)
	for _, tc := range []struct {
		name    string
		in, out []bth.Opcode
	}{
		{"ack send", []bth.Opcode{ack, send}, []bth.Opcode{send, ack}},
		{"two acks two writes", []bth.Opcode{ack, ack, wr, send}, []bth.Opcode{wr, send, ack, ack}},
		{"ack three requests", []bth.Opcode{ack, wr, wr, send}, []bth.Opcode{wr, wr, send, ack}},
		{"three acks a request", []bth.Opcode{ack, ack, ack, send}, []bth.Opcode{send, ack, ack, ack}},
		{"send ack", []bth.Opcode{send, ack}, []bth.Opcode{send, ack}},
		{"ack alone", []bth.Opcode{ack}, []bth.Opcode{ack}},
		{"acks only", []bth.Opcode{ack, ack}, []bth.Opcode{ack, ack}},
		{"ack read response", []bth.Opcode{ack, rdr}, []bth.Opcode{ack, rdr}},
		{"ack send read response", []bth.Opcode{ack, send, rdr}, []bth.Opcode{ack, send, rdr}},
		{"ack atomic ack", []bth.Opcode{ack, aack}, []bth.Opcode{ack, aack}},
		{"ack send ack", []bth.Opcode{ack, send, ack}, []bth.Opcode{ack, send, ack}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qp := &QP{out: make([]udp.Packet, outBatch), outBufs: make([]*[udp.MaxPacketSize]byte, outBatch)}
			for i, op := range tc.in {
				b := new([udp.MaxPacketSize]byte)
				b[0], b[1] = byte(op), byte(i) // byte 1 tags the packet
				qp.outBufs[i] = b
				qp.out[i].Buf = b[:20]
			}
			qp.nout = len(tc.in)
			qp.ackLast()
			for i, op := range tc.out {
				p := qp.out[i].Buf
				if bth.Opcode(p[0]) != op {
					t.Fatalf("packet %d: %v, want %v", i, bth.Opcode(p[0]), op)
				}
				if &qp.outBufs[i][0] != &p[0] {
					t.Fatalf("packet %d: outBufs does not follow out", i)
				}
				if i > 0 && bth.Opcode(qp.out[i-1].Buf[0]) == op && qp.out[i-1].Buf[1] > p[1] {
					t.Fatalf("packets %d and %d of one kind swapped", i-1, i)
				}
			}
		})
	}
}

// TestSwapOut: swapOut exchanges every field of two packets (a field added
// to udp.Packet must be added to swapOut too).
func TestSwapOut(t *testing.T) {
	if n := reflect.TypeFor[udp.Packet]().NumField(); n != 6 {
		t.Fatalf("udp.Packet has %d fields; swapOut swaps 6", n)
	}
	a := udp.Packet{Buf: []byte{1}, Addr: netip.MustParseAddr("192.0.2.1"), SrcPort: 1, TOS: 1, Payload: []byte{1, 1}, Hold: fakeHold(1)}
	b := udp.Packet{Buf: []byte{2, 2, 2}, Addr: netip.MustParseAddr("192.0.2.2"), SrcPort: 2, TOS: 2}
	x, y := a, b
	swapOut(&x, &y)
	if !reflect.DeepEqual(x, b) || !reflect.DeepEqual(y, a) {
		t.Fatalf("swapOut: %+v %+v", x, y)
	}
}

type fakeHold int

func (fakeHold) Acquire() bool { return true }
func (fakeHold) Release()      {}
