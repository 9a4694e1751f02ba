package nvme

import "fmt"

// Status is a completion status as Linux writes it (the CQE status field
// shifted right by one, dropping the phase tag): status code bits 7:0,
// status code type bits 10:8, More bit 13, Do Not Retry bit 14.
type Status uint16

// Status code types.
const (
	SCTGeneric         = 0
	SCTCommandSpecific = 1
	SCTMedia           = 2
	SCTPath            = 3
)

// Status bits.
const (
	StatusMore Status = 0x2000
	StatusDNR  Status = 0x4000
)

// Generic command status codes (SCT 0).
const (
	StatusSuccess             Status = 0x00
	StatusInvalidOpcode       Status = 0x01
	StatusInvalidField        Status = 0x02
	StatusCIDConflict         Status = 0x03
	StatusDataXferError       Status = 0x04
	StatusInternal            Status = 0x06
	StatusAbortReq            Status = 0x07
	StatusAbortSQDeletion     Status = 0x08
	StatusInvalidNamespace    Status = 0x0b
	StatusCmdSeqError         Status = 0x0c
	StatusSGLInvalidLast      Status = 0x0d
	StatusSGLInvalidCount     Status = 0x0e
	StatusSGLInvalidData      Status = 0x0f
	StatusSGLInvalidType      Status = 0x11
	StatusSGLInvalidOffset    Status = 0x16
	StatusNSWriteProtected    Status = 0x20
	StatusLBARange            Status = 0x80
	StatusCapacityExceeded    Status = 0x81
	StatusNSNotReady          Status = 0x82
	StatusInvalidQueue        Status = 0x101 // command specific: invalid queue identifier
	StatusInvalidLogPage      Status = 0x109
	StatusFeatureNotSaveable  Status = 0x10d
	StatusAERLimitExceeded    Status = 0x105
	StatusConnectFormat       Status = 0x180
	StatusConnectCtrlBusy     Status = 0x181
	StatusConnectInvalidParam Status = 0x182
	StatusConnectRestartDisc  Status = 0x183
	StatusConnectInvalidHost  Status = 0x184
	StatusWriteFault          Status = 0x280
	StatusReadError           Status = 0x281
	StatusAccessDenied        Status = 0x286
)

// SC returns the status code.
func (s Status) SC() uint8 { return uint8(s) }

// SCT returns the status code type.
func (s Status) SCT() uint8 { return uint8(s>>8) & 7 }

// DNR reports the Do Not Retry bit.
func (s Status) DNR() bool { return s&StatusDNR != 0 }

// Code returns the status without the More and DNR bits.
func (s Status) Code() Status { return s & 0x7ff }

// OK reports success.
func (s Status) OK() bool { return s.Code() == StatusSuccess }

var statusNames = map[Status]string{
	StatusSuccess: "success", StatusInvalidOpcode: "invalid opcode", StatusInvalidField: "invalid field",
	StatusCIDConflict: "command ID conflict", StatusDataXferError: "data transfer error",
	StatusInternal: "internal error", StatusAbortReq: "abort requested",
	StatusAbortSQDeletion: "aborted due to SQ deletion", StatusInvalidNamespace: "invalid namespace",
	StatusCmdSeqError: "command sequence error", StatusSGLInvalidLast: "invalid SGL last segment",
	StatusSGLInvalidCount: "invalid number of SGL descriptors", StatusSGLInvalidData: "invalid SGL data length",
	StatusSGLInvalidType: "invalid SGL descriptor type", StatusSGLInvalidOffset: "invalid SGL offset",
	StatusNSWriteProtected: "namespace write protected", StatusLBARange: "LBA out of range",
	StatusCapacityExceeded: "capacity exceeded", StatusNSNotReady: "namespace not ready",
	StatusInvalidQueue: "invalid queue identifier", StatusInvalidLogPage: "invalid log page",
	StatusFeatureNotSaveable: "feature not saveable", StatusAERLimitExceeded: "AER limit exceeded",
	StatusConnectFormat: "incompatible connect format", StatusConnectCtrlBusy: "controller busy",
	StatusConnectInvalidParam: "invalid connect parameters", StatusConnectRestartDisc: "restart discovery",
	StatusConnectInvalidHost: "invalid host", StatusWriteFault: "write fault", StatusReadError: "unrecovered read error",
	StatusAccessDenied: "access denied",
}

// String names the status, e.g. "LBA out of range (0x80, DNR)".
func (s Status) String() string {
	name, ok := statusNames[s.Code()]
	if !ok {
		name = "status"
	}
	if s.DNR() {
		return fmt.Sprintf("%s (%#x, DNR)", name, uint16(s.Code()))
	}
	return fmt.Sprintf("%s (%#x)", name, uint16(s.Code()))
}

// Error makes a non-success Status an error.
func (s Status) Error() string { return "nvme: " + s.String() }
