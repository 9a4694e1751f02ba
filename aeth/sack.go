package aeth

import "encoding/binary"

// Selective acknowledgement (SACK) block: the extension that two rocev2
// peers which negotiated selective repeat (ECE, or the QP attribute both
// set) put after the AETH of an RC ACKNOWLEDGE. It is never sent to any
// other peer, and a standard ACK never carries it.
//
// The packet is an ordinary RC ACKNOWLEDGE (opcode 0x11) whose AETH is a
// NAK "PSN sequence error" (syndrome 0x60) or an ACK: the BTH PSN is the
// responder's expected PSN (every PSN before it was received: the
// cumulative acknowledgement), as in a standard sequence NAK. What a
// standard ACK does not carry follows the AETH as the packet's payload
// (BTH PadCount 0, covered by the ICRC), in 4-byte words:
//
//	byte 0-1  magic 0x53 0x52 ("SR")
//	byte 2    version (1)
//	byte 3    n: the number of 32-bit bitmap words that follow (1..8)
//	byte 4-   bitmap, n big-endian words: bit j (word j/32, bit 31-j%32)
//	          set means PSN BTH.PSN+1+j was received and is held by the
//	          responder (a READ request's bits cover all its PSNs)
//
// Wireshark decodes the BTH and the AETH of such a packet as usual and
// shows the block as the packet's trailing data. The requester resends
// only the PSNs before the highest set bit whose bits are clear.

// SACK sizes and markers.
const (
	// SACKHeaderSize is the length of the block's header (magic,
	// version, word count).
	SACKHeaderSize = 4
	// SACKMaxWords is the largest bitmap, in 32-bit words.
	SACKMaxWords = 8
	// SACKMaxBits is the number of PSNs the largest bitmap covers.
	SACKMaxBits = SACKMaxWords * 32
	// SACKMaxSize is the length of the largest block.
	SACKMaxSize = SACKHeaderSize + 4*SACKMaxWords
	// SACKVersion is the block version this package writes and reads.
	SACKVersion = 1
)

const (
	sackMagic0 = 'S'
	sackMagic1 = 'R'
)

// SACK is a view of a selective acknowledgement block. Check it with
// IsSACK before calling its methods.
type SACK []byte

// SACKSize returns the length of a block with n bitmap words.
func SACKSize(words int) int { return SACKHeaderSize + 4*words }

// IsSACK reports whether b is exactly one well-formed SACK block: the
// magic, version 1, a word count of 1..SACKMaxWords and a length that
// matches it.
func IsSACK(b []byte) bool {
	if len(b) < SACKHeaderSize+4 || b[0] != sackMagic0 || b[1] != sackMagic1 || b[2] != SACKVersion {
		return false
	}
	n := int(b[3])
	return n >= 1 && n <= SACKMaxWords && len(b) == SACKSize(n)
}

// Words returns the number of bitmap words.
func (s SACK) Words() int { return int(s[3]) }

// Bits returns the number of PSNs the bitmap covers.
func (s SACK) Bits() int { return 32 * s.Words() }

// Has reports whether bit j (PSN base+1+j) is set; false beyond Bits.
func (s SACK) Has(j int) bool {
	if j < 0 || j >= s.Bits() {
		return false
	}
	w := binary.BigEndian.Uint32(s[SACKHeaderSize+4*(j/32):])
	return w&(1<<(31-uint(j%32))) != 0
}

// Word returns bitmap word i (bits 32i..32i+31, the first in bit 31).
func (s SACK) Word(i int) uint32 { return binary.BigEndian.Uint32(s[SACKHeaderSize+4*i:]) }

// Highest returns the highest set bit, or -1 when none is set.
func (s SACK) Highest() int {
	for i := s.Words() - 1; i >= 0; i-- {
		if w := s.Word(i); w != 0 {
			k := 0
			for w&1 == 0 {
				w >>= 1
				k++
			}
			return 32*i + 31 - k
		}
	}
	return -1
}

// EncodeSACK writes a block with len(words) bitmap words (1..SACKMaxWords)
// into b, which must hold SACKSize(len(words)) bytes, and returns its
// length.
func EncodeSACK(b []byte, words []uint32) int {
	n := SACKSize(len(words))
	_ = b[n-1]
	b[0], b[1], b[2], b[3] = sackMagic0, sackMagic1, SACKVersion, byte(len(words))
	for i, w := range words {
		binary.BigEndian.PutUint32(b[SACKHeaderSize+4*i:], w)
	}
	return n
}
