package cm

// REPPrivateDataSize is the length of a REP's private data.
const REPPrivateDataSize = 196

// REP body offsets (IBTA vol. 1 table 110 / Linux CM_REP_*).
const (
	repLocalCommIDOff  = 0
	repRemoteCommIDOff = 4
	repLocalQKeyOff    = 8
	repLocalQPNOff     = 12 // 24 bits
	repVendorHOff      = 15 // ECE vendor ID bits 23..16
	repLocalEECNOff    = 16 // 24 bits
	repVendorMOff      = 19 // ECE vendor ID bits 15..8
	repStartPSNOff     = 20 // 24 bits
	repVendorLOff      = 23 // ECE vendor ID bits 7..0
	repRespResOff      = 24
	repInitDepthOff    = 25
	repOff26           = 26 // target ACK delay:5, failover accepted:2, end-to-end flow control:1
	repOff27           = 27 // RNR retry count:3, SRQ:1, reserved:4
	repLocalCAGUIDOff  = 28
	repPrivOff         = 36
)

// REP is a view of the body of a connection reply: DataSize bytes.
type REP []byte

// REPFields holds every field of a REP.
type REPFields struct {
	// LocalCommID is the sender's (the passive side's) communication ID.
	LocalCommID uint32
	// RemoteCommID is the REQ's LocalCommID.
	RemoteCommID uint32
	// LocalQKey is the sender's Q_Key (RD only).
	LocalQKey uint32
	// LocalQPN is the sender's 24-bit QP number.
	LocalQPN uint32
	// VendorID is the 24-bit ECE vendor ID, split over three reserved
	// bytes; 0 without ECE.
	VendorID uint32
	// LocalEECN is the sender's 24-bit EE context number (RD only).
	LocalEECN uint32
	// StartingPSN is the 24-bit PSN the sender's receive queue expects:
	// the active side starts its send queue with it.
	StartingPSN uint32
	// ResponderResources is how many RDMA READs/atomics the sender will
	// serve at once.
	ResponderResources uint8
	// InitiatorDepth is how many RDMA READs/atomics the sender will have
	// outstanding.
	InitiatorDepth uint8
	// TargetACKDelay is the 5-bit exponent of the sender's ACK delay.
	TargetACKDelay uint8
	// FailoverAccepted is FailoverAccepted, FailoverNotSupported or
	// FailoverRejected (2 bits; 3 is reserved).
	FailoverAccepted uint8
	// EndToEndFlowControl says whether the sender uses end-to-end credits.
	EndToEndFlowControl bool
	// RNRRetryCount is the 3-bit RNR NAK retry count for the active side.
	RNRRetryCount uint8
	// SRQ says the sender's QP uses a shared receive queue.
	SRQ bool
	// LocalCAGUID is the sender's channel adapter GUID.
	LocalCAGUID uint64
	// PrivateData is the consumer's private data.
	PrivateData [REPPrivateDataSize]byte
}

// AttributeID returns AttrREP.
func (*REPFields) AttributeID() AttrID { return AttrREP }

// Decode fills f from a REP body of at least DataSize bytes, validated by
// REP.Check.
func (f *REPFields) Decode(body []byte) error {
	if err := need("REP", body, DataSize); err != nil {
		return err
	}
	r := REP(body)
	if err := r.Check(); err != nil {
		return err
	}
	*f = r.Fields()
	return nil
}

func (f *REPFields) encode(body []byte) { REP(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (r REP) LocalCommID() uint32 { return be32(r[repLocalCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (r REP) SetLocalCommID(v uint32) { put32(r[repLocalCommIDOff:], v) }

// RemoteCommID returns the remote communication ID.
func (r REP) RemoteCommID() uint32 { return be32(r[repRemoteCommIDOff:]) }

// SetRemoteCommID sets the remote communication ID.
func (r REP) SetRemoteCommID(v uint32) { put32(r[repRemoteCommIDOff:], v) }

// LocalQKey returns the local Q_Key.
func (r REP) LocalQKey() uint32 { return be32(r[repLocalQKeyOff:]) }

// SetLocalQKey sets the local Q_Key.
func (r REP) SetLocalQKey(v uint32) { put32(r[repLocalQKeyOff:], v) }

// LocalQPN returns the 24-bit local QP number.
func (r REP) LocalQPN() uint32 { return get24(r[repLocalQPNOff:]) }

// SetLocalQPN sets the local QP number; only the low 24 bits are used.
func (r REP) SetLocalQPN(v uint32) { put24(r[repLocalQPNOff:], v) }

// VendorID returns the 24-bit ECE vendor ID.
func (r REP) VendorID() uint32 {
	return uint32(r[repVendorHOff])<<16 | uint32(r[repVendorMOff])<<8 | uint32(r[repVendorLOff])
}

// SetVendorID sets the ECE vendor ID; only the low 24 bits are used.
func (r REP) SetVendorID(v uint32) {
	r[repVendorHOff], r[repVendorMOff], r[repVendorLOff] = byte(v>>16), byte(v>>8), byte(v)
}

// LocalEECN returns the 24-bit local EE context number.
func (r REP) LocalEECN() uint32 { return get24(r[repLocalEECNOff:]) }

// SetLocalEECN sets the local EE context number; only the low 24 bits are
// used.
func (r REP) SetLocalEECN(v uint32) { put24(r[repLocalEECNOff:], v) }

// StartingPSN returns the 24-bit starting PSN.
func (r REP) StartingPSN() uint32 { return get24(r[repStartPSNOff:]) }

// SetStartingPSN sets the starting PSN; only the low 24 bits are used.
func (r REP) SetStartingPSN(v uint32) { put24(r[repStartPSNOff:], v) }

// ResponderResources returns the responder resources.
func (r REP) ResponderResources() uint8 { return r[repRespResOff] }

// SetResponderResources sets the responder resources.
func (r REP) SetResponderResources(v uint8) { r[repRespResOff] = v }

// InitiatorDepth returns the initiator depth.
func (r REP) InitiatorDepth() uint8 { return r[repInitDepthOff] }

// SetInitiatorDepth sets the initiator depth.
func (r REP) SetInitiatorDepth(v uint8) { r[repInitDepthOff] = v }

// TargetACKDelay returns the 5-bit target ACK delay.
func (r REP) TargetACKDelay() uint8 { return getBits(r[repOff26], 3, mask5) }

// SetTargetACKDelay sets the target ACK delay; only the low 5 bits are
// used.
func (r REP) SetTargetACKDelay(v uint8) { setBits(&r[repOff26], 3, mask5, v) }

// FailoverAccepted returns the 2-bit failover accepted code.
func (r REP) FailoverAccepted() uint8 { return getBits(r[repOff26], 1, mask2) }

// SetFailoverAccepted sets the failover accepted code; only the low 2 bits
// are used.
func (r REP) SetFailoverAccepted(v uint8) { setBits(&r[repOff26], 1, mask2, v) }

// EndToEndFlowControl reports the end-to-end flow control bit.
func (r REP) EndToEndFlowControl() bool { return r[repOff26]&1 != 0 }

// SetEndToEndFlowControl sets the end-to-end flow control bit.
func (r REP) SetEndToEndFlowControl(v bool) { setBits(&r[repOff26], 0, 1, b2u(v)) }

// RNRRetryCount returns the 3-bit RNR retry count.
func (r REP) RNRRetryCount() uint8 { return getBits(r[repOff27], 5, mask3) }

// SetRNRRetryCount sets the RNR retry count; only the low 3 bits are used.
func (r REP) SetRNRRetryCount(v uint8) { setBits(&r[repOff27], 5, mask3, v) }

// SRQ reports the SRQ bit.
func (r REP) SRQ() bool { return getBits(r[repOff27], 4, 1) != 0 }

// SetSRQ sets the SRQ bit.
func (r REP) SetSRQ(v bool) { setBits(&r[repOff27], 4, 1, b2u(v)) }

// LocalCAGUID returns the local CA GUID.
func (r REP) LocalCAGUID() uint64 { return be64(r[repLocalCAGUIDOff:]) }

// SetLocalCAGUID sets the local CA GUID.
func (r REP) SetLocalCAGUID(v uint64) { put64(r[repLocalCAGUIDOff:], v) }

// PrivateData returns the REPPrivateDataSize bytes of private data.
func (r REP) PrivateData() []byte {
	return r[repPrivOff : repPrivOff+REPPrivateDataSize : repPrivOff+REPPrivateDataSize]
}

// Check reports a reserved failover accepted code (3).
func (r REP) Check() error {
	_ = r[DataSize-1]
	if v := r.FailoverAccepted(); v > FailoverRejected {
		return &Error{Msg: "REP", Field: "failover accepted", Value: uint64(v), Err: ErrReserved}
	}
	return nil
}

// Fields decodes every field; it does not Check.
func (r REP) Fields() REPFields {
	_ = r[DataSize-1]
	f := REPFields{
		LocalCommID:         r.LocalCommID(),
		RemoteCommID:        r.RemoteCommID(),
		LocalQKey:           r.LocalQKey(),
		LocalQPN:            r.LocalQPN(),
		VendorID:            r.VendorID(),
		LocalEECN:           r.LocalEECN(),
		StartingPSN:         r.StartingPSN(),
		ResponderResources:  r.ResponderResources(),
		InitiatorDepth:      r.InitiatorDepth(),
		TargetACKDelay:      r.TargetACKDelay(),
		FailoverAccepted:    r.FailoverAccepted(),
		EndToEndFlowControl: r.EndToEndFlowControl(),
		RNRRetryCount:       r.RNRRetryCount(),
		SRQ:                 r.SRQ(),
		LocalCAGUID:         r.LocalCAGUID(),
	}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the REP from f; reserved fields are
// zero and values are masked to their fields' widths.
func (r REP) Encode(f *REPFields) {
	_ = r[DataSize-1]
	clear232(r)
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	r.SetLocalQKey(f.LocalQKey)
	r.SetLocalQPN(f.LocalQPN)
	r.SetLocalEECN(f.LocalEECN)
	r.SetStartingPSN(f.StartingPSN)
	r.SetVendorID(f.VendorID)
	r.SetResponderResources(f.ResponderResources)
	r.SetInitiatorDepth(f.InitiatorDepth)
	r.SetTargetACKDelay(f.TargetACKDelay)
	r.SetFailoverAccepted(f.FailoverAccepted)
	r.SetEndToEndFlowControl(f.EndToEndFlowControl)
	r.SetRNRRetryCount(f.RNRRetryCount)
	r.SetSRQ(f.SRQ)
	r.SetLocalCAGUID(f.LocalCAGUID)
	copy(r.PrivateData(), f.PrivateData[:])
}
