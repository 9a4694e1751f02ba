package packet

import (
	"encoding/binary"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
)

// AckLen is the length of an RC ACKNOWLEDGE (BTH, AETH and ICRC):
// Len(bth.RCAck, 0).
const AckLen = bth.Size + aeth.Size + ICRCSize

// BuildAck writes an RC ACKNOWLEDGE into buf and returns AckLen: the bytes
// Build writes for Fields with BTH.Opcode bth.RCAck, BTH.PKey pkey,
// BTH.DestQP destQP, BTH.PSN psn, AETH.Syndrome syn and AETH.MSN msn and
// every other field zero (a zero ICRC placeholder included), without the
// generic opcode-table walk: a responder sends one per message. destQP,
// psn and msn are cut to their 24 bits as Build cuts them. It returns 0,
// writing nothing, if buf is shorter than AckLen.
func BuildAck(buf []byte, pkey uint16, destQP uint32, psn bth.PSN, syn aeth.Syndrome, msn uint32) int {
	if len(buf) < AckLen {
		return 0
	}
	b := buf[:AckLen]
	binary.BigEndian.PutUint64(b, uint64(bth.RCAck)<<56|uint64(pkey)<<32|uint64(destQP&0xffffff))
	binary.BigEndian.PutUint32(b[8:], uint32(psn)&0xffffff)
	binary.BigEndian.PutUint32(b[12:], uint32(syn)<<24|msn&0xffffff)
	binary.LittleEndian.PutUint32(b[16:], 0)
	return AckLen
}
