package cm

// REQPrivateDataSize is the length of a REQ's private data.
const REQPrivateDataSize = 92

// REQ body offsets (IBTA vol. 1 table 106 / Linux CM_REQ_*).
const (
	reqLocalCommIDOff = 0
	reqVendorIDOff    = 5 // 24 bits after a reserved byte (ECE vendor ID)
	reqServiceIDOff   = 8
	reqLocalCAGUIDOff = 16
	reqLocalQKeyOff   = 28 // after 4 reserved bytes
	reqLocalQPNOff    = 32 // 24 bits
	reqRespResOff     = 35
	reqLocalEECNOff   = 36 // 24 bits
	reqInitDepthOff   = 39
	reqRemoteEECNOff  = 40 // 24 bits
	reqOff43          = 43 // remote CM response timeout:5, transport service type:2, end-to-end flow control:1
	reqStartPSNOff    = 44 // 24 bits
	reqOff47          = 47 // local CM response timeout:5, retry count:3
	reqPKeyOff        = 48
	reqOff50          = 50 // path MTU:4, RDC exists:1, RNR retry count:3
	reqOff51          = 51 // max CM retries:4, SRQ:1, extended transport type:3
	reqPrimaryOff     = 52
	reqAlternateOff   = 96
	reqOff139         = 139 // alternate local ACK timeout:5, SAP supported:1, reserved:2
	reqPrivOff        = 140
)

// REQ is a view of the body of a connection request (MAD.Data): DataSize
// bytes. The caller guarantees the length; Decode checks it.
type REQ []byte

// REQFields holds every field of a REQ.
type REQFields struct {
	// LocalCommID is the sender's communication ID for this connection.
	LocalCommID uint32
	// VendorID is the 24-bit vendor ID of Linux's Enhanced Connection
	// Establishment (ECE), in what IBTA 1.3 reserves; 0 without ECE.
	VendorID uint32
	// ServiceID names the service; see ServiceID for rdma_cm's.
	ServiceID uint64
	// LocalCAGUID is the sender's channel adapter GUID.
	LocalCAGUID uint64
	// LocalQKey is the sender's Q_Key (RD only; 0 for RC).
	LocalQKey uint32
	// LocalQPN is the sender's 24-bit QP number.
	LocalQPN uint32
	// ResponderResources is how many RDMA READs/atomics the sender will
	// serve at once (its max_dest_rd_atomic).
	ResponderResources uint8
	// LocalEECN is the sender's 24-bit EE context number (RD only).
	LocalEECN uint32
	// InitiatorDepth is how many RDMA READs/atomics the sender will have
	// outstanding (its max_rd_atomic).
	InitiatorDepth uint8
	// RemoteEECN is the 24-bit EE context number at the receiver (RD only).
	RemoteEECN uint32
	// RemoteCMResponseTimeout is the 5-bit exponent (Timeout) of how long
	// the receiver may take to answer.
	RemoteCMResponseTimeout uint8
	// TransportServiceType is RC, UC, RD or extended (2 bits).
	TransportServiceType TransportType
	// EndToEndFlowControl says whether the sender's receive queue uses
	// end-to-end credits.
	EndToEndFlowControl bool
	// StartingPSN is the 24-bit PSN the sender's receive queue expects:
	// the receiver of the REQ starts its send queue with it.
	StartingPSN uint32
	// LocalCMResponseTimeout is the 5-bit exponent of how long the sender
	// takes to answer.
	LocalCMResponseTimeout uint8
	// RetryCount is the 3-bit transport retry count for the receiver.
	RetryCount uint8
	// PKey is the partition key of the connection.
	PKey uint16
	// PathMTU is the path MTU code (4 bits).
	PathMTU MTU
	// RDCExists is the RD channel exists bit (RD only).
	RDCExists bool
	// RNRRetryCount is the 3-bit RNR NAK retry count (7: for ever).
	RNRRetryCount uint8
	// MaxCMRetries is how often the sender retries the REQ (4 bits).
	MaxCMRetries uint8
	// SRQ says the sender's QP uses a shared receive queue.
	SRQ bool
	// ExtendedTransportType is the 3-bit extended transport type; 1 (XRC)
	// with TransportExtended.
	ExtendedTransportType uint8
	// Primary is the primary path.
	Primary Path
	// Alternate is the alternate path; all zero (LIDs 0) when there is
	// none.
	Alternate Path
	// SAPSupported is the alternate path's "SAP supported" bit.
	SAPSupported bool
	// PrivateData is the consumer's private data; rdma_cm starts it with a
	// CMAHeader.
	PrivateData [REQPrivateDataSize]byte
}

// AttributeID returns AttrREQ.
func (*REQFields) AttributeID() AttrID { return AttrREQ }

// Decode fills f from a REQ body of at least DataSize bytes, validated by
// REQ.Check.
func (f *REQFields) Decode(body []byte) error {
	if err := need("REQ", body, DataSize); err != nil {
		return err
	}
	r := REQ(body)
	if err := r.Check(); err != nil {
		return err
	}
	*f = r.Fields()
	return nil
}

func (f *REQFields) encode(body []byte) { REQ(body).Encode(f) }

// LocalCommID returns the local communication ID.
func (r REQ) LocalCommID() uint32 { return be32(r[reqLocalCommIDOff:]) }

// SetLocalCommID sets the local communication ID.
func (r REQ) SetLocalCommID(v uint32) { put32(r[reqLocalCommIDOff:], v) }

// VendorID returns the 24-bit ECE vendor ID.
func (r REQ) VendorID() uint32 { return get24(r[reqVendorIDOff:]) }

// SetVendorID sets the ECE vendor ID; only the low 24 bits are used.
func (r REQ) SetVendorID(v uint32) { put24(r[reqVendorIDOff:], v) }

// ServiceID returns the service ID.
func (r REQ) ServiceID() uint64 { return be64(r[reqServiceIDOff:]) }

// SetServiceID sets the service ID.
func (r REQ) SetServiceID(v uint64) { put64(r[reqServiceIDOff:], v) }

// LocalCAGUID returns the local CA GUID.
func (r REQ) LocalCAGUID() uint64 { return be64(r[reqLocalCAGUIDOff:]) }

// SetLocalCAGUID sets the local CA GUID.
func (r REQ) SetLocalCAGUID(v uint64) { put64(r[reqLocalCAGUIDOff:], v) }

// LocalQKey returns the local Q_Key.
func (r REQ) LocalQKey() uint32 { return be32(r[reqLocalQKeyOff:]) }

// SetLocalQKey sets the local Q_Key.
func (r REQ) SetLocalQKey(v uint32) { put32(r[reqLocalQKeyOff:], v) }

// LocalQPN returns the 24-bit local QP number.
func (r REQ) LocalQPN() uint32 { return get24(r[reqLocalQPNOff:]) }

// SetLocalQPN sets the local QP number; only the low 24 bits are used.
func (r REQ) SetLocalQPN(v uint32) { put24(r[reqLocalQPNOff:], v) }

// ResponderResources returns the responder resources.
func (r REQ) ResponderResources() uint8 { return r[reqRespResOff] }

// SetResponderResources sets the responder resources.
func (r REQ) SetResponderResources(v uint8) { r[reqRespResOff] = v }

// LocalEECN returns the 24-bit local EE context number.
func (r REQ) LocalEECN() uint32 { return get24(r[reqLocalEECNOff:]) }

// SetLocalEECN sets the local EE context number; only the low 24 bits are
// used.
func (r REQ) SetLocalEECN(v uint32) { put24(r[reqLocalEECNOff:], v) }

// InitiatorDepth returns the initiator depth.
func (r REQ) InitiatorDepth() uint8 { return r[reqInitDepthOff] }

// SetInitiatorDepth sets the initiator depth.
func (r REQ) SetInitiatorDepth(v uint8) { r[reqInitDepthOff] = v }

// RemoteEECN returns the 24-bit remote EE context number.
func (r REQ) RemoteEECN() uint32 { return get24(r[reqRemoteEECNOff:]) }

// SetRemoteEECN sets the remote EE context number; only the low 24 bits
// are used.
func (r REQ) SetRemoteEECN(v uint32) { put24(r[reqRemoteEECNOff:], v) }

// RemoteCMResponseTimeout returns the 5-bit remote CM response timeout.
func (r REQ) RemoteCMResponseTimeout() uint8 { return getBits(r[reqOff43], 3, mask5) }

// SetRemoteCMResponseTimeout sets the remote CM response timeout; only
// the low 5 bits are used.
func (r REQ) SetRemoteCMResponseTimeout(v uint8) { setBits(&r[reqOff43], 3, mask5, v) }

// TransportServiceType returns the 2-bit transport service type.
func (r REQ) TransportServiceType() TransportType {
	return TransportType(getBits(r[reqOff43], 1, mask2))
}

// SetTransportServiceType sets the transport service type; only the low 2
// bits are used.
func (r REQ) SetTransportServiceType(v TransportType) { setBits(&r[reqOff43], 1, mask2, uint8(v)) }

// EndToEndFlowControl reports the end-to-end flow control bit.
func (r REQ) EndToEndFlowControl() bool { return r[reqOff43]&1 != 0 }

// SetEndToEndFlowControl sets the end-to-end flow control bit.
func (r REQ) SetEndToEndFlowControl(v bool) { setBits(&r[reqOff43], 0, 1, b2u(v)) }

// StartingPSN returns the 24-bit starting PSN.
func (r REQ) StartingPSN() uint32 { return get24(r[reqStartPSNOff:]) }

// SetStartingPSN sets the starting PSN; only the low 24 bits are used.
func (r REQ) SetStartingPSN(v uint32) { put24(r[reqStartPSNOff:], v) }

// LocalCMResponseTimeout returns the 5-bit local CM response timeout.
func (r REQ) LocalCMResponseTimeout() uint8 { return getBits(r[reqOff47], 3, mask5) }

// SetLocalCMResponseTimeout sets the local CM response timeout; only the
// low 5 bits are used.
func (r REQ) SetLocalCMResponseTimeout(v uint8) { setBits(&r[reqOff47], 3, mask5, v) }

// RetryCount returns the 3-bit retry count.
func (r REQ) RetryCount() uint8 { return r[reqOff47] & mask3 }

// SetRetryCount sets the retry count; only the low 3 bits are used.
func (r REQ) SetRetryCount(v uint8) { setBits(&r[reqOff47], 0, mask3, v) }

// PKey returns the partition key.
func (r REQ) PKey() uint16 { return be16(r[reqPKeyOff:]) }

// SetPKey sets the partition key.
func (r REQ) SetPKey(v uint16) { put16(r[reqPKeyOff:], v) }

// PathMTU returns the 4-bit path MTU code.
func (r REQ) PathMTU() MTU { return MTU(getBits(r[reqOff50], 4, mask4)) }

// SetPathMTU sets the path MTU code; only the low 4 bits are used.
func (r REQ) SetPathMTU(v MTU) { setBits(&r[reqOff50], 4, mask4, uint8(v)) }

// RDCExists reports the RDC exists bit.
func (r REQ) RDCExists() bool { return getBits(r[reqOff50], 3, 1) != 0 }

// SetRDCExists sets the RDC exists bit.
func (r REQ) SetRDCExists(v bool) { setBits(&r[reqOff50], 3, 1, b2u(v)) }

// RNRRetryCount returns the 3-bit RNR retry count.
func (r REQ) RNRRetryCount() uint8 { return r[reqOff50] & mask3 }

// SetRNRRetryCount sets the RNR retry count; only the low 3 bits are used.
func (r REQ) SetRNRRetryCount(v uint8) { setBits(&r[reqOff50], 0, mask3, v) }

// MaxCMRetries returns the 4-bit maximum CM retries.
func (r REQ) MaxCMRetries() uint8 { return getBits(r[reqOff51], 4, mask4) }

// SetMaxCMRetries sets the maximum CM retries; only the low 4 bits are
// used.
func (r REQ) SetMaxCMRetries(v uint8) { setBits(&r[reqOff51], 4, mask4, v) }

// SRQ reports the SRQ bit.
func (r REQ) SRQ() bool { return getBits(r[reqOff51], 3, 1) != 0 }

// SetSRQ sets the SRQ bit.
func (r REQ) SetSRQ(v bool) { setBits(&r[reqOff51], 3, 1, b2u(v)) }

// ExtendedTransportType returns the 3-bit extended transport type.
func (r REQ) ExtendedTransportType() uint8 { return r[reqOff51] & mask3 }

// SetExtendedTransportType sets the extended transport type; only the low
// 3 bits are used.
func (r REQ) SetExtendedTransportType(v uint8) { setBits(&r[reqOff51], 0, mask3, v) }

// Primary returns a view of the primary path.
func (r REQ) Primary() REQPath { return REQPath(r[reqPrimaryOff : reqPrimaryOff+PathSize]) }

// Alternate returns a view of the alternate path.
func (r REQ) Alternate() REQPath { return REQPath(r[reqAlternateOff : reqAlternateOff+PathSize]) }

// SAPSupported reports the SAP supported bit.
func (r REQ) SAPSupported() bool { return getBits(r[reqOff139], 2, 1) != 0 }

// SetSAPSupported sets the SAP supported bit.
func (r REQ) SetSAPSupported(v bool) { setBits(&r[reqOff139], 2, 1, b2u(v)) }

// PrivateData returns the REQPrivateDataSize bytes of private data.
func (r REQ) PrivateData() []byte {
	return r[reqPrivOff : reqPrivOff+REQPrivateDataSize : reqPrivOff+REQPrivateDataSize]
}

// Check reports the first field a receiver must refuse: a reserved path
// MTU code, or transport service type 3 with an extended transport type
// other than XRC.
func (r REQ) Check() error {
	_ = r[DataSize-1]
	if m := r.PathMTU(); !m.Valid() {
		return &Error{Msg: "REQ", Field: "path MTU", Value: uint64(m), Err: ErrReserved}
	}
	if r.TransportServiceType() == TransportExtended {
		if x := r.ExtendedTransportType(); x != ExtendedXRC {
			return &Error{Msg: "REQ", Field: "extended transport type", Value: uint64(x), Err: ErrReserved}
		}
	}
	return nil
}

// Fields decodes every field; it does not Check.
func (r REQ) Fields() REQFields {
	_ = r[DataSize-1]
	f := REQFields{
		LocalCommID:             r.LocalCommID(),
		VendorID:                r.VendorID(),
		ServiceID:               r.ServiceID(),
		LocalCAGUID:             r.LocalCAGUID(),
		LocalQKey:               r.LocalQKey(),
		LocalQPN:                r.LocalQPN(),
		ResponderResources:      r.ResponderResources(),
		LocalEECN:               r.LocalEECN(),
		InitiatorDepth:          r.InitiatorDepth(),
		RemoteEECN:              r.RemoteEECN(),
		RemoteCMResponseTimeout: r.RemoteCMResponseTimeout(),
		TransportServiceType:    r.TransportServiceType(),
		EndToEndFlowControl:     r.EndToEndFlowControl(),
		StartingPSN:             r.StartingPSN(),
		LocalCMResponseTimeout:  r.LocalCMResponseTimeout(),
		RetryCount:              r.RetryCount(),
		PKey:                    r.PKey(),
		PathMTU:                 r.PathMTU(),
		RDCExists:               r.RDCExists(),
		RNRRetryCount:           r.RNRRetryCount(),
		MaxCMRetries:            r.MaxCMRetries(),
		SRQ:                     r.SRQ(),
		ExtendedTransportType:   r.ExtendedTransportType(),
		Primary:                 r.Primary().Fields(),
		Alternate:               r.Alternate().Fields(),
		SAPSupported:            r.SAPSupported(),
	}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes all DataSize bytes of the REQ from f; reserved fields are
// zero and values are masked to their fields' widths.
func (r REQ) Encode(f *REQFields) {
	_ = r[DataSize-1]
	clear232(r)
	r.SetLocalCommID(f.LocalCommID)
	r.SetVendorID(f.VendorID)
	r.SetServiceID(f.ServiceID)
	r.SetLocalCAGUID(f.LocalCAGUID)
	r.SetLocalQKey(f.LocalQKey)
	r.SetLocalQPN(f.LocalQPN)
	r.SetResponderResources(f.ResponderResources)
	r.SetLocalEECN(f.LocalEECN)
	r.SetInitiatorDepth(f.InitiatorDepth)
	r.SetRemoteEECN(f.RemoteEECN)
	r.SetRemoteCMResponseTimeout(f.RemoteCMResponseTimeout)
	r.SetTransportServiceType(f.TransportServiceType)
	r.SetEndToEndFlowControl(f.EndToEndFlowControl)
	r.SetStartingPSN(f.StartingPSN)
	r.SetLocalCMResponseTimeout(f.LocalCMResponseTimeout)
	r.SetRetryCount(f.RetryCount)
	r.SetPKey(f.PKey)
	r.SetPathMTU(f.PathMTU)
	r.SetRDCExists(f.RDCExists)
	r.SetRNRRetryCount(f.RNRRetryCount)
	r.SetMaxCMRetries(f.MaxCMRetries)
	r.SetSRQ(f.SRQ)
	r.SetExtendedTransportType(f.ExtendedTransportType)
	r.Primary().Encode(&f.Primary)
	r.Alternate().Encode(&f.Alternate)
	r.SetSAPSupported(f.SAPSupported)
	copy(r.PrivateData(), f.PrivateData[:])
}
