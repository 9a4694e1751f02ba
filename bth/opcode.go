package bth

// Opcode is the 8-bit BTH opcode: transport<<5 | operation.
type Opcode uint8

// RC (reliable connection) opcodes.
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0a
	RCWriteOnlyImm       Opcode = 0x0b
	RCReadRequest        Opcode = 0x0c
	RCReadResponseFirst  Opcode = 0x0d
	RCReadResponseMiddle Opcode = 0x0e
	RCReadResponseLast   Opcode = 0x0f
	RCReadResponseOnly   Opcode = 0x10
	RCAck                Opcode = 0x11
	RCAtomicAck          Opcode = 0x12
	RCCompareSwap        Opcode = 0x13
	RCFetchAdd           Opcode = 0x14
	RCSendLastInv        Opcode = 0x16
	RCSendOnlyInv        Opcode = 0x17
	// RCFlush (IBTA 1.5, Linux IB_OPCODE_FLUSH) asks the responder to make
	// memory persistent or visible: BTH, FETH and RETH, no payload.
	RCFlush Opcode = 0x1c
	// RCAtomicWrite (IBTA 1.5, Linux IB_OPCODE_ATOMIC_WRITE) writes 8
	// bytes atomically: BTH, RETH and an 8-byte payload.
	RCAtomicWrite Opcode = 0x1d
)

// UC (unreliable connection) opcodes.
const (
	UCSendFirst    Opcode = 0x20
	UCSendMiddle   Opcode = 0x21
	UCSendLast     Opcode = 0x22
	UCSendLastImm  Opcode = 0x23
	UCSendOnly     Opcode = 0x24
	UCSendOnlyImm  Opcode = 0x25
	UCWriteFirst   Opcode = 0x26
	UCWriteMiddle  Opcode = 0x27
	UCWriteLast    Opcode = 0x28
	UCWriteLastImm Opcode = 0x29
	UCWriteOnly    Opcode = 0x2a
	UCWriteOnlyImm Opcode = 0x2b
)

// UD (unreliable datagram) opcodes.
const (
	UDSendOnly    Opcode = 0x64
	UDSendOnlyImm Opcode = 0x65
)

// CNP is the RoCEv2 congestion notification packet opcode.
const CNP Opcode = 0x81

// Transport is the transport service encoded in the top three bits of an opcode.
type Transport uint8

// Transport services (opcode & 0xe0).
const (
	TransportRC  Transport = 0x00
	TransportUC  Transport = 0x20
	TransportRD  Transport = 0x40
	TransportUD  Transport = 0x60
	TransportCNP Transport = 0x80
	TransportXRC Transport = 0xa0
)

// String returns "RC", "UC", "RD", "UD", "CNP", "XRC" or "TRANSPORT_0x..".
func (t Transport) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportUD:
		return "UD"
	case TransportCNP:
		return "CNP"
	case TransportXRC:
		return "XRC"
	}
	return "TRANSPORT_0x" + hex2(uint8(t))
}

// Transport returns the transport bits of o (o & 0xe0).
func (o Opcode) Transport() Transport { return Transport(o & 0xe0) }

// Kind classifies an opcode by the operation it belongs to.
type Kind uint8

// Operation kinds. KindInvalid is the kind of undefined opcodes.
const (
	KindInvalid Kind = iota
	KindSend
	KindWrite
	KindReadRequest
	KindReadResponse
	KindAck
	KindAtomicAck
	KindCompareSwap
	KindFetchAdd
	KindCNP
	KindFlush       // RC FLUSH (IBTA 1.5); decoded, not executed
	KindAtomicWrite // RC ATOMIC_WRITE (IBTA 1.5); decoded, not executed
)

var kindNames = [...]string{
	KindInvalid:      "INVALID",
	KindSend:         "SEND",
	KindWrite:        "RDMA_WRITE",
	KindReadRequest:  "RDMA_READ_REQUEST",
	KindReadResponse: "RDMA_READ_RESPONSE",
	KindAck:          "ACKNOWLEDGE",
	KindAtomicAck:    "ATOMIC_ACKNOWLEDGE",
	KindCompareSwap:  "COMPARE_SWAP",
	KindFetchAdd:     "FETCH_ADD",
	KindCNP:          "CNP",
	KindFlush:        "FLUSH",
	KindAtomicWrite:  "ATOMIC_WRITE",
}

// String returns the kind's name, e.g. "SEND" or "RDMA_WRITE".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "KIND_0x" + hex2(uint8(k))
}

// Position is the place of a packet within its message.
type Position uint8

// Packet positions. Single-packet opcodes (ACKs, READ requests, atomics, CNP)
// have PosOnly.
const (
	PosOnly Position = iota
	PosFirst
	PosMiddle
	PosLast
)

// String returns "ONLY", "FIRST", "MIDDLE" or "LAST".
func (p Position) String() string {
	switch p {
	case PosOnly:
		return "ONLY"
	case PosFirst:
		return "FIRST"
	case PosMiddle:
		return "MIDDLE"
	case PosLast:
		return "LAST"
	}
	return "POS_0x" + hex2(uint8(p))
}

// Header is a set of extension headers that follow the BTH. The bit order of
// the constants is the wire order of the headers.
type Header uint16

// Extension headers, in wire order.
const (
	HdrRDETH        Header = 1 << iota // RD extended transport header, 4 bytes
	HdrDETH                            // datagram extended transport header, 8 bytes
	HdrFETH                            // flush extended transport header, 4 bytes (RC FLUSH)
	HdrRETH                            // RDMA extended transport header, 16 bytes
	HdrAtomicETH                       // atomic extended transport header, 28 bytes
	HdrAETH                            // ACK extended transport header, 4 bytes
	HdrAtomicAckETH                    // atomic ACK extended transport header, 8 bytes
	HdrImmDt                           // immediate data, 4 bytes
	HdrIETH                            // invalidate extended transport header, 4 bytes
	HdrCNPPad                          // the 16 reserved bytes of a RoCEv2 CNP

	numHeaders = iota
)

// Sizes in bytes of the single extension headers.
const (
	RDETHSize        = 4
	DETHSize         = 8
	FETHSize         = 4
	RETHSize         = 16
	AtomicETHSize    = 28
	AETHSize         = 4
	AtomicAckETHSize = 8
	ImmDtSize        = 4
	IETHSize         = 4
	CNPPadSize       = 16
)

var headerSizes = [numHeaders]int{
	RDETHSize, DETHSize, FETHSize, RETHSize, AtomicETHSize, AETHSize,
	AtomicAckETHSize, ImmDtSize, IETHSize, CNPPadSize,
}

var headerNames = [numHeaders]string{
	"RDETH", "DETH", "FETH", "RETH", "AtomicETH", "AETH",
	"AtomicAckETH", "ImmDt", "IETH", "CNPPad",
}

// Size returns the total number of bytes of the headers in the set.
func (h Header) Size() int {
	n := 0
	for i := 0; i < numHeaders; i++ {
		if h&(1<<i) != 0 {
			n += headerSizes[i]
		}
	}
	return n
}

// Has reports whether every header in x is in h.
func (h Header) Has(x Header) bool { return h&x == x }

// String lists the headers in wire order separated by '+', e.g. "RETH+ImmDt";
// the empty set is "none".
func (h Header) String() string {
	if h == 0 {
		return "none"
	}
	s := ""
	for i := 0; i < numHeaders; i++ {
		if h&(1<<i) != 0 {
			if s != "" {
				s += "+"
			}
			s += headerNames[i]
		}
	}
	if rest := h &^ (1<<numHeaders - 1); rest != 0 {
		if s != "" {
			s += "+"
		}
		s += "0x" + hex2(uint8(rest>>8)) + hex2(uint8(rest))
	}
	return s
}

// Info describes an opcode: which transport and operation it belongs to and
// which extension headers and payload it carries.
type Info struct {
	// Valid reports whether the opcode is defined (RC, UC, UD, CNP).
	Valid bool
	// Transport is the transport service.
	Transport Transport
	// Kind is the operation.
	Kind Kind
	// Pos is the packet's place in its message.
	Pos Position
	// Headers is the set of extension headers that follow the BTH.
	Headers Header
	// HeaderLen is Headers.Size().
	HeaderLen int
	// Payload reports whether the packet may carry payload (SEND, WRITE,
	// READ response); when false the payload must be empty.
	Payload bool
	// Imm reports whether the packet carries immediate data.
	Imm bool
	// Inv reports whether the packet carries an invalidate R_Key (IETH).
	Inv bool
	// Request reports whether the packet is sent by a requester (SEND,
	// WRITE, READ request, atomics); false for responses, ACKs and CNP.
	Request bool
}

// Info returns the table entry of o. It never allocates; undefined opcodes
// return an Info with Valid false.
func (o Opcode) Info() Info { return opcodeTable[o] }

// Valid reports whether o is a defined opcode.
func (o Opcode) Valid() bool { return opcodeTable[o].Valid }

// String returns the opcode's name as rdma-core and Wireshark spell it, e.g.
// "RC_RDMA_WRITE_FIRST"; an undefined opcode is "OPCODE_0x1f".
func (o Opcode) String() string {
	if n := opcodeNames[o]; n != "" {
		return n
	}
	return "OPCODE_0x" + hex2(uint8(o))
}

// ParseOpcode returns the opcode whose String is name.
func ParseOpcode(name string) (Opcode, bool) {
	for i := range opcodeNames {
		if opcodeNames[i] != "" && opcodeNames[i] == name {
			return Opcode(i), true
		}
	}
	return 0, false
}

func hex2(v uint8) string {
	return string([]byte{hexDigits[v>>4], hexDigits[v&0xf]})
}

func mk(t Transport, k Kind, p Position, h Header, payload, imm, inv, req bool) Info {
	return Info{
		Valid: true, Transport: t, Kind: k, Pos: p, Headers: h, HeaderLen: h.Size(),
		Payload: payload, Imm: imm, Inv: inv, Request: req,
	}
}

// opcodeTable is indexed by opcode. It is filled once at package
// initialisation and only read afterwards.
var opcodeTable [256]Info

// opcodeNames is indexed by opcode; "" means undefined.
var opcodeNames [256]string

func def(o Opcode, name string, in Info) {
	opcodeTable[o] = in
	opcodeNames[o] = name
}

func init() {
	// SEND and RDMA WRITE, shared by RC and UC (op values 0x00..0x0b).
	for _, t := range []struct {
		tr   Transport
		name string
	}{{TransportRC, "RC_"}, {TransportUC, "UC_"}} {
		b := Opcode(t.tr)
		tr := t.tr
		def(b|0x00, t.name+"SEND_FIRST", mk(tr, KindSend, PosFirst, 0, true, false, false, true))
		def(b|0x01, t.name+"SEND_MIDDLE", mk(tr, KindSend, PosMiddle, 0, true, false, false, true))
		def(b|0x02, t.name+"SEND_LAST", mk(tr, KindSend, PosLast, 0, true, false, false, true))
		def(b|0x03, t.name+"SEND_LAST_WITH_IMMEDIATE", mk(tr, KindSend, PosLast, HdrImmDt, true, true, false, true))
		def(b|0x04, t.name+"SEND_ONLY", mk(tr, KindSend, PosOnly, 0, true, false, false, true))
		def(b|0x05, t.name+"SEND_ONLY_WITH_IMMEDIATE", mk(tr, KindSend, PosOnly, HdrImmDt, true, true, false, true))
		def(b|0x06, t.name+"RDMA_WRITE_FIRST", mk(tr, KindWrite, PosFirst, HdrRETH, true, false, false, true))
		def(b|0x07, t.name+"RDMA_WRITE_MIDDLE", mk(tr, KindWrite, PosMiddle, 0, true, false, false, true))
		def(b|0x08, t.name+"RDMA_WRITE_LAST", mk(tr, KindWrite, PosLast, 0, true, false, false, true))
		def(b|0x09, t.name+"RDMA_WRITE_LAST_WITH_IMMEDIATE", mk(tr, KindWrite, PosLast, HdrImmDt, true, true, false, true))
		def(b|0x0a, t.name+"RDMA_WRITE_ONLY", mk(tr, KindWrite, PosOnly, HdrRETH, true, false, false, true))
		def(b|0x0b, t.name+"RDMA_WRITE_ONLY_WITH_IMMEDIATE", mk(tr, KindWrite, PosOnly, HdrRETH|HdrImmDt, true, true, false, true))
	}
	rc := TransportRC
	def(RCReadRequest, "RC_RDMA_READ_REQUEST", mk(rc, KindReadRequest, PosOnly, HdrRETH, false, false, false, true))
	def(RCReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", mk(rc, KindReadResponse, PosFirst, HdrAETH, true, false, false, false))
	def(RCReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", mk(rc, KindReadResponse, PosMiddle, 0, true, false, false, false))
	def(RCReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", mk(rc, KindReadResponse, PosLast, HdrAETH, true, false, false, false))
	def(RCReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", mk(rc, KindReadResponse, PosOnly, HdrAETH, true, false, false, false))
	def(RCAck, "RC_ACKNOWLEDGE", mk(rc, KindAck, PosOnly, HdrAETH, false, false, false, false))
	def(RCAtomicAck, "RC_ATOMIC_ACKNOWLEDGE", mk(rc, KindAtomicAck, PosOnly, HdrAETH|HdrAtomicAckETH, false, false, false, false))
	def(RCCompareSwap, "RC_COMPARE_SWAP", mk(rc, KindCompareSwap, PosOnly, HdrAtomicETH, false, false, false, true))
	def(RCFetchAdd, "RC_FETCH_ADD", mk(rc, KindFetchAdd, PosOnly, HdrAtomicETH, false, false, false, true))
	def(RCSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE", mk(rc, KindSend, PosLast, HdrIETH, true, false, true, true))
	def(RCSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE", mk(rc, KindSend, PosOnly, HdrIETH, true, false, true, true))
	def(RCFlush, "RC_FLUSH", mk(rc, KindFlush, PosOnly, HdrFETH|HdrRETH, false, false, false, true))
	def(RCAtomicWrite, "RC_ATOMIC_WRITE", mk(rc, KindAtomicWrite, PosOnly, HdrRETH, true, false, false, true))

	ud := TransportUD
	def(UDSendOnly, "UD_SEND_ONLY", mk(ud, KindSend, PosOnly, HdrDETH, true, false, false, true))
	def(UDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", mk(ud, KindSend, PosOnly, HdrDETH|HdrImmDt, true, true, false, true))

	def(CNP, "CNP", mk(TransportCNP, KindCNP, PosOnly, HdrCNPPad, false, false, false, false))
}
