package transport

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/gorocev2/rocev2/memreg"
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
	WCBindMW      WCOpcode = 5
	WCLocalInv    WCOpcode = 6
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
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
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
	// WCGRH: the first 40 bytes of the receive buffer hold the GRH (UD).
	// On RoCEv2 over IPv4 the IPv4 header is in the last 20 of them.
	WCGRH WCFlags = 1 << 0
	// WCWithNetworkHdrType: NetworkHdrType is valid.
	WCWithNetworkHdrType WCFlags = 1 << 6
)

// Network header types of WC.NetworkHdrType (the kernel's enum
// rdma_network_type).
const (
	NetworkIPv4 = 2
	NetworkIPv6 = 3
)

// WC is a work completion, as ibv_wc.
//
// The result of a compare-and-swap or fetch-and-add (the original value of
// the remote 8 bytes) is written to the WR's local SGE in host byte order,
// as verbs does: read it with binary.NativeEndian.Uint64. On the wire it
// travels big-endian in the AtomicAckETH.
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
	// NetworkHdrType is the header a UD datagram arrived with
	// (NetworkIPv4 or NetworkIPv6), as the kernel's rdma_network_type.
	NetworkHdrType uint8
}

// Err returns nil for a successful completion, else a *WCError that
// describes it (status, opcode, wr_id, QP).
func (wc *WC) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, Opcode: wc.Opcode, WRID: wc.WRID, QPN: wc.QPN}
}

// WCError is the error of a failed work completion (WC.Err). Match a
// status with errors.As and the Status field.
type WCError struct {
	Status WCStatus
	Opcode WCOpcode
	WRID   uint64
	QPN    uint32
}

// Error names the QP, the work request's ID and opcode and the
// completion status.
func (e *WCError) Error() string {
	return fmt.Sprintf("transport: qp %#x wr_id %#x %v: %v", e.QPN, e.WRID, e.Opcode, e.Status)
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
	// ErrBusy: the resource is still in use (a PD or CQ that a QP uses,
	// a completion channel with CQs attached), as verbs' EBUSY. It is
	// memreg.ErrBusy, so PD.Dealloc's error matches it too.
	ErrBusy = memreg.ErrBusy
	// ErrInvalidArgument: a malformed argument of a call that is not a
	// configuration, attribute or work request (an empty wc slice for
	// CQ.Wait).
	ErrInvalidArgument = errors.New("transport: invalid argument")
	// ErrWrongDevice: an object of another Device was passed.
	ErrWrongDevice = errors.New("transport: object belongs to another device")
	// ErrDestroyed: the object was destroyed.
	ErrDestroyed = errors.New("transport: destroyed")
	// ErrUnknownQP: a packet names a QPN the device does not have.
	ErrUnknownQP = errors.New("transport: no such QP")
	// ErrMalformed: a packet did not parse (it also wraps packet's error).
	ErrMalformed = errors.New("transport: malformed packet")
	// ErrTransportMismatch: a packet's transport (UC, UD, ...) is not its
	// QP's.
	ErrTransportMismatch = errors.New("transport: packet transport does not match the QP")
)

// WRError is the error PostSend and PostRecv return for the work request
// they refused: verbs' bad_wr. The WRs before Index were posted; Index and
// the WRs after it were not. It matches ErrInvalidWR or ErrQueueFull with
// errors.Is, and also the underlying memreg error when a local key failed.
type WRError struct {
	Op    string // "PostSend" or "PostRecv"
	QPN   uint32
	Index int    // index of the refused WR among the call's arguments
	WRID  uint64 // its wr_id
	// Field is the field at fault, e.g. "opcode", "remote_addr",
	// "num_sge", "sg_list" (the whole list, e.g. its total length), or one
	// SGE's "sg_list[1].lkey" (bad key or missing right), ".addr" (starts
	// outside its region) or ".length" (does not fit); "" for a full queue.
	Field string
	Msg   string // what is wrong with it
	Kind  error  // ErrInvalidWR or ErrQueueFull
	Err   error  // the underlying error (a memreg error for keys), or nil
}

// Error names the call, the QP and the work request (its index in the
// posted list and its ID), then the field, message and underlying error
// that apply.
func (e *WRError) Error() string {
	s := fmt.Sprintf("transport: %s qp %#x wr %d (wr_id %#x)", e.Op, e.QPN, e.Index, e.WRID)
	if e.Field != "" {
		s += ": " + e.Field
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s + ": " + e.Kind.Error()
}

// Unwrap returns the kind (ErrInvalidWR or ErrQueueFull) and the
// underlying error.
func (e *WRError) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}
