package cm

// Private data and information lengths of LAP and APR.
const (
	LAPPrivateDataSize = 168
	APRPrivateDataSize = 148
	APRInfoSize        = 72 // additional information
)

// Body offsets of LAP (table 115) and APR (table 116).
const (
	lapRemoteQPNOff = 12 // 24 bits, after 4 reserved bytes
	lapOff15        = 15 // remote CM response timeout:5, reserved:3
	lapPathOff      = 20 // after 4 reserved bytes
	lapPrivOff      = 64

	aprInfoLenOff = 8
	aprStatusOff  = 9 // then 2 reserved bytes
	aprInfoOff    = 12
	aprPrivOff    = 84
)

// LAP is a view of the body of a load alternate path request: DataSize
// bytes.
type LAP []byte

// LAPFields holds every field of a LAP.
type LAPFields struct {
	// LocalCommID is the sender's communication ID.
	LocalCommID uint32
	// RemoteCommID is the receiver's communication ID.
	RemoteCommID uint32
	// RemoteQPN is the receiver's 24-bit QP (or EE context) number.
	RemoteQPN uint32
	// RemoteCMResponseTimeout is the 5-bit exponent of how long the
	// receiver may take to answer.
	RemoteCMResponseTimeout uint8
	// Alternate is the proposed alternate path.
	Alternate Path
	// PrivateData is the consumer's private data.
	PrivateData [LAPPrivateDataSize]byte
}

// AttributeID returns AttrLAP.
func (*LAPFields) AttributeID() AttrID { return AttrLAP }

// Decode fills f from a LAP body of at least DataSize bytes.
func (f *LAPFields) Decode(body []byte) error {
	if err := need("LAP", body, DataSize); err != nil {
		return err
	}
	*f = LAP(body).Fields()
	return nil
}

func (f *LAPFields) encode(body []byte) { LAP(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (l LAP) LocalCommID() uint32 { return be32(l[localCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (l LAP) SetLocalCommID(v uint32) { put32(l[localCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (l LAP) RemoteCommID() uint32 { return be32(l[remoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (l LAP) SetRemoteCommID(v uint32) { put32(l[remoteCommIDOff:], v) }

// RemoteQPN returns the 24-bit remote QPN/EECN.
func (l LAP) RemoteQPN() uint32 { return get24(l[lapRemoteQPNOff:]) }

// SetRemoteQPN sets the remote QPN/EECN; only the low 24 bits are used.
func (l LAP) SetRemoteQPN(v uint32) { put24(l[lapRemoteQPNOff:], v) }

// RemoteCMResponseTimeout returns the 5-bit remote CM response timeout.
func (l LAP) RemoteCMResponseTimeout() uint8 { return getBits(l[lapOff15], 3, mask5) }

// SetRemoteCMResponseTimeout sets the remote CM response timeout; only the
// low 5 bits are used.
func (l LAP) SetRemoteCMResponseTimeout(v uint8) { setBits(&l[lapOff15], 3, mask5, v) }

// Alternate returns a view of the alternate path.
func (l LAP) Alternate() LAPPath { return LAPPath(l[lapPathOff : lapPathOff+PathSize]) }

// PrivateData returns the LAPPrivateDataSize bytes of private data.
func (l LAP) PrivateData() []byte {
	return l[lapPrivOff : lapPrivOff+LAPPrivateDataSize : lapPrivOff+LAPPrivateDataSize]
}

// Check returns nil: a LAP has no field to refuse.
func (l LAP) Check() error { _ = l[DataSize-1]; return nil }

// Fields decodes every field.
func (l LAP) Fields() LAPFields {
	_ = l[DataSize-1]
	f := LAPFields{
		RemoteQPN:               l.RemoteQPN(),
		RemoteCMResponseTimeout: l.RemoteCMResponseTimeout(),
		Alternate:               l.Alternate().Fields(),
	}
	f.LocalCommID, f.RemoteCommID = commIDs(l)
	copy(f.PrivateData[:], l.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the LAP from f; reserved fields are
// zero and values are masked to their fields' widths.
func (l LAP) Encode(f *LAPFields) {
	_ = l[DataSize-1]
	clear232(l)
	l.SetLocalCommID(f.LocalCommID)
	l.SetRemoteCommID(f.RemoteCommID)
	l.SetRemoteQPN(f.RemoteQPN)
	l.SetRemoteCMResponseTimeout(f.RemoteCMResponseTimeout)
	l.Alternate().Encode(&f.Alternate)
	copy(l.PrivateData(), f.PrivateData[:])
}

// APR is a view of the body of an alternate path response: DataSize bytes.
type APR []byte

// APRFields holds every field of an APR.
type APRFields struct {
	// LocalCommID is the sender's communication ID.
	LocalCommID uint32
	// RemoteCommID is the LAP's LocalCommID.
	RemoteCommID uint32
	// AdditionalInfoLength is how many bytes of AdditionalInfo are
	// meaningful (at most APRInfoSize).
	AdditionalInfoLength uint8
	// Status is the AP status.
	Status APRStatus
	// AdditionalInfo is the additional information.
	AdditionalInfo [APRInfoSize]byte
	// PrivateData is the consumer's private data.
	PrivateData [APRPrivateDataSize]byte
}

// AttributeID returns AttrAPR.
func (*APRFields) AttributeID() AttrID { return AttrAPR }

// Decode fills f from an APR body of at least DataSize bytes, validated by
// APR.Check.
func (f *APRFields) Decode(body []byte) error {
	if err := need("APR", body, DataSize); err != nil {
		return err
	}
	a := APR(body)
	if err := a.Check(); err != nil {
		return err
	}
	*f = a.Fields()
	return nil
}

func (f *APRFields) encode(body []byte) { APR(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (a APR) LocalCommID() uint32 { return be32(a[localCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (a APR) SetLocalCommID(v uint32) { put32(a[localCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (a APR) RemoteCommID() uint32 { return be32(a[remoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (a APR) SetRemoteCommID(v uint32) { put32(a[remoteCommIDOff:], v) }

// AdditionalInfoLength returns the additional information length.
func (a APR) AdditionalInfoLength() uint8 { return a[aprInfoLenOff] }

// SetAdditionalInfoLength sets the additional information length.
func (a APR) SetAdditionalInfoLength(v uint8) { a[aprInfoLenOff] = v }

// Status returns the AP status.
func (a APR) Status() APRStatus { return APRStatus(a[aprStatusOff]) }

// SetStatus sets the AP status.
func (a APR) SetStatus(v APRStatus) { a[aprStatusOff] = byte(v) }

// AdditionalInfo returns the APRInfoSize bytes of additional information.
func (a APR) AdditionalInfo() []byte {
	return a[aprInfoOff : aprInfoOff+APRInfoSize : aprInfoOff+APRInfoSize]
}

// PrivateData returns the APRPrivateDataSize bytes of private data.
func (a APR) PrivateData() []byte {
	return a[aprPrivOff : aprPrivOff+APRPrivateDataSize : aprPrivOff+APRPrivateDataSize]
}

// Check reports an additional information length above APRInfoSize.
func (a APR) Check() error {
	_ = a[DataSize-1]
	if n := a.AdditionalInfoLength(); n > APRInfoSize {
		return &Error{Msg: "APR", Field: "additional information length", Value: uint64(n), Err: ErrLength}
	}
	return nil
}

// Fields decodes every field; it does not Check.
func (a APR) Fields() APRFields {
	_ = a[DataSize-1]
	f := APRFields{AdditionalInfoLength: a.AdditionalInfoLength(), Status: a.Status()}
	f.LocalCommID, f.RemoteCommID = commIDs(a)
	copy(f.AdditionalInfo[:], a.AdditionalInfo())
	copy(f.PrivateData[:], a.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the APR from f; the reserved bytes
// are zero.
func (a APR) Encode(f *APRFields) {
	_ = a[DataSize-1]
	a.SetLocalCommID(f.LocalCommID)
	a.SetRemoteCommID(f.RemoteCommID)
	a.SetAdditionalInfoLength(f.AdditionalInfoLength)
	a.SetStatus(f.Status)
	a[aprStatusOff+1], a[aprStatusOff+2] = 0, 0
	copy(a.AdditionalInfo(), f.AdditionalInfo[:])
	copy(a.PrivateData(), f.PrivateData[:])
}
