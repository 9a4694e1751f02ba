package cm

import (
	"encoding/binary"
	"fmt"
)

// Sizes of a MAD and its parts.
const (
	// MADSize is the length of every MAD of the CM class: the UD payload
	// to and from QP1.
	MADSize = 256
	// HeaderSize is the length of the MAD common header.
	HeaderSize = 24
	// DataSize is the length of the data after the common header: the body
	// of every CM message.
	DataSize = MADSize - HeaderSize
)

// Values of the MAD common header for the Communication Manager.
const (
	// BaseVersion is the only MAD base version (IBTA vol. 1 §13.4.2).
	BaseVersion = 1
	// ClassCM is the management class of the Communication Manager.
	ClassCM = 0x07
	// ClassVersionCM is the CM class version of IBTA 1.2 and later, the one
	// Linux speaks.
	ClassVersionCM = 2
)

// QP1 is the queue pair number of the General Services Interface, to which
// CM MADs are sent, and QP1QKey the well-known Q_Key they carry in the DETH.
const (
	QP1     = 1
	QP1QKey = 0x80010000
)

// Method is the R|Method byte of a MAD header: bit 7 is the response bit.
type Method uint8

// MAD methods (IBTA vol. 1 §13.4.5). CM messages are all MethodSend;
// ClassPortInfo is read with MethodGet and answered with MethodGetResp.
const (
	MethodGet         Method = 0x01
	MethodSet         Method = 0x02
	MethodSend        Method = 0x03
	MethodTrap        Method = 0x05
	MethodReport      Method = 0x06
	MethodTrapRepress Method = 0x07
	MethodGetResp     Method = 0x81
	MethodReportResp  Method = 0x86

	// MethodResponse is the response bit (R) of the method byte.
	MethodResponse Method = 0x80
)

// IsResponse reports whether the response bit is set.
func (m Method) IsResponse() bool { return m&MethodResponse != 0 }

// String returns the method's name, e.g. "Send" or "GetResp".
func (m Method) String() string {
	switch m {
	case MethodGet:
		return "Get"
	case MethodSet:
		return "Set"
	case MethodSend:
		return "Send"
	case MethodTrap:
		return "Trap"
	case MethodReport:
		return "Report"
	case MethodTrapRepress:
		return "TrapRepress"
	case MethodGetResp:
		return "GetResp"
	case MethodReportResp:
		return "ReportResp"
	}
	return fmt.Sprintf("Method(%#02x)", uint8(m))
}

// MAD status codes (IBTA vol. 1 §13.4.7): bits 0 and 1 are flags, bits 2..4
// a code for an invalid field.
const (
	StatusBusy                  = 0x0001
	StatusRedirect              = 0x0002
	StatusBadVersion            = 0x0004
	StatusMethodUnsupported     = 0x0008
	StatusMethodAttrUnsupported = 0x000c
	StatusInvalidAttrValue      = 0x001c
)

// AttrID is the attribute ID of a MAD header; for the CM class it names the
// message.
type AttrID uint16

// Attribute IDs of the CM class (IBTA vol. 1 §12.6).
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRREQ       AttrID = 0x0017
	AttrSIDRREP       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001a
)

var attrNames = [...]string{
	AttrREQ - AttrREQ:     "REQ",
	AttrMRA - AttrREQ:     "MRA",
	AttrREJ - AttrREQ:     "REJ",
	AttrREP - AttrREQ:     "REP",
	AttrRTU - AttrREQ:     "RTU",
	AttrDREQ - AttrREQ:    "DREQ",
	AttrDREP - AttrREQ:    "DREP",
	AttrSIDRREQ - AttrREQ: "SIDR_REQ",
	AttrSIDRREP - AttrREQ: "SIDR_REP",
	AttrLAP - AttrREQ:     "LAP",
	AttrAPR - AttrREQ:     "APR",
}

// String returns the attribute's name as IBTA spells it ("REQ",
// "SIDR_REQ", "ClassPortInfo"), or its hex value.
func (a AttrID) String() string {
	if a == AttrClassPortInfo {
		return "ClassPortInfo"
	}
	if a >= AttrREQ && a <= AttrAPR {
		return attrNames[a-AttrREQ]
	}
	return fmt.Sprintf("AttrID(%#04x)", uint16(a))
}

// IsMessage reports whether a is the attribute of a CM message (REQ
// through APR), one that Decode knows.
func (a AttrID) IsMessage() bool { return a >= AttrREQ && a <= AttrAPR }

// Offsets in the MAD common header.
const (
	baseVersionOff  = 0
	mgmtClassOff    = 1
	classVersionOff = 2
	methodOff       = 3
	statusOff       = 4
	classSpecOff    = 6
	tidOff          = 8
	attrIDOff       = 16
	attrResvOff     = 18 // 2 reserved bytes
	attrModOff      = 20
)

// MAD is a view of a management datagram: the 24-byte common header
// followed by DataSize bytes of class data. The caller guarantees
// len >= MADSize for Data and Encode, len >= HeaderSize for the header
// accessors; ParseMAD checks it.
type MAD []byte

// HeaderFields holds every field of the MAD common header.
type HeaderFields struct {
	// BaseVersion is the MAD format version, 1.
	BaseVersion uint8
	// MgmtClass is the management class, ClassCM for the CM.
	MgmtClass uint8
	// ClassVersion is the version of the class, ClassVersionCM.
	ClassVersion uint8
	// Method is the R|Method byte.
	Method Method
	// Status is the MAD status (0 in requests and CM messages).
	Status uint16
	// ClassSpecific is the class-specific status word (0 for the CM).
	ClassSpecific uint16
	// TransactionID identifies a request and its response; Linux's CM
	// keeps one per connection for REQ, REP and RTU.
	TransactionID uint64
	// AttributeID names the CM message.
	AttributeID AttrID
	// AttributeModifier is 0 for the CM except in Linux's ECE extension,
	// where REQ and REP carry the ECE options here.
	AttributeModifier uint32
}

// NewHeader returns the header of a CM message: base version 1, class CM
// version 2, method Send, status 0, the given attribute and transaction ID.
func NewHeader(attr AttrID, tid uint64) HeaderFields {
	return HeaderFields{
		BaseVersion:   BaseVersion,
		MgmtClass:     ClassCM,
		ClassVersion:  ClassVersionCM,
		Method:        MethodSend,
		TransactionID: tid,
		AttributeID:   attr,
	}
}

// BaseVersion returns the MAD base version.
func (m MAD) BaseVersion() uint8 { return m[baseVersionOff] }

// SetBaseVersion sets the MAD base version.
func (m MAD) SetBaseVersion(v uint8) { m[baseVersionOff] = v }

// MgmtClass returns the management class.
func (m MAD) MgmtClass() uint8 { return m[mgmtClassOff] }

// SetMgmtClass sets the management class.
func (m MAD) SetMgmtClass(v uint8) { m[mgmtClassOff] = v }

// ClassVersion returns the class version.
func (m MAD) ClassVersion() uint8 { return m[classVersionOff] }

// SetClassVersion sets the class version.
func (m MAD) SetClassVersion(v uint8) { m[classVersionOff] = v }

// Method returns the R|Method byte.
func (m MAD) Method() Method { return Method(m[methodOff]) }

// SetMethod sets the R|Method byte.
func (m MAD) SetMethod(v Method) { m[methodOff] = byte(v) }

// Status returns the MAD status.
func (m MAD) Status() uint16 { return binary.BigEndian.Uint16(m[statusOff:]) }

// SetStatus sets the MAD status.
func (m MAD) SetStatus(v uint16) { binary.BigEndian.PutUint16(m[statusOff:], v) }

// ClassSpecific returns the class-specific status word.
func (m MAD) ClassSpecific() uint16 { return binary.BigEndian.Uint16(m[classSpecOff:]) }

// SetClassSpecific sets the class-specific status word.
func (m MAD) SetClassSpecific(v uint16) { binary.BigEndian.PutUint16(m[classSpecOff:], v) }

// TransactionID returns the 64-bit transaction ID.
func (m MAD) TransactionID() uint64 { return binary.BigEndian.Uint64(m[tidOff:]) }

// SetTransactionID sets the transaction ID.
func (m MAD) SetTransactionID(v uint64) { binary.BigEndian.PutUint64(m[tidOff:], v) }

// AttributeID returns the attribute ID.
func (m MAD) AttributeID() AttrID { return AttrID(binary.BigEndian.Uint16(m[attrIDOff:])) }

// SetAttributeID sets the attribute ID.
func (m MAD) SetAttributeID(v AttrID) { binary.BigEndian.PutUint16(m[attrIDOff:], uint16(v)) }

// AttributeModifier returns the attribute modifier.
func (m MAD) AttributeModifier() uint32 { return binary.BigEndian.Uint32(m[attrModOff:]) }

// SetAttributeModifier sets the attribute modifier.
func (m MAD) SetAttributeModifier(v uint32) { binary.BigEndian.PutUint32(m[attrModOff:], v) }

// Data returns the DataSize bytes after the header: the body of a CM
// message, to be viewed as REQ, REP, ...
func (m MAD) Data() []byte { return m[HeaderSize:MADSize:MADSize] }

// Header decodes every header field.
func (m MAD) Header() HeaderFields {
	_ = m[HeaderSize-1]
	return HeaderFields{
		BaseVersion:       m.BaseVersion(),
		MgmtClass:         m.MgmtClass(),
		ClassVersion:      m.ClassVersion(),
		Method:            m.Method(),
		Status:            m.Status(),
		ClassSpecific:     m.ClassSpecific(),
		TransactionID:     m.TransactionID(),
		AttributeID:       m.AttributeID(),
		AttributeModifier: m.AttributeModifier(),
	}
}

// EncodeHeader writes all HeaderSize bytes of the header from h; the
// reserved bytes are zero. The data is not touched.
func (m MAD) EncodeHeader(h *HeaderFields) {
	_ = m[HeaderSize-1]
	m.SetBaseVersion(h.BaseVersion)
	m.SetMgmtClass(h.MgmtClass)
	m.SetClassVersion(h.ClassVersion)
	m.SetMethod(h.Method)
	m.SetStatus(h.Status)
	m.SetClassSpecific(h.ClassSpecific)
	m.SetTransactionID(h.TransactionID)
	m.SetAttributeID(h.AttributeID)
	m[attrResvOff], m[attrResvOff+1] = 0, 0
	m.SetAttributeModifier(h.AttributeModifier)
}

// ParseMAD returns b as a MAD after checking what every CM MAD must be:
// exactly MADSize bytes, base version 1, management class CM, class
// version 2. The attribute and method are checked by Decode.
func ParseMAD(b []byte) (MAD, error) {
	if len(b) < MADSize {
		return nil, &Error{Msg: "MAD", Field: "length", Value: uint64(len(b)), Err: ErrTruncated}
	}
	if len(b) > MADSize {
		return nil, &Error{Msg: "MAD", Field: "length", Value: uint64(len(b)), Err: ErrLength}
	}
	m := MAD(b)
	if v := m.BaseVersion(); v != BaseVersion {
		return nil, &Error{Msg: "MAD", Field: "base version", Value: uint64(v), Err: ErrUnsupported}
	}
	if v := m.MgmtClass(); v != ClassCM {
		return nil, &Error{Msg: "MAD", Field: "management class", Value: uint64(v), Err: ErrUnsupported}
	}
	if v := m.ClassVersion(); v != ClassVersionCM {
		return nil, &Error{Msg: "MAD", Field: "class version", Value: uint64(v), Err: ErrUnsupported}
	}
	return m, nil
}
