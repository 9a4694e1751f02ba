package nvme

import "fmt"

// NVMe-RDMA connection private data (NVMe over Fabrics, RDMA transport
// binding; Linux include/linux/nvme-rdma.h), carried after rdma_cm's
// header in the CM REQ and REP and alone in a consumer REJ.
const (
	// CMReqSize is the length of the request private data.
	CMReqSize = 32
	// CMRepSize is the length of the reply private data.
	CMRepSize = 32
	// CMRejSize is the length of the reject private data.
	CMRejSize = 4
	// RecFmt10 is the only record format (NVME_RDMA_CM_FMT_1_0).
	RecFmt10 = 0
	// Port is the IANA port of NVMe-oF on RDMA (rdma_cm TCP port space).
	Port = 4420
	// AdminQueueDepth is the admin queue size Linux's host uses
	// (NVME_AQ_DEPTH): hrqsize 32, hsqsize 31.
	AdminQueueDepth = 32
)

// CMStatus is an NVMe-RDMA reject status (nvme_rdma_cm_status).
type CMStatus uint16

// Reject statuses.
const (
	CMInvalidLen     CMStatus = 1
	CMInvalidRecFmt  CMStatus = 2
	CMInvalidQID     CMStatus = 3
	CMInvalidHSQSize CMStatus = 4
	CMInvalidHRQSize CMStatus = 5
	CMNoResources    CMStatus = 6
	CMInvalidIRD     CMStatus = 7
	CMInvalidORD     CMStatus = 8
)

// String names the status as the host's log does.
func (s CMStatus) String() string {
	switch s {
	case CMInvalidLen:
		return "invalid length"
	case CMInvalidRecFmt:
		return "invalid record format"
	case CMInvalidQID:
		return "invalid queue ID"
	case CMInvalidHSQSize:
		return "invalid host SQ size"
	case CMInvalidHRQSize:
		return "invalid host RQ size"
	case CMNoResources:
		return "no resources"
	case CMInvalidIRD:
		return "invalid IRD"
	case CMInvalidORD:
		return "invalid ORD"
	}
	return fmt.Sprintf("CMStatus(%d)", uint16(s))
}

// CMReq is a view of the connection request private data.
type CMReq []byte

// CMReqFields are the request's fields.
type CMReqFields struct {
	RecFmt  uint16
	QID     uint16 // 0 admin, 1.. I/O
	HRQSize uint16 // host receive queue size
	HSQSize uint16 // host send queue size, 0's based
}

// ParseCMReq returns the request at the start of b, or ErrShort.
func ParseCMReq(b []byte) (CMReq, error) {
	if len(b) < CMReqSize {
		return nil, fmt.Errorf("%w: NVMe-RDMA CM request of %d bytes", ErrShort, len(b))
	}
	return CMReq(b[:CMReqSize:CMReqSize]), nil
}

// Fields decodes the request.
func (r CMReq) Fields() CMReqFields {
	_ = r[CMReqSize-1]
	return CMReqFields{RecFmt: le.Uint16(r[0:]), QID: le.Uint16(r[2:]), HRQSize: le.Uint16(r[4:]), HSQSize: le.Uint16(r[6:])}
}

// Encode writes all CMReqSize bytes (reserved bytes zero).
func (r CMReq) Encode(f *CMReqFields) {
	_ = r[CMReqSize-1]
	clear(r)
	le.PutUint16(r[0:], f.RecFmt)
	le.PutUint16(r[2:], f.QID)
	le.PutUint16(r[4:], f.HRQSize)
	le.PutUint16(r[6:], f.HSQSize)
}

// CMRep is a view of the connection reply private data.
type CMRep []byte

// CMRepFields are the reply's fields.
type CMRepFields struct {
	RecFmt  uint16
	CRQSize uint16 // controller receive queue size
}

// ParseCMRep returns the reply at the start of b, or ErrShort.
func ParseCMRep(b []byte) (CMRep, error) {
	if len(b) < CMRepSize {
		return nil, fmt.Errorf("%w: NVMe-RDMA CM reply of %d bytes", ErrShort, len(b))
	}
	return CMRep(b[:CMRepSize:CMRepSize]), nil
}

// Fields decodes the reply.
func (r CMRep) Fields() CMRepFields {
	_ = r[CMRepSize-1]
	return CMRepFields{RecFmt: le.Uint16(r[0:]), CRQSize: le.Uint16(r[2:])}
}

// Encode writes all CMRepSize bytes (reserved bytes zero).
func (r CMRep) Encode(f *CMRepFields) {
	_ = r[CMRepSize-1]
	clear(r)
	le.PutUint16(r[0:], f.RecFmt)
	le.PutUint16(r[2:], f.CRQSize)
}

// CMRej is a view of the reject private data.
type CMRej []byte

// CMRejFields are the reject's fields.
type CMRejFields struct {
	RecFmt uint16
	Status CMStatus
}

// ParseCMRej returns the reject at the start of b, or ErrShort.
func ParseCMRej(b []byte) (CMRej, error) {
	if len(b) < CMRejSize {
		return nil, fmt.Errorf("%w: NVMe-RDMA CM reject of %d bytes", ErrShort, len(b))
	}
	return CMRej(b[:CMRejSize:CMRejSize]), nil
}

// Fields decodes the reject.
func (r CMRej) Fields() CMRejFields {
	_ = r[CMRejSize-1]
	return CMRejFields{RecFmt: le.Uint16(r[0:]), Status: CMStatus(le.Uint16(r[2:]))}
}

// Encode writes all CMRejSize bytes.
func (r CMRej) Encode(f *CMRejFields) {
	_ = r[CMRejSize-1]
	le.PutUint16(r[0:], f.RecFmt)
	le.PutUint16(r[2:], uint16(f.Status))
}
