// Package aeth implements the ACK Extended Transport Header (AETH), its
// syndrome (ACK, RNR NAK, NAK), the RNR timer table, and the Atomic ACK
// Extended Transport Header (AtomicAckETH) that follows the AETH in an
// RC_ATOMIC_ACKNOWLEDGE, and the selective acknowledgement (SACK) block
// that two rocev2 peers which negotiated selective repeat put after the
// AETH of an RC ACKNOWLEDGE (sack.go).
//
// A wire package: it imports nothing of this module. packet and rocelayer
// build on the header views; memreg maps its errors to NAKCodes and
// transport uses the syndromes and the RNR timer table.
package aeth

import (
	"encoding/binary"
	"strconv"
	"time"
)

// Size is the length of an AETH in bytes.
const Size = 4

const (
	syndromeOff = 0
	msnOff      = 1 // 3 bytes
	msnMask     = 0xffffff
)

// AETH is a view of an ACK Extended Transport Header. The caller guarantees
// len >= Size.
type AETH []byte

// Fields holds the values of every AETH field.
type Fields struct {
	// Syndrome says whether this is an ACK, RNR NAK or NAK, with its value.
	Syndrome Syndrome
	// MSN is the 24-bit message sequence number.
	MSN uint32
}

// Syndrome returns the syndrome byte.
func (a AETH) Syndrome() Syndrome { return Syndrome(a[syndromeOff]) }

// SetSyndrome sets the syndrome byte.
func (a AETH) SetSyndrome(s Syndrome) { a[syndromeOff] = byte(s) }

// MSN returns the 24-bit message sequence number.
func (a AETH) MSN() uint32 {
	_ = a[Size-1]
	return uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}

// SetMSN sets the message sequence number; only the low 24 bits are used.
func (a AETH) SetMSN(v uint32) {
	_ = a[Size-1]
	a[1] = byte(v >> 16)
	a[2] = byte(v >> 8)
	a[3] = byte(v)
}

// Encode writes all Size bytes of the AETH from f.
func (a AETH) Encode(f *Fields) {
	_ = a[Size-1]
	a.SetSyndrome(f.Syndrome)
	a.SetMSN(f.MSN & msnMask)
}

// Fields decodes every AETH field.
func (a AETH) Fields() Fields { return Fields{Syndrome: a.Syndrome(), MSN: a.MSN()} }

// Syndrome is the AETH syndrome byte: bit 7 reserved, bits 6:5 the Type,
// bits 4:0 a value whose meaning depends on the type.
type Syndrome uint8

// Type is the kind of acknowledgement in bits 6:5 of a Syndrome.
type Type uint8

// Syndrome types.
const (
	TypeACK      Type = 0
	TypeRNRNAK   Type = 1
	TypeReserved Type = 2
	TypeNAK      Type = 3
)

// String returns "ACK", "RNR_NAK", "RESERVED" or "NAK".
func (t Type) String() string {
	switch t {
	case TypeACK:
		return "ACK"
	case TypeRNRNAK:
		return "RNR_NAK"
	case TypeReserved:
		return "RESERVED"
	case TypeNAK:
		return "NAK"
	}
	return "TYPE_" + strconv.Itoa(int(t))
}

// NoCreditLimit is the ACK credit count that means "no credit limit" (rxe
// always sends it).
const NoCreditLimit = 0x1f

const valueMask = 0x1f

// Type returns the syndrome's type (bits 6:5).
func (s Syndrome) Type() Type { return Type(s>>5) & 3 }

// Credits returns the credit count of an ACK (bits 4:0).
func (s Syndrome) Credits() uint8 { return uint8(s) & valueMask }

// RNRTimer returns the RNR timer code of an RNR NAK (bits 4:0); see RNRTimeout.
func (s Syndrome) RNRTimer() uint8 { return uint8(s) & valueMask }

// NAKCode returns the NAK code of a NAK (bits 4:0).
func (s Syndrome) NAKCode() NAKCode { return NAKCode(uint8(s) & valueMask) }

// String formats the syndrome, e.g. "ACK credits=31", "RNR_NAK timer=12" or
// "NAK PSN_SEQ_ERROR".
func (s Syndrome) String() string {
	switch s.Type() {
	case TypeACK:
		return "ACK credits=" + strconv.Itoa(int(s.Credits()))
	case TypeRNRNAK:
		return "RNR_NAK timer=" + strconv.Itoa(int(s.RNRTimer()))
	case TypeNAK:
		return "NAK " + s.NAKCode().String()
	}
	return "RESERVED value=" + strconv.Itoa(int(uint8(s)&valueMask))
}

// ACK returns the syndrome of a positive acknowledgement with the given
// credit count (low 5 bits; NoCreditLimit for none).
func ACK(credits uint8) Syndrome { return Syndrome(credits & valueMask) }

// RNRNAK returns the syndrome of a receiver-not-ready NAK with the given RNR
// timer code (low 5 bits).
func RNRNAK(timer uint8) Syndrome { return Syndrome(uint8(TypeRNRNAK)<<5 | timer&valueMask) }

// NAK returns the syndrome of a NAK with the given code (low 5 bits).
func NAK(code NAKCode) Syndrome { return Syndrome(uint8(TypeNAK)<<5 | uint8(code)&valueMask) }

// NAKCode is the value of a NAK syndrome.
type NAKCode uint8

// NAK codes.
const (
	NAKPSNSeqError            NAKCode = 0
	NAKInvalidRequest         NAKCode = 1
	NAKRemoteAccessError      NAKCode = 2
	NAKRemoteOperationalError NAKCode = 3
	NAKInvalidRDRequest       NAKCode = 4
)

// String returns the code's name, e.g. "PSN_SEQ_ERROR"; undefined codes are
// "NAK_CODE_<n>".
func (c NAKCode) String() string {
	switch c {
	case NAKPSNSeqError:
		return "PSN_SEQ_ERROR"
	case NAKInvalidRequest:
		return "INVALID_REQUEST"
	case NAKRemoteAccessError:
		return "REMOTE_ACCESS_ERROR"
	case NAKRemoteOperationalError:
		return "REMOTE_OPERATIONAL_ERROR"
	case NAKInvalidRDRequest:
		return "INVALID_RD_REQUEST"
	}
	return "NAK_CODE_" + strconv.Itoa(int(c))
}

// rnrTimeouts is the IBTA RNR NAK timer table, indexed by the 5-bit code.
var rnrTimeouts = [32]time.Duration{
	655360 * time.Microsecond, // 0 is the longest
	10 * time.Microsecond,
	20 * time.Microsecond,
	30 * time.Microsecond,
	40 * time.Microsecond,
	60 * time.Microsecond,
	80 * time.Microsecond,
	120 * time.Microsecond,
	160 * time.Microsecond,
	240 * time.Microsecond,
	320 * time.Microsecond,
	480 * time.Microsecond,
	640 * time.Microsecond,
	960 * time.Microsecond,
	1280 * time.Microsecond,
	1920 * time.Microsecond,
	2560 * time.Microsecond,
	3840 * time.Microsecond,
	5120 * time.Microsecond,
	7680 * time.Microsecond,
	10240 * time.Microsecond,
	15360 * time.Microsecond,
	20480 * time.Microsecond,
	30720 * time.Microsecond,
	40960 * time.Microsecond,
	61440 * time.Microsecond,
	81920 * time.Microsecond,
	122880 * time.Microsecond,
	163840 * time.Microsecond,
	245760 * time.Microsecond,
	327680 * time.Microsecond,
	491520 * time.Microsecond,
}

// RNRTimeout returns the time a requester waits after an RNR NAK with the
// given timer code (only the low 5 bits are used): 0 -> 655.36 ms,
// 1 -> 10 µs, ..., 31 -> 491.52 ms.
func RNRTimeout(code uint8) time.Duration { return rnrTimeouts[code&valueMask] }

// RNRCode returns the timer code with the shortest timeout that is >= d.
// Codes 1..31 increase monotonically; d <= 10 µs gives 1, and d above
// 491.52 ms gives 0 (655.36 ms, the longest, also used for any longer d).
func RNRCode(d time.Duration) uint8 {
	for c := uint8(1); c < 32; c++ {
		if rnrTimeouts[c] >= d {
			return c
		}
	}
	return 0
}

// AtomicAckSize is the length of an AtomicAckETH in bytes.
const AtomicAckSize = 8

// AtomicAck is a view of an Atomic ACK Extended Transport Header. The caller
// guarantees len >= AtomicAckSize.
type AtomicAck []byte

// OrigData returns the original value of the 8-byte target before the atomic
// operation.
func (a AtomicAck) OrigData() uint64 { return binary.BigEndian.Uint64(a) }

// SetOrigData sets the original value of the atomic target.
func (a AtomicAck) SetOrigData(v uint64) { binary.BigEndian.PutUint64(a, v) }
