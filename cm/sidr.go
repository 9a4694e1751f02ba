package cm

// Private data and information lengths of the SIDR messages.
const (
	SIDRREQPrivateDataSize = 216
	SIDRREPPrivateDataSize = 136
	SIDRREPInfoSize        = 72 // additional information
)

// Body offsets of SIDR_REQ (table 119) and SIDR_REP (table 120).
const (
	sidrReqRequestIDOff = 0
	sidrReqPKeyOff      = 4 // then 2 reserved bytes
	sidrReqServiceIDOff = 8
	sidrReqPrivOff      = 16

	sidrRepRequestIDOff = 0
	sidrRepStatusOff    = 4
	sidrRepInfoLenOff   = 5
	sidrRepVendorHOff   = 6 // ECE vendor ID bits 23..8
	sidrRepQPNOff       = 8 // 24 bits
	sidrRepVendorLOff   = 11
	sidrRepServiceIDOff = 12
	sidrRepQKeyOff      = 20
	sidrRepInfoOff      = 24
	sidrRepPrivOff      = 96
)

// SIDRREQ is a view of the body of a service ID resolution request:
// DataSize bytes.
type SIDRREQ []byte

// SIDRREQFields holds every field of a SIDR_REQ.
type SIDRREQFields struct {
	// RequestID is the sender's ID for the request, echoed in the
	// SIDR_REP.
	RequestID uint32
	// PKey is the partition key of the datagram service.
	PKey uint16
	// ServiceID names the service; see ServiceID for rdma_cm's.
	ServiceID uint64
	// PrivateData is the consumer's private data; rdma_cm starts it with a
	// CMAHeader.
	PrivateData [SIDRREQPrivateDataSize]byte
}

// AttributeID returns AttrSIDRREQ.
func (*SIDRREQFields) AttributeID() AttrID { return AttrSIDRREQ }

// Decode fills f from a SIDR_REQ body of at least DataSize bytes.
func (f *SIDRREQFields) Decode(body []byte) error {
	if err := need("SIDR_REQ", body, DataSize); err != nil {
		return err
	}
	*f = SIDRREQ(body).Fields()
	return nil
}

func (f *SIDRREQFields) encode(body []byte) { SIDRREQ(body).Encode(f) }

// RequestID returns the request ID.
func (s SIDRREQ) RequestID() uint32 { return be32(s[sidrReqRequestIDOff:]) }

// SetRequestID sets the request ID.
func (s SIDRREQ) SetRequestID(v uint32) { put32(s[sidrReqRequestIDOff:], v) }

// PKey returns the partition key.
func (s SIDRREQ) PKey() uint16 { return be16(s[sidrReqPKeyOff:]) }

// SetPKey sets the partition key.
func (s SIDRREQ) SetPKey(v uint16) { put16(s[sidrReqPKeyOff:], v) }

// ServiceID returns the service ID.
func (s SIDRREQ) ServiceID() uint64 { return be64(s[sidrReqServiceIDOff:]) }

// SetServiceID sets the service ID.
func (s SIDRREQ) SetServiceID(v uint64) { put64(s[sidrReqServiceIDOff:], v) }

// PrivateData returns the SIDRREQPrivateDataSize bytes of private data.
func (s SIDRREQ) PrivateData() []byte {
	return s[sidrReqPrivOff : sidrReqPrivOff+SIDRREQPrivateDataSize : sidrReqPrivOff+SIDRREQPrivateDataSize]
}

// Check returns nil: a SIDR_REQ has no field to refuse.
func (s SIDRREQ) Check() error { _ = s[DataSize-1]; return nil }

// Fields decodes every field.
func (s SIDRREQ) Fields() SIDRREQFields {
	_ = s[DataSize-1]
	f := SIDRREQFields{RequestID: s.RequestID(), PKey: s.PKey(), ServiceID: s.ServiceID()}
	copy(f.PrivateData[:], s.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the SIDR_REQ from f; the reserved
// bytes are zero.
func (s SIDRREQ) Encode(f *SIDRREQFields) {
	_ = s[DataSize-1]
	s.SetRequestID(f.RequestID)
	s.SetPKey(f.PKey)
	s[sidrReqPKeyOff+2], s[sidrReqPKeyOff+3] = 0, 0
	s.SetServiceID(f.ServiceID)
	copy(s.PrivateData(), f.PrivateData[:])
}

// SIDRREP is a view of the body of a service ID resolution reply:
// DataSize bytes.
type SIDRREP []byte

// SIDRREPFields holds every field of a SIDR_REP.
type SIDRREPFields struct {
	// RequestID is the SIDR_REQ's RequestID.
	RequestID uint32
	// Status is the outcome; QPN and QKey are meaningful on SIDRSuccess.
	Status SIDRStatus
	// AdditionalInfoLength is how many bytes of AdditionalInfo are
	// meaningful (at most SIDRREPInfoSize).
	AdditionalInfoLength uint8
	// VendorID is the 24-bit ECE vendor ID; 0 without ECE.
	VendorID uint32
	// QPN is the 24-bit QP number of the service.
	QPN uint32
	// ServiceID is the service ID resolved.
	ServiceID uint64
	// QKey is the Q_Key of the service's QP.
	QKey uint32
	// AdditionalInfo is the additional information (a redirection's
	// ClassPortInfo, for instance).
	AdditionalInfo [SIDRREPInfoSize]byte
	// PrivateData is the consumer's private data.
	PrivateData [SIDRREPPrivateDataSize]byte
}

// AttributeID returns AttrSIDRREP.
func (*SIDRREPFields) AttributeID() AttrID { return AttrSIDRREP }

// Decode fills f from a SIDR_REP body of at least DataSize bytes,
// validated by SIDRREP.Check.
func (f *SIDRREPFields) Decode(body []byte) error {
	if err := need("SIDR_REP", body, DataSize); err != nil {
		return err
	}
	s := SIDRREP(body)
	if err := s.Check(); err != nil {
		return err
	}
	*f = s.Fields()
	return nil
}

func (f *SIDRREPFields) encode(body []byte) { SIDRREP(body).Encode(f) }

// RequestID returns the request ID.
func (s SIDRREP) RequestID() uint32 { return be32(s[sidrRepRequestIDOff:]) }

// SetRequestID sets the request ID.
func (s SIDRREP) SetRequestID(v uint32) { put32(s[sidrRepRequestIDOff:], v) }

// Status returns the status.
func (s SIDRREP) Status() SIDRStatus { return SIDRStatus(s[sidrRepStatusOff]) }

// SetStatus sets the status.
func (s SIDRREP) SetStatus(v SIDRStatus) { s[sidrRepStatusOff] = byte(v) }

// AdditionalInfoLength returns the additional information length.
func (s SIDRREP) AdditionalInfoLength() uint8 { return s[sidrRepInfoLenOff] }

// SetAdditionalInfoLength sets the additional information length.
func (s SIDRREP) SetAdditionalInfoLength(v uint8) { s[sidrRepInfoLenOff] = v }

// VendorID returns the 24-bit ECE vendor ID.
func (s SIDRREP) VendorID() uint32 {
	return uint32(be16(s[sidrRepVendorHOff:]))<<8 | uint32(s[sidrRepVendorLOff])
}

// SetVendorID sets the ECE vendor ID; only the low 24 bits are used.
func (s SIDRREP) SetVendorID(v uint32) {
	put16(s[sidrRepVendorHOff:], uint16(v>>8))
	s[sidrRepVendorLOff] = byte(v)
}

// QPN returns the 24-bit QP number.
func (s SIDRREP) QPN() uint32 { return get24(s[sidrRepQPNOff:]) }

// SetQPN sets the QP number; only the low 24 bits are used.
func (s SIDRREP) SetQPN(v uint32) { put24(s[sidrRepQPNOff:], v) }

// ServiceID returns the service ID.
func (s SIDRREP) ServiceID() uint64 { return be64(s[sidrRepServiceIDOff:]) }

// SetServiceID sets the service ID.
func (s SIDRREP) SetServiceID(v uint64) { put64(s[sidrRepServiceIDOff:], v) }

// QKey returns the Q_Key.
func (s SIDRREP) QKey() uint32 { return be32(s[sidrRepQKeyOff:]) }

// SetQKey sets the Q_Key.
func (s SIDRREP) SetQKey(v uint32) { put32(s[sidrRepQKeyOff:], v) }

// AdditionalInfo returns the SIDRREPInfoSize bytes of additional
// information.
func (s SIDRREP) AdditionalInfo() []byte {
	return s[sidrRepInfoOff : sidrRepInfoOff+SIDRREPInfoSize : sidrRepInfoOff+SIDRREPInfoSize]
}

// PrivateData returns the SIDRREPPrivateDataSize bytes of private data.
func (s SIDRREP) PrivateData() []byte {
	return s[sidrRepPrivOff : sidrRepPrivOff+SIDRREPPrivateDataSize : sidrRepPrivOff+SIDRREPPrivateDataSize]
}

// Check reports an additional information length above SIDRREPInfoSize.
// Unknown status codes are left to the caller.
func (s SIDRREP) Check() error {
	_ = s[DataSize-1]
	if n := s.AdditionalInfoLength(); n > SIDRREPInfoSize {
		return &Error{Msg: "SIDR_REP", Field: "additional information length", Value: uint64(n), Err: ErrLength}
	}
	return nil
}

// Fields decodes every field; it does not Check.
func (s SIDRREP) Fields() SIDRREPFields {
	_ = s[DataSize-1]
	f := SIDRREPFields{
		RequestID:            s.RequestID(),
		Status:               s.Status(),
		AdditionalInfoLength: s.AdditionalInfoLength(),
		VendorID:             s.VendorID(),
		QPN:                  s.QPN(),
		ServiceID:            s.ServiceID(),
		QKey:                 s.QKey(),
	}
	copy(f.AdditionalInfo[:], s.AdditionalInfo())
	copy(f.PrivateData[:], s.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the SIDR_REP from f; values are
// masked to their fields' widths.
func (s SIDRREP) Encode(f *SIDRREPFields) {
	_ = s[DataSize-1]
	s.SetRequestID(f.RequestID)
	s.SetStatus(f.Status)
	s.SetAdditionalInfoLength(f.AdditionalInfoLength)
	s.SetQPN(f.QPN)
	s.SetVendorID(f.VendorID)
	s.SetServiceID(f.ServiceID)
	s.SetQKey(f.QKey)
	copy(s.AdditionalInfo(), f.AdditionalInfo[:])
	copy(s.PrivateData(), f.PrivateData[:])
}
