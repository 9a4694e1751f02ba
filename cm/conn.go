package cm

// Private data and information lengths of the smaller messages.
const (
	MRAPrivateDataSize  = 222
	REJPrivateDataSize  = 148
	REJARISize          = 72 // additional rejection information
	RTUPrivateDataSize  = 224
	DREQPrivateDataSize = 220
	DREPPrivateDataSize = 224
)

// Offsets shared by the messages that start with both comm IDs.
const (
	localCommIDOff  = 0
	remoteCommIDOff = 4
)

// Body offsets of MRA (table 107), REJ (table 108), RTU (table 111), DREQ
// (table 112) and DREP (table 113).
const (
	mraOff8      = 8 // message MRAed:2, reserved:6
	mraOff9      = 9 // service timeout:5, reserved:3
	mraPrivOff   = 10
	rejOff8      = 8 // message rejected:2, reserved:6
	rejOff9      = 9 // rejected info length:7, reserved:1
	rejReasonOff = 10
	rejARIOff    = 12
	rejPrivOff   = 84
	rtuPrivOff   = 8
	dreqQPNOff   = 8 // remote QPN/EECN:24, reserved:8
	dreqPrivOff  = 12
	drepPrivOff  = 8
)

func commIDs(b []byte) (local, remote uint32) {
	return be32(b[localCommIDOff:]), be32(b[remoteCommIDOff:])
}

// MRA is a view of the body of a message receipt acknowledgement:
// DataSize bytes.
type MRA []byte

// MRAFields holds every field of an MRA.
type MRAFields struct {
	// LocalCommID is the sender's communication ID.
	LocalCommID uint32
	// RemoteCommID is the receiver's communication ID (for an MRA of a
	// REQ, the REQ's LocalCommID).
	RemoteCommID uint32
	// MessageMRAed is the message acknowledged: KindREQ, KindREP or
	// KindOther (a LAP).
	MessageMRAed MsgKind
	// ServiceTimeout is the 5-bit exponent (Timeout) of how much longer
	// the sender needs before it answers.
	ServiceTimeout uint8
	// PrivateData is the consumer's private data.
	PrivateData [MRAPrivateDataSize]byte
}

// AttributeID returns AttrMRA.
func (*MRAFields) AttributeID() AttrID { return AttrMRA }

// Decode fills f from an MRA body of at least DataSize bytes, validated by
// MRA.Check.
func (f *MRAFields) Decode(body []byte) error {
	if err := need("MRA", body, DataSize); err != nil {
		return err
	}
	m := MRA(body)
	if err := m.Check(); err != nil {
		return err
	}
	*f = m.Fields()
	return nil
}

func (f *MRAFields) encode(body []byte) { MRA(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (m MRA) LocalCommID() uint32 { return be32(m[localCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (m MRA) SetLocalCommID(v uint32) { put32(m[localCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (m MRA) RemoteCommID() uint32 { return be32(m[remoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (m MRA) SetRemoteCommID(v uint32) { put32(m[remoteCommIDOff:], v) }

// MessageMRAed returns the 2-bit kind of message acknowledged.
func (m MRA) MessageMRAed() MsgKind { return MsgKind(getBits(m[mraOff8], 6, mask2)) }

// SetMessageMRAed sets the kind of message acknowledged; only the low 2
// bits are used.
func (m MRA) SetMessageMRAed(v MsgKind) { setBits(&m[mraOff8], 6, mask2, uint8(v)) }

// ServiceTimeout returns the 5-bit service timeout.
func (m MRA) ServiceTimeout() uint8 { return getBits(m[mraOff9], 3, mask5) }

// SetServiceTimeout sets the service timeout; only the low 5 bits are used.
func (m MRA) SetServiceTimeout(v uint8) { setBits(&m[mraOff9], 3, mask5, v) }

// PrivateData returns the MRAPrivateDataSize bytes of private data.
func (m MRA) PrivateData() []byte {
	return m[mraPrivOff : mraPrivOff+MRAPrivateDataSize : mraPrivOff+MRAPrivateDataSize]
}

// Check reports a reserved message MRAed code (3).
func (m MRA) Check() error {
	_ = m[DataSize-1]
	if k := m.MessageMRAed(); k > KindOther {
		return &Error{Msg: "MRA", Field: "message MRAed", Value: uint64(k), Err: ErrReserved}
	}
	return nil
}

// Fields decodes every field; it does not Check.
func (m MRA) Fields() MRAFields {
	_ = m[DataSize-1]
	f := MRAFields{MessageMRAed: m.MessageMRAed(), ServiceTimeout: m.ServiceTimeout()}
	f.LocalCommID, f.RemoteCommID = commIDs(m)
	copy(f.PrivateData[:], m.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the MRA from f; reserved bits are
// zero and values are masked to their fields' widths.
func (m MRA) Encode(f *MRAFields) {
	_ = m[DataSize-1]
	clear232(m)
	m.SetLocalCommID(f.LocalCommID)
	m.SetRemoteCommID(f.RemoteCommID)
	m.SetMessageMRAed(f.MessageMRAed)
	m.SetServiceTimeout(f.ServiceTimeout)
	copy(m.PrivateData(), f.PrivateData[:])
}

// REJ is a view of the body of a reject: DataSize bytes.
type REJ []byte

// REJFields holds every field of a REJ.
type REJFields struct {
	// LocalCommID is the sender's communication ID (0 if it has none).
	LocalCommID uint32
	// RemoteCommID is the receiver's communication ID.
	RemoteCommID uint32
	// MessageRejected is KindREQ, KindREP or KindOther.
	MessageRejected MsgKind
	// RejectedInfoLength is how many bytes of ARI are meaningful (7 bits,
	// at most REJARISize).
	RejectedInfoLength uint8
	// Reason is the reject reason.
	Reason RejectReason
	// ARI is the additional rejection information, whose meaning depends
	// on Reason.
	ARI [REJARISize]byte
	// PrivateData is the consumer's private data.
	PrivateData [REJPrivateDataSize]byte
}

// AttributeID returns AttrREJ.
func (*REJFields) AttributeID() AttrID { return AttrREJ }

// Decode fills f from a REJ body of at least DataSize bytes, validated by
// REJ.Check.
func (f *REJFields) Decode(body []byte) error {
	if err := need("REJ", body, DataSize); err != nil {
		return err
	}
	r := REJ(body)
	if err := r.Check(); err != nil {
		return err
	}
	*f = r.Fields()
	return nil
}

func (f *REJFields) encode(body []byte) { REJ(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (r REJ) LocalCommID() uint32 { return be32(r[localCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (r REJ) SetLocalCommID(v uint32) { put32(r[localCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (r REJ) RemoteCommID() uint32 { return be32(r[remoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (r REJ) SetRemoteCommID(v uint32) { put32(r[remoteCommIDOff:], v) }

// MessageRejected returns the 2-bit kind of message rejected.
func (r REJ) MessageRejected() MsgKind { return MsgKind(getBits(r[rejOff8], 6, mask2)) }

// SetMessageRejected sets the kind of message rejected; only the low 2
// bits are used.
func (r REJ) SetMessageRejected(v MsgKind) { setBits(&r[rejOff8], 6, mask2, uint8(v)) }

// RejectedInfoLength returns the 7-bit ARI length.
func (r REJ) RejectedInfoLength() uint8 { return getBits(r[rejOff9], 1, 0x7f) }

// SetRejectedInfoLength sets the ARI length; only the low 7 bits are used.
func (r REJ) SetRejectedInfoLength(v uint8) { setBits(&r[rejOff9], 1, 0x7f, v) }

// Reason returns the reject reason.
func (r REJ) Reason() RejectReason { return RejectReason(be16(r[rejReasonOff:])) }

// SetReason sets the reject reason.
func (r REJ) SetReason(v RejectReason) { put16(r[rejReasonOff:], uint16(v)) }

// ARI returns the REJARISize bytes of additional rejection information.
func (r REJ) ARI() []byte { return r[rejARIOff : rejARIOff+REJARISize : rejARIOff+REJARISize] }

// PrivateData returns the REJPrivateDataSize bytes of private data.
func (r REJ) PrivateData() []byte {
	return r[rejPrivOff : rejPrivOff+REJPrivateDataSize : rejPrivOff+REJPrivateDataSize]
}

// Check reports a reserved message rejected code (3) or an ARI length
// above REJARISize.
func (r REJ) Check() error {
	_ = r[DataSize-1]
	if k := r.MessageRejected(); k > KindOther {
		return &Error{Msg: "REJ", Field: "message rejected", Value: uint64(k), Err: ErrReserved}
	}
	if n := r.RejectedInfoLength(); n > REJARISize {
		return &Error{Msg: "REJ", Field: "rejected info length", Value: uint64(n), Err: ErrLength}
	}
	return nil
}

// Fields decodes every field; it does not Check.
func (r REJ) Fields() REJFields {
	_ = r[DataSize-1]
	f := REJFields{
		MessageRejected:    r.MessageRejected(),
		RejectedInfoLength: r.RejectedInfoLength(),
		Reason:             r.Reason(),
	}
	f.LocalCommID, f.RemoteCommID = commIDs(r)
	copy(f.ARI[:], r.ARI())
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the REJ from f; reserved bits are
// zero and values are masked to their fields' widths.
func (r REJ) Encode(f *REJFields) {
	_ = r[DataSize-1]
	clear232(r)
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	r.SetMessageRejected(f.MessageRejected)
	r.SetRejectedInfoLength(f.RejectedInfoLength)
	r.SetReason(f.Reason)
	copy(r.ARI(), f.ARI[:])
	copy(r.PrivateData(), f.PrivateData[:])
}

// RTU is a view of the body of a ready to use message: DataSize bytes.
type RTU []byte

// RTUFields holds every field of an RTU.
type RTUFields struct {
	// LocalCommID is the sender's (the active side's) communication ID.
	LocalCommID uint32
	// RemoteCommID is the REP's LocalCommID.
	RemoteCommID uint32
	// PrivateData is the consumer's private data.
	PrivateData [RTUPrivateDataSize]byte
}

// AttributeID returns AttrRTU.
func (*RTUFields) AttributeID() AttrID { return AttrRTU }

// Decode fills f from an RTU body of at least DataSize bytes.
func (f *RTUFields) Decode(body []byte) error {
	if err := need("RTU", body, DataSize); err != nil {
		return err
	}
	*f = RTU(body).Fields()
	return nil
}

func (f *RTUFields) encode(body []byte) { RTU(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (r RTU) LocalCommID() uint32 { return be32(r[localCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (r RTU) SetLocalCommID(v uint32) { put32(r[localCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (r RTU) RemoteCommID() uint32 { return be32(r[remoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (r RTU) SetRemoteCommID(v uint32) { put32(r[remoteCommIDOff:], v) }

// PrivateData returns the RTUPrivateDataSize bytes of private data.
func (r RTU) PrivateData() []byte {
	return r[rtuPrivOff : rtuPrivOff+RTUPrivateDataSize : rtuPrivOff+RTUPrivateDataSize]
}

// Check returns nil: an RTU has no field to refuse. It is here so that
// every view has one.
func (r RTU) Check() error { _ = r[DataSize-1]; return nil }

// Fields decodes every field.
func (r RTU) Fields() RTUFields {
	_ = r[DataSize-1]
	var f RTUFields
	f.LocalCommID, f.RemoteCommID = commIDs(r)
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the RTU from f.
func (r RTU) Encode(f *RTUFields) {
	_ = r[DataSize-1]
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	copy(r.PrivateData(), f.PrivateData[:])
}

// DREQ is a view of the body of a disconnect request: DataSize bytes.
type DREQ []byte

// DREQFields holds every field of a DREQ.
type DREQFields struct {
	// LocalCommID is the sender's communication ID.
	LocalCommID uint32
	// RemoteCommID is the receiver's communication ID.
	RemoteCommID uint32
	// RemoteQPN is the receiver's 24-bit QP (or EE context) number.
	RemoteQPN uint32
	// PrivateData is the consumer's private data.
	PrivateData [DREQPrivateDataSize]byte
}

// AttributeID returns AttrDREQ.
func (*DREQFields) AttributeID() AttrID { return AttrDREQ }

// Decode fills f from a DREQ body of at least DataSize bytes.
func (f *DREQFields) Decode(body []byte) error {
	if err := need("DREQ", body, DataSize); err != nil {
		return err
	}
	*f = DREQ(body).Fields()
	return nil
}

func (f *DREQFields) encode(body []byte) { DREQ(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (d DREQ) LocalCommID() uint32 { return be32(d[localCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (d DREQ) SetLocalCommID(v uint32) { put32(d[localCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (d DREQ) RemoteCommID() uint32 { return be32(d[remoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (d DREQ) SetRemoteCommID(v uint32) { put32(d[remoteCommIDOff:], v) }

// RemoteQPN returns the 24-bit remote QPN/EECN.
func (d DREQ) RemoteQPN() uint32 { return get24(d[dreqQPNOff:]) }

// SetRemoteQPN sets the remote QPN/EECN; only the low 24 bits are used.
func (d DREQ) SetRemoteQPN(v uint32) { put24(d[dreqQPNOff:], v) }

// PrivateData returns the DREQPrivateDataSize bytes of private data.
func (d DREQ) PrivateData() []byte {
	return d[dreqPrivOff : dreqPrivOff+DREQPrivateDataSize : dreqPrivOff+DREQPrivateDataSize]
}

// Check returns nil: a DREQ has no field to refuse.
func (d DREQ) Check() error { _ = d[DataSize-1]; return nil }

// Fields decodes every field.
func (d DREQ) Fields() DREQFields {
	_ = d[DataSize-1]
	f := DREQFields{RemoteQPN: d.RemoteQPN()}
	f.LocalCommID, f.RemoteCommID = commIDs(d)
	copy(f.PrivateData[:], d.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the DREQ from f; the reserved byte
// is zero.
func (d DREQ) Encode(f *DREQFields) {
	_ = d[DataSize-1]
	d.SetLocalCommID(f.LocalCommID)
	d.SetRemoteCommID(f.RemoteCommID)
	d.SetRemoteQPN(f.RemoteQPN)
	d[dreqQPNOff+3] = 0
	copy(d.PrivateData(), f.PrivateData[:])
}

// DREP is a view of the body of a disconnect reply: DataSize bytes.
type DREP []byte

// DREPFields holds every field of a DREP.
type DREPFields struct {
	// LocalCommID is the sender's communication ID.
	LocalCommID uint32
	// RemoteCommID is the DREQ's LocalCommID.
	RemoteCommID uint32
	// PrivateData is the consumer's private data.
	PrivateData [DREPPrivateDataSize]byte
}

// AttributeID returns AttrDREP.
func (*DREPFields) AttributeID() AttrID { return AttrDREP }

// Decode fills f from a DREP body of at least DataSize bytes.
func (f *DREPFields) Decode(body []byte) error {
	if err := need("DREP", body, DataSize); err != nil {
		return err
	}
	*f = DREP(body).Fields()
	return nil
}

func (f *DREPFields) encode(body []byte) { DREP(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (d DREP) LocalCommID() uint32 { return be32(d[localCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (d DREP) SetLocalCommID(v uint32) { put32(d[localCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (d DREP) RemoteCommID() uint32 { return be32(d[remoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (d DREP) SetRemoteCommID(v uint32) { put32(d[remoteCommIDOff:], v) }

// PrivateData returns the DREPPrivateDataSize bytes of private data.
func (d DREP) PrivateData() []byte {
	return d[drepPrivOff : drepPrivOff+DREPPrivateDataSize : drepPrivOff+DREPPrivateDataSize]
}

// Check returns nil: a DREP has no field to refuse.
func (d DREP) Check() error { _ = d[DataSize-1]; return nil }

// Fields decodes every field.
func (d DREP) Fields() DREPFields {
	_ = d[DataSize-1]
	var f DREPFields
	f.LocalCommID, f.RemoteCommID = commIDs(d)
	copy(f.PrivateData[:], d.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the DREP from f.
func (d DREP) Encode(f *DREPFields) {
	_ = d[DataSize-1]
	d.SetLocalCommID(f.LocalCommID)
	d.SetRemoteCommID(f.RemoteCommID)
	copy(d.PrivateData(), f.PrivateData[:])
}
