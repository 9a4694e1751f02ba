package packet_test

import (
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
)

// msgPath is the header and ICRC work of one direction of an 8-byte SEND
// round trip as transport does it (BenchmarkProtocolOnly8B): build an RC
// SEND ONLY of 8 bytes and its ACK, compute each ICRC on the way out, and
// check it and decode the packet on the way in. It uses only exported
// API, so the same file runs against older versions for A/B comparisons
// (and under callgrind: one op is a fixed instruction count).
type msgPath struct {
	pf        icrc.Prefix
	send, ack packet.Fields
	buf       [64]byte
	p         packet.Packet
}

func newMsgPath() *msgPath {
	m := &msgPath{pf: icrc.NewIPv4Prefix(&icrc.IPv4Pseudo{Src: [4]byte{192, 0, 2, 1}, Dst: [4]byte{192, 0, 2, 2}, FlagsFrag: 0x4000, SrcPort: 49152, DstPort: 4791})}
	m.send = packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendOnly, SolicitedEvent: true, PKey: bth.DefaultPKey, DestQP: 0x20, AckReq: true, PSN: 0x1234}, Payload: []byte("01234567")}
	m.ack = packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: bth.DefaultPKey, DestQP: 0x10, PSN: 0x1234}, AETH: aeth.Fields{Syndrome: aeth.NoCreditLimit, MSN: 7}}
	return m
}

// one sends and receives f; it reports false if anything failed.
func (m *msgPath) one(f *packet.Fields) bool {
	n, err := packet.Build(m.buf[:], f)
	if err != nil {
		return false
	}
	b := m.buf[:n]
	icrc.Store(b, m.pf.Compute(0, b))
	if icrc.Load(b) != m.pf.Compute(0, b) {
		return false
	}
	return m.p.Decode(b) == packet.FaultNone
}

// pair is one op: one SEND and one ACK.
//
//go:noinline
func (m *msgPath) pair() bool { return m.one(&m.send) && m.one(&m.ack) }

// BenchmarkMsgPath8B: one op is one SEND and one ACK (half a round trip
// of BenchmarkProtocolOnly8B's header and ICRC work). Under callgrind, the
// inclusive cost per call of msgPath.pair is the instruction count of one
// op.
func BenchmarkMsgPath8B(b *testing.B) {
	m := newMsgPath()
	for b.Loop() {
		if !m.pair() {
			b.Fatal("msgPath failed")
		}
	}
}

// BenchmarkBuildSend8 and BenchmarkBuildAck: Build alone.
func BenchmarkBuildSend8(b *testing.B) { benchBuildOnly(b, newMsgPath().send) }
func BenchmarkBuildAck(b *testing.B)   { benchBuildOnly(b, newMsgPath().ack) }

func benchBuildOnly(b *testing.B, f packet.Fields) {
	var buf [64]byte
	for b.Loop() {
		if _, err := packet.Build(buf[:], &f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeSend8 and BenchmarkDecodeAck: Decode alone.
func BenchmarkDecodeSend8(b *testing.B) { benchDecodeOnly(b, newMsgPath().send) }
func BenchmarkDecodeAck(b *testing.B)   { benchDecodeOnly(b, newMsgPath().ack) }

func benchDecodeOnly(b *testing.B, f packet.Fields) {
	var buf [64]byte
	n, err := packet.Build(buf[:], &f)
	if err != nil {
		b.Fatal(err)
	}
	var p packet.Packet
	for b.Loop() {
		if p.Decode(buf[:n]) != packet.FaultNone {
			b.Fatal("decode failed")
		}
	}
}
