// Package packet parses and builds whole RoCEv2 UDP payloads: the BTH, the
// extension headers its opcode calls for, the payload, the pad and the
// 4-byte ICRC trailer. It validates the layout but not the ICRC value (see
// package icrc) and leaves MTU policing to the transport.
//
// Both Parse and Build are allocation-free on success.
//
// A wire package: it imports only the header packages (bth, reth, aeth,
// atomiceth, deth, immdt). transport parses and builds every packet with
// it; rocelayer validates with it.
package packet

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/atomiceth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/deth"
	"github.com/gorocev2/rocev2/immdt"
	"github.com/gorocev2/rocev2/reth"
)

// ICRCSize is the length of the ICRC trailer in bytes.
const ICRCSize = 4

// MinLen is the length of the shortest possible RoCEv2 UDP payload: a BTH and
// an ICRC.
const MinLen = bth.Size + ICRCSize

// Errors returned (wrapped, with details) by Parse and Build; test with errors.Is.
var (
	// ErrTruncated: the packet is shorter than its BTH, headers and ICRC.
	ErrTruncated = errors.New("packet: truncated")
	// ErrUnknownOpcode: the BTH opcode is not defined (see bth.Opcode.Info).
	ErrUnknownOpcode = errors.New("packet: unknown opcode")
	// ErrBadTVer: the BTH transport header version is not 0.
	ErrBadTVer = errors.New("packet: bad transport header version")
	// ErrBadPadCount: the BTH pad count exceeds the bytes after the headers.
	ErrBadPadCount = errors.New("packet: bad pad count")
	// ErrUnexpectedPayload: payload on an opcode that carries none.
	ErrUnexpectedPayload = errors.New("packet: unexpected payload")
	// ErrShortBuffer: Build's buffer cannot hold the packet.
	ErrShortBuffer = errors.New("packet: buffer too small")
)

// Packet is a parsed RoCEv2 UDP payload. Its views alias the parsed buffer;
// views of headers the opcode does not carry are nil.
type Packet struct {
	// BTH is the base transport header.
	BTH bth.BTH
	// Info is the opcode table entry of BTH.Opcode().
	Info bth.Info
	// RETH is the RDMA extended transport header, or nil.
	RETH reth.RETH
	// AETH is the ACK extended transport header, or nil.
	AETH aeth.AETH
	// AtomicETH is the atomic extended transport header, or nil.
	AtomicETH atomiceth.AtomicETH
	// AtomicAck is the atomic ACK extended transport header, or nil.
	AtomicAck aeth.AtomicAck
	// ImmDt is the immediate data header, or nil.
	ImmDt immdt.ImmDt
	// IETH is the invalidate extended transport header, or nil.
	IETH immdt.IETH
	// DETH is the datagram extended transport header, or nil.
	DETH deth.DETH
	// FETH is the flush extended transport header of an RC FLUSH (4
	// bytes, big-endian: bits 0-3 the placement type, bits 4-5 the
	// selectivity level), or nil.
	FETH []byte
	// Payload is the payload without the pad. Its capacity ends at the
	// payload, so appending to it never overwrites the pad or ICRC. For an
	// RC ACKNOWLEDGE it is empty or a selective repeat peer's SACK block
	// (aeth.SACK).
	Payload []byte
	// ICRC is the trailer as stored (little-endian in the last 4 bytes).
	ICRC uint32

	// set holds the headers whose views the last Decode or DecodeNext
	// may have set (all bits after Decode's start): the views DecodeNext
	// clears.
	set bth.Header
}

// infos is bth's opcode table, read through a pointer. Parse used to copy
// op.Info() into a local and then into p: the 24-byte value moves as two
// overlapping 16-byte stores, and reading it back stalled store forwarding
// twice, which was most of Parse's time.
var infos = func() (t [256]bth.Info) {
	for i := range t {
		t[i] = bth.Opcode(i).Info()
	}
	return t
}()

// Fault says why Decode rejected a packet. The zero value, FaultNone,
// means the packet parsed. A Fault is a small integer, so a receive path
// that drops malformed packets can count them by reason without building
// an error; Parse turns a Fault into a detailed error.
type Fault uint8

// Decode faults. Each matches one of the Err* sentinels (Fault.Err).
const (
	FaultNone              Fault = iota // parsed
	FaultTruncated                      // ErrTruncated
	FaultBadTVer                        // ErrBadTVer
	FaultUnknownOpcode                  // ErrUnknownOpcode
	FaultUnexpectedPayload              // ErrUnexpectedPayload
	FaultBadPadCount                    // ErrBadPadCount
	numFaults
)

// NumFaults is the number of Fault values, FaultNone included: an array of
// NumFaults counters can be indexed by Fault.
const NumFaults = int(numFaults)

var faultErrs = [numFaults]error{nil, ErrTruncated, ErrBadTVer, ErrUnknownOpcode, ErrUnexpectedPayload, ErrBadPadCount}

// Err returns the sentinel error of f (nil for FaultNone).
func (f Fault) Err() error {
	if f < numFaults {
		return faultErrs[f]
	}
	return nil
}

// String returns a short name: "none", "truncated", "bad_tver",
// "unknown_opcode", "unexpected_payload" or "bad_pad_count".
func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultTruncated:
		return "truncated"
	case FaultBadTVer:
		return "bad_tver"
	case FaultUnknownOpcode:
		return "unknown_opcode"
	case FaultUnexpectedPayload:
		return "unexpected_payload"
	case FaultBadPadCount:
		return "bad_pad_count"
	}
	return "fault(" + fmt.Sprint(uint8(f)) + ")"
}

// Parse parses b, a whole UDP payload (BTH .. ICRC), into p; the views alias
// b. It checks the length, that TVer is 0, that the opcode is defined, that
// opcodes without payload carry none, and the pad rule: the pad count fits
// and payload plus pad is a whole number of 4-byte words. It does
// not check the ICRC value. On error p is zeroed and the error wraps one of
// the Err* sentinels with the details. Decode does the same without
// building an error.
func (p *Packet) Parse(b []byte) error {
	if f := p.Decode(b); f != FaultNone {
		return describe(f, b)
	}
	return nil
}

// describe builds Parse's error for a packet Decode rejected with f.
func describe(f Fault, b []byte) error {
	if len(b) < MinLen {
		return fmt.Errorf("%w: %d bytes, need at least %d for BTH and ICRC", ErrTruncated, len(b), MinLen)
	}
	h := bth.BTH(b[:bth.Size])
	op := h.Opcode()
	info := &infos[op]
	rest := len(b) - ICRCSize - bth.Size - info.HeaderLen
	switch f {
	case FaultBadTVer:
		return fmt.Errorf("%w: TVer %d in %v packet, want 0", ErrBadTVer, h.TVer(), op)
	case FaultUnknownOpcode:
		return fmt.Errorf("%w: opcode 0x%02x", ErrUnknownOpcode, uint8(op))
	case FaultTruncated:
		return fmt.Errorf("%w: %v packet of %d bytes, need at least %d for BTH, %v and ICRC",
			ErrTruncated, op, len(b), bth.Size+info.HeaderLen+ICRCSize, info.Headers)
	case FaultUnexpectedPayload:
		return fmt.Errorf("%w: %v carries no payload, got %d bytes after the headers",
			ErrUnexpectedPayload, op, rest)
	case FaultBadPadCount:
		if pad := h.PadCount(); pad > rest {
			return fmt.Errorf("%w: %v pad count %d but only %d bytes after the headers",
				ErrBadPadCount, op, pad, rest)
		}
		// Payload plus pad must fill whole 4-byte words, so the pad count
		// agrees with the payload length (pad == bth.PadFor(payload)).
		return fmt.Errorf("%w: %v payload+pad is %d bytes, not a multiple of 4 (pad count %d)",
			ErrBadPadCount, op, rest, h.PadCount())
	}
	return f.Err()
}

// Decode is Parse without the error: it parses b into p and returns
// FaultNone, or zeroes p and returns why b is malformed. It never
// allocates.
func (p *Packet) Decode(b []byte) Fault {
	p.set = ^bth.Header(0) // any field may hold anything: clear every view
	return p.DecodeNext(b)
}

// DecodeNext is Decode for a Packet that only Decode and DecodeNext have
// written since it was zero (a receive loop's one Packet): it checks b
// exactly as Decode does, and of the header views the previous decode
// set it clears only those b's opcode does not carry, instead of all
// eight. On a Packet whose fields were written otherwise (assigned, or
// copied from one that was) it may leave such a view in place: use
// Decode there.
func (p *Packet) DecodeNext(b []byte) Fault {
	if len(b) < MinLen {
		return p.fail(FaultTruncated)
	}
	h := bth.BTH(b[:bth.Size])
	op := h.Opcode()
	if h.TVer() != 0 {
		return p.fail(FaultBadTVer)
	}
	info := &infos[op]
	if !info.Valid {
		return p.fail(FaultUnknownOpcode)
	}
	end := len(b) - ICRCSize
	off := bth.Size
	if need := bth.Size + info.HeaderLen + ICRCSize; len(b) < need {
		return p.fail(FaultTruncated)
	}
	rest := end - off - info.HeaderLen // payload + pad
	pad := h.PadCount()
	if !info.Payload && rest != 0 && !(op == bth.RCAck && pad == 0 && aeth.IsSACK(b[off+aeth.Size:end])) {
		// The one exception: a selective repeat peer's SACK block
		// after an RC ACKNOWLEDGE's AETH (aeth.SACK), exactly one.
		return p.fail(FaultUnexpectedPayload)
	}
	if pad > rest || rest%4 != 0 {
		return p.fail(FaultBadPadCount)
	}

	// Every field is written below: the views of the headers the opcode
	// does not carry are set to nil here rather than the whole Packet
	// zeroed first — only those the previous decode may have set (none
	// when it had the same layout or a subset of it; one when a SEND
	// follows an ACK).
	p.BTH = h
	p.Info = *info
	if s := p.set &^ info.Headers; s != 0 {
		switch s {
		case bth.HdrAETH:
			p.AETH = nil
		case bth.HdrRETH:
			p.RETH = nil
		default:
			p.RETH, p.AETH, p.AtomicETH, p.AtomicAck = nil, nil, nil, nil
			p.ImmDt, p.IETH, p.DETH, p.FETH = nil, nil, nil, nil
		}
	}
	p.set = info.Headers
	pe := end - pad
	p.ICRC = binary.LittleEndian.Uint32(b[end:])
	// The three commonest layouts first, without testing each header
	// bit: none (SEND, WRITE middle/last, READ response middle), the
	// AETH alone (ACK, READ response first/last/only) and the RETH alone
	// (WRITE first/only, READ request).
	switch hs := info.Headers; hs {
	case 0:
		p.Payload = b[off:pe:pe]
		return FaultNone
	case bth.HdrAETH:
		p.AETH = aeth.AETH(b[off : off+aeth.Size : off+aeth.Size])
		off += aeth.Size
		p.Payload = b[off:pe:pe]
		return FaultNone
	case bth.HdrRETH:
		p.RETH = reth.RETH(b[off : off+reth.Size : off+reth.Size])
		off += reth.Size
		p.Payload = b[off:pe:pe]
		return FaultNone
	}
	p.Payload = b[p.views(b, off, info.Headers):pe:pe]
	return FaultNone
}

// fail zeroes p and returns f, for Decode's rejections (not inlined: the
// zeroing would be repeated at each of them).
//
//go:noinline
func (p *Packet) fail(f Fault) Fault {
	*p = Packet{}
	return f
}

// views sets the views of the extension headers hs, which start at off in
// b (Decode checked that they fit), and returns where they end.
func (p *Packet) views(b []byte, off int, hs bth.Header) int {
	// Extension headers in wire order (see bth.Header).
	if hs&bth.HdrRDETH != 0 {
		off += bth.RDETHSize // no view: RD is not a supported transport
	}
	if hs&bth.HdrDETH != 0 {
		p.DETH = deth.DETH(b[off : off+deth.Size : off+deth.Size])
		off += deth.Size
	}
	if hs&bth.HdrFETH != 0 {
		p.FETH = b[off : off+bth.FETHSize : off+bth.FETHSize]
		off += bth.FETHSize
	}
	if hs&bth.HdrRETH != 0 {
		p.RETH = reth.RETH(b[off : off+reth.Size : off+reth.Size])
		off += reth.Size
	}
	if hs&bth.HdrAtomicETH != 0 {
		p.AtomicETH = atomiceth.AtomicETH(b[off : off+atomiceth.Size : off+atomiceth.Size])
		off += atomiceth.Size
	}
	if hs&bth.HdrAETH != 0 {
		p.AETH = aeth.AETH(b[off : off+aeth.Size : off+aeth.Size])
		off += aeth.Size
	}
	if hs&bth.HdrAtomicAckETH != 0 {
		p.AtomicAck = aeth.AtomicAck(b[off : off+aeth.AtomicAckSize : off+aeth.AtomicAckSize])
		off += aeth.AtomicAckSize
	}
	if hs&bth.HdrImmDt != 0 {
		p.ImmDt = immdt.ImmDt(b[off : off+immdt.Size : off+immdt.Size])
		off += immdt.Size
	}
	if hs&bth.HdrIETH != 0 {
		p.IETH = immdt.IETH(b[off : off+immdt.IETHSize : off+immdt.IETHSize])
		off += immdt.IETHSize
	}
	if hs&bth.HdrCNPPad != 0 {
		off += bth.CNPPadSize
	}
	return off
}

// Fields holds everything Build needs to write a packet. Only the headers the
// opcode carries are used; the others are ignored.
type Fields struct {
	// BTH is written as given except PadCount, which Build computes from
	// len(Payload).
	BTH bth.Fields
	// RETH is used by WRITE first/only and READ request opcodes.
	RETH reth.Fields
	// AETH is used by READ response first/last/only, ACK and ATOMIC ACK.
	AETH aeth.Fields
	// AtomicETH is used by COMPARE_SWAP and FETCH_ADD.
	AtomicETH atomiceth.Fields
	// AtomicAckOrig is the original data of an ATOMIC ACK.
	AtomicAckOrig uint64
	// Imm is the immediate data of *_WITH_IMMEDIATE opcodes.
	Imm uint32
	// IETHRKey is the R_Key to invalidate of *_WITH_INVALIDATE opcodes.
	IETHRKey uint32
	// DETH is used by UD opcodes.
	DETH deth.Fields
	// FETH is the flush extended transport header of an RC FLUSH.
	FETH uint32
	// Payload is copied after the headers; it must be empty for opcodes that
	// carry none.
	Payload []byte
}

// Fields returns the Fields that Build turns back into p's bytes (except the
// ICRC, which Build leaves zero). Payload aliases p.Payload.
func (p *Packet) Fields() Fields {
	var f Fields
	if p.BTH == nil {
		return f
	}
	f.BTH = p.BTH.Fields()
	if p.RETH != nil {
		f.RETH = p.RETH.Fields()
	}
	if p.AETH != nil {
		f.AETH = p.AETH.Fields()
	}
	if p.AtomicETH != nil {
		f.AtomicETH = p.AtomicETH.Fields()
	}
	if p.AtomicAck != nil {
		f.AtomicAckOrig = p.AtomicAck.OrigData()
	}
	if p.ImmDt != nil {
		f.Imm = p.ImmDt.Imm()
	}
	if p.IETH != nil {
		f.IETHRKey = p.IETH.RKey()
	}
	if p.DETH != nil {
		f.DETH = p.DETH.Fields()
	}
	if p.FETH != nil {
		f.FETH = binary.BigEndian.Uint32(p.FETH)
	}
	f.Payload = p.Payload
	return f
}

// Len returns the length of a packet with opcode op and payloadLen bytes of
// payload: BTH + extension headers + payload + pad + ICRC. For an undefined
// opcode it counts no extension headers.
func Len(op bth.Opcode, payloadLen int) int {
	return bth.Size + infos[op].HeaderLen + payloadLen + bth.PadFor(payloadLen) + ICRCSize
}

// Build writes the packet described by f into buf: the BTH (with PadCount
// computed from len(f.Payload)), the opcode's extension headers in wire
// order, the payload, zero pad bytes and a zero ICRC placeholder. It returns
// the packet length. It fails, writing nothing, if the opcode is undefined,
// if the opcode carries no payload but f.Payload is not empty, or if buf is
// shorter than Len(op, len(f.Payload)).
func Build(buf []byte, f *Fields) (int, error) {
	return buildPacket(buf, f, len(f.Payload), true)
}

// BuildSplit is Build for a packet whose payload stays where it is (a
// zero-copy send, udp.Packet.Payload): it writes the packet without its
// payloadLen payload bytes — the headers (PadCnt computed from
// payloadLen), then the zero pad bytes and the zero ICRC placeholder —
// and returns that length, Len(op, payloadLen) - payloadLen. The payload
// belongs between the headers and the pad. f.Payload is ignored.
func BuildSplit(buf []byte, f *Fields, payloadLen int) (int, error) {
	return buildPacket(buf, f, payloadLen, false)
}

// buildPacket is Build (withPayload: f.Payload copied in) and BuildSplit
// (payloadLen bytes left out).
func buildPacket(buf []byte, f *Fields, payloadLen int, withPayload bool) (int, error) {
	op := f.BTH.Opcode
	info := &infos[op]
	if !info.Valid {
		return 0, fmt.Errorf("%w: cannot build opcode 0x%02x", ErrUnknownOpcode, uint8(op))
	}
	if !info.Payload && payloadLen != 0 && !(withPayload && op == bth.RCAck && aeth.IsSACK(f.Payload)) {
		return 0, fmt.Errorf("%w: %v carries no payload, got %d bytes", ErrUnexpectedPayload, op, payloadLen)
	}
	if payloadLen < 0 {
		return 0, fmt.Errorf("%w: payload length %d", ErrShortBuffer, payloadLen)
	}
	pad := bth.PadFor(payloadLen)
	n := bth.Size + info.HeaderLen + payloadLen + pad + ICRCSize
	if !withPayload {
		n -= payloadLen
	}
	if len(buf) < n {
		return 0, fmt.Errorf("%w: %v packet with %d bytes of payload needs %d bytes, have %d",
			ErrShortBuffer, op, payloadLen, n, len(buf))
	}
	buf = buf[:n]
	h := bth.BTH(buf[:bth.Size])
	h.Encode(&f.BTH)
	h.SetPadCount(pad)
	off := bth.Size
	switch hs := info.Headers; hs {
	case 0:
	case bth.HdrAETH: // ACK, READ response first/last/only
		aeth.AETH(buf[off:]).Encode(&f.AETH)
		off += aeth.Size
	default:
		off = encodeHeaders(buf, off, hs, f)
	}
	if pl := f.Payload; withPayload && len(pl) != 0 {
		if k := len(pl); k >= 8 && k <= 16 {
			// A short payload (an 8-byte SEND, an atomic write) as two
			// overlapping 8-byte moves instead of a call to memmove;
			// both loads come before the stores, as copy allows
			// overlapping buffers.
			d := buf[off : off+k]
			a, z := binary.LittleEndian.Uint64(pl), binary.LittleEndian.Uint64(pl[k-8:])
			binary.LittleEndian.PutUint64(d, a)
			binary.LittleEndian.PutUint64(d[k-8:], z)
		} else {
			copy(buf[off:], pl)
		}
		off += len(pl)
	}
	// Pad and ICRC placeholder: n-off is pad+ICRCSize, 4 to 7 bytes, which
	// two 4-byte stores cover.
	binary.LittleEndian.PutUint32(buf[off:], 0)
	binary.LittleEndian.PutUint32(buf[n-ICRCSize:], 0)
	return n, nil
}

// encodeHeaders writes the extension headers hs of f into buf from off on,
// in wire order, and returns where they end (buildPacket checked that
// they fit).
func encodeHeaders(buf []byte, off int, hs bth.Header, f *Fields) int {
	if hs&bth.HdrRDETH != 0 {
		clear(buf[off : off+bth.RDETHSize])
		off += bth.RDETHSize
	}
	if hs&bth.HdrDETH != 0 {
		deth.DETH(buf[off:]).Encode(&f.DETH)
		off += deth.Size
	}
	if hs&bth.HdrFETH != 0 {
		binary.BigEndian.PutUint32(buf[off:], f.FETH)
		off += bth.FETHSize
	}
	if hs&bth.HdrRETH != 0 {
		reth.RETH(buf[off:]).Encode(&f.RETH)
		off += reth.Size
	}
	if hs&bth.HdrAtomicETH != 0 {
		atomiceth.AtomicETH(buf[off:]).Encode(&f.AtomicETH)
		off += atomiceth.Size
	}
	if hs&bth.HdrAETH != 0 {
		aeth.AETH(buf[off:]).Encode(&f.AETH)
		off += aeth.Size
	}
	if hs&bth.HdrAtomicAckETH != 0 {
		aeth.AtomicAck(buf[off:]).SetOrigData(f.AtomicAckOrig)
		off += aeth.AtomicAckSize
	}
	if hs&bth.HdrImmDt != 0 {
		immdt.ImmDt(buf[off:]).SetImm(f.Imm)
		off += immdt.Size
	}
	if hs&bth.HdrIETH != 0 {
		immdt.IETH(buf[off:]).SetRKey(f.IETHRKey)
		off += immdt.IETHSize
	}
	if hs&bth.HdrCNPPad != 0 {
		clear(buf[off : off+bth.CNPPadSize])
		off += bth.CNPPadSize
	}
	return off
}
