package transport

import (
	"errors"
	"strconv"
)

// WCStatus is the status of a work completion. Values and strings equal
// libibverbs' enum ibv_wc_status and ibv_wc_status_str.
type WCStatus uint8

// Work completion status values (libibverbs numbering).
const (
	WCSuccess        WCStatus = iota // success
	WCLocLenErr                      // local length error
	WCLocQPOpErr                     // local QP operation error
	WCLocEECOpErr                    // local EE context operation error
	WCLocProtErr                     // local protection error
	WCWRFlushErr                     // Work Request Flushed Error
	WCMWBindErr                      // memory management operation error
	WCBadRespErr                     // bad response error
	WCLocAccessErr                   // local access error
	WCRemInvReqErr                   // remote invalid request error
	WCRemAccessErr                   // remote access error
	WCRemOpErr                       // remote operation error
	WCRetryExcErr                    // transport retry counter exceeded
	WCRNRRetryExcErr                 // RNR retry counter exceeded
	WCLocRDDViolErr                  // local RDD violation error
	WCRemInvRDReqErr                 // remote invalid RD request
	WCRemAbortErr                    // aborted error
	WCInvEECNErr                     // invalid EE context number
	WCInvEECStateErr                 // invalid EE context state
	WCFatalErr                       // fatal error
	WCRespTimeoutErr                 // response timeout error
	WCGeneralErr                     // general error
)

var wcStatusStr = [...]string{
	WCSuccess:        "success",
	WCLocLenErr:      "local length error",
	WCLocQPOpErr:     "local QP operation error",
	WCLocEECOpErr:    "local EE context operation error",
	WCLocProtErr:     "local protection error",
	WCWRFlushErr:     "Work Request Flushed Error",
	WCMWBindErr:      "memory management operation error",
	WCBadRespErr:     "bad response error",
	WCLocAccessErr:   "local access error",
	WCRemInvReqErr:   "remote invalid request error",
	WCRemAccessErr:   "remote access error",
	WCRemOpErr:       "remote operation error",
	WCRetryExcErr:    "transport retry counter exceeded",
	WCRNRRetryExcErr: "RNR retry counter exceeded",
	WCLocRDDViolErr:  "local RDD violation error",
	WCRemInvRDReqErr: "remote invalid RD request",
	WCRemAbortErr:    "aborted error",
	WCInvEECNErr:     "invalid EE context number",
	WCInvEECStateErr: "invalid EE context state",
	WCFatalErr:       "fatal error",
	WCRespTimeoutErr: "response timeout error",
	WCGeneralErr:     "general error",
}

// String returns the libibverbs ibv_wc_status_str text.
func (s WCStatus) String() string {
	if int(s) < len(wcStatusStr) {
		return wcStatusStr[s]
	}
	return "unknown"
}

// WCOpcode is the operation a work completion reports (libibverbs values).
type WCOpcode uint8

// Work completion opcodes (ibv_wc_opcode numbering).
const (
	WCSend        WCOpcode = 0
	WCRDMAWrite   WCOpcode = 1
	WCRDMARead    WCOpcode = 2
	WCCompSwap    WCOpcode = 3
	WCFetchAdd    WCOpcode = 4
	WCRecv        WCOpcode = 128
	WCRecvRDMAImm WCOpcode = 129
)

// String returns the verbs-style name ("SEND", "RECV_RDMA_WITH_IMM", ...).
func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "WC_OPCODE_" + strconv.Itoa(int(o))
}

// WCFlags are the wc_flags of a completion.
type WCFlags uint8

// Work completion flags (ibv_wc_flags values).
const (
	WCWithImm WCFlags = 1 << 1
	WCWithInv WCFlags = 1 << 3
)

// WC is a work completion.
type WC struct {
	WRID            uint64
	Status          WCStatus
	Opcode          WCOpcode
	VendorErr       uint32
	ByteLen         uint32
	Imm             uint32 // host order; valid when Flags has WCWithImm
	InvalidatedRKey uint32 // valid when Flags has WCWithInv
	QPN             uint32
	SrcQP           uint32
	Flags           WCFlags
}

// Errors returned by the transport API. They can be matched with errors.Is.
var (
	ErrQueueFull     = errors.New("transport: work queue full")
	ErrCQOverflow    = errors.New("transport: completion queue overflow")
	ErrClosed        = errors.New("transport: device closed")
	ErrInvalidState  = errors.New("transport: invalid QP state")
	ErrInvalidAttr   = errors.New("transport: invalid QP attribute")
	ErrMissingAttr   = errors.New("transport: missing QP attribute")
	ErrInvalidWR     = errors.New("transport: invalid work request")
	ErrLimit         = errors.New("transport: resource limit reached")
	ErrInvalidConfig = errors.New("transport: invalid configuration")
)
