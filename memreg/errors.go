package memreg

import (
	"errors"
	"fmt"

	"github.com/gorocev2/rocev2/aeth"
)

// Sentinel errors. Every error this package returns wraps exactly one of
// them, so callers can test with errors.Is; remote and local accesses wrap
// it in an *AccessError that names the operation, key, address and length.
var (
	// ErrUnknownKey: the key's 24-bit index was never handed out.
	ErrUnknownKey = errors.New("unknown key")
	// ErrStaleKey: the index exists but the key byte is not the one of the
	// registration (or window binding) that is live now, or the
	// registration is gone. A key of another Table (another device) whose
	// index happens to be in use here is reported this way as well.
	ErrStaleKey = errors.New("unknown key (stale, or from another device)")
	// ErrWrongPD: the key belongs to another protection domain.
	ErrWrongPD = errors.New("key belongs to another protection domain")
	// ErrWrongQP: a type 2 memory window is used from a QP other than the
	// one it is bound to.
	ErrWrongQP = errors.New("type 2 memory window is bound to another QP")
	// ErrNotBound: the key names a memory window that is not bound.
	ErrNotBound = errors.New("memory window is not bound")
	// ErrKeyType: the key names the wrong kind of object (for example a
	// memory window used as an lkey, or an MR used where a window is needed).
	ErrKeyType = errors.New("key names the wrong kind of object")
	// ErrAccessDenied: the registration lacks a required access right.
	ErrAccessDenied = errors.New("access right missing")
	// ErrOutOfBounds: the access is not inside the registration.
	ErrOutOfBounds = errors.New("out of bounds")
	// ErrAddressWrap: va+length overflows the 64-bit address space.
	ErrAddressWrap = errors.New("va+length wraps the address space")
	// ErrMisaligned: an atomic targets an address that is not 8-byte aligned.
	ErrMisaligned = errors.New("atomic address not 8-byte aligned")
	// ErrLength: a length is malformed: a DMA length above 2^31, or data
	// that does not fit the scatter/gather list.
	ErrLength = errors.New("invalid length")
	// ErrInvalidAccessFlags: the flags break a verbs rule (unknown bits,
	// remote write/atomic without local write, rights a window cannot carry).
	ErrInvalidAccessFlags = errors.New("invalid access flags")
	// ErrInvalidArgument: another malformed argument (empty buffer, nil
	// object, zero-length type 2 bind, ...).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrBadAddress is RegisterMR's error for memory that cannot be
	// accessed as asked: a read-only mapping registered with a write
	// right, or an unmapped page (ibv_reg_mr's EFAULT).
	ErrBadAddress = errors.New("bad address")
	// ErrInvalidState: the object is in the wrong state for the operation
	// (type 2 window bound twice, type 1 window invalidated, ...).
	ErrInvalidState = errors.New("invalid state")
	// ErrLimit: a table limit (regions, bytes, PDs, windows, keys) is reached.
	ErrLimit = errors.New("limit reached")
	// ErrBusy: the object is still in use (an MR with bound windows, a PD
	// with live regions or windows, or one that queue pairs or SRQs hold:
	// PD.Acquire). transport.ErrBusy is this same error.
	ErrBusy = errors.New("busy")
	// ErrClosed: the object was already deregistered / deallocated.
	ErrClosed = errors.New("already released")
	// ErrTableClosed: the table's owner closed it (Table.Close); the error
	// also wraps the owner's cause, such as transport.ErrClosed.
	ErrTableClosed = errors.New("table closed")
)

var (
	errUnknownFlags          = fmt.Errorf("%w: unknown flag bits", ErrInvalidAccessFlags)
	errRemoteNeedsLocalWrite = fmt.Errorf("%w: remote write/atomic requires local write", ErrInvalidAccessFlags)
)

// Op names the operation an AccessError comes from.
type Op uint8

// Operations.
const (
	OpCheck            Op = iota + 1 // CheckRemote / Lookup
	OpWrite                          // WriteRemote / Target.Write
	OpRead                           // ReadRemote / Target.Read
	OpCompareSwap                    // CompareSwap
	OpFetchAdd                       // FetchAdd
	OpInvalidateRemote               // InvalidateRemote (SEND with Invalidate)
	OpInvalidateLocal                // InvalidateLocal / MW.Invalidate
	OpCheckSGE                       // CheckSGEs
	OpGather                         // Gather
	OpScatter                        // Scatter
	OpBind                           // MW.Bind / MW.BindQP
)

var opNames = [...]string{
	OpCheck:            "check",
	OpWrite:            "write",
	OpRead:             "read",
	OpCompareSwap:      "compare-swap",
	OpFetchAdd:         "fetch-add",
	OpInvalidateRemote: "remote-invalidate",
	OpInvalidateLocal:  "local-invalidate",
	OpCheckSGE:         "sge-check",
	OpGather:           "gather",
	OpScatter:          "scatter",
	OpBind:             "bind",
}

// String returns the operation's name ("write", "fetch-add", ...).
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// local reports whether the operation works on the consumer's own
// scatter/gather lists (lkeys) rather than on a peer's request.
func (o Op) local() bool { return o == OpCheckSGE || o == OpGather || o == OpScatter }

// AccessError describes a failed access: which operation, with which key,
// address and length, and which rule failed (Err, one of the sentinels).
type AccessError struct {
	Op     Op
	Key    uint32 // rkey, lkey, or window rkey
	VA     uint64 // address in the key's IOVA space (for SGEs: the SGE's Addr)
	Len    uint64 // length of the access
	Err    error  // the rule that failed: a sentinel, possibly wrapped
	Detail string // what the registration offers, when useful ("region [0x1000,0x2000)")
}

// Error names the operation, the values and the failed rule.
func (e *AccessError) Error() string {
	s := fmt.Sprintf("memreg: %s key %#08x va %#x len %d: %v", e.Op, e.Key, e.VA, e.Len, e.Err)
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

// Unwrap returns the failed rule.
func (e *AccessError) Unwrap() error { return e.Err }

// NAKCode returns the NAK a responder sends for a failed access, following
// IBTA and Linux rxe (rxe_resp.c):
//
//   - unknown/stale/wrong-PD/wrong-QP/unbound key, wrong key type, missing
//     right, out of bounds, address wrap: Remote Access Error
//     (rxe: RESPST_ERR_RKEY_VIOLATION);
//   - misaligned atomic, DMA length above 2^31, data longer than the
//     receive SGE list, invalid flags: Invalid Request
//     (rxe: RESPST_ERR_MISALIGNED_ATOMIC, RESPST_ERR_LENGTH);
//   - a failed SEND-with-Invalidate: Invalid Request (IBTA; rxe completes
//     with IB_WC_REM_INV_REQ_ERR);
//   - any other failure of the responder's own receive SGEs (bad lkey,
//     bounds, rights): Remote Operational Error (rxe:
//     RESPST_ERR_MALFORMED_WQE);
//   - anything else, including nil: Remote Operational Error.
func NAKCode(err error) aeth.NAKCode {
	if err == nil {
		return aeth.NAKRemoteOperationalError
	}
	var ae *AccessError
	if errors.As(err, &ae) {
		switch {
		case ae.Op == OpInvalidateRemote:
			return aeth.NAKInvalidRequest
		case ae.Op.local():
			if errors.Is(err, ErrLength) {
				return aeth.NAKInvalidRequest
			}
			return aeth.NAKRemoteOperationalError
		}
	}
	switch {
	case errors.Is(err, ErrMisaligned), errors.Is(err, ErrLength),
		errors.Is(err, ErrInvalidAccessFlags):
		return aeth.NAKInvalidRequest
	case errors.Is(err, ErrUnknownKey), errors.Is(err, ErrStaleKey),
		errors.Is(err, ErrWrongPD), errors.Is(err, ErrWrongQP),
		errors.Is(err, ErrNotBound), errors.Is(err, ErrKeyType),
		errors.Is(err, ErrAccessDenied), errors.Is(err, ErrOutOfBounds),
		errors.Is(err, ErrAddressWrap):
		return aeth.NAKRemoteAccessError
	}
	return aeth.NAKRemoteOperationalError
}
