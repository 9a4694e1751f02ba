package cm

import (
	"errors"
	"fmt"
)

// Errors returned, wrapped in an *Error naming the message and field, by
// ParseMAD, Decode, the Fields' Decode methods, the views' Check methods and
// ParseCMAHeader; test with errors.Is.
var (
	// ErrTruncated: the buffer is shorter than the MAD or message.
	ErrTruncated = errors.New("truncated")
	// ErrLength: the buffer is longer than a MAD, or a length field
	// exceeds the room it describes.
	ErrLength = errors.New("bad length")
	// ErrUnsupported: a version, class, method or attribute this package
	// does not speak.
	ErrUnsupported = errors.New("unsupported")
	// ErrReserved: an enumerated field holds a value IBTA reserves.
	ErrReserved = errors.New("reserved value")
	// ErrMismatch: Encode was given a header whose attribute ID is not the
	// message's, or CMAHeader.Encode addresses of two families.
	ErrMismatch = errors.New("mismatch")
)

// Error is a decoding or encoding error: which message (or "MAD",
// "cma_hdr") and which field held which value, and why (one of the Err
// values above).
type Error struct {
	// Msg names the message or header: "MAD", "REQ", "SIDR_REP", "cma_hdr".
	Msg string
	// Field names the field as IBTA does, e.g. "path MTU".
	Field string
	// Value is the field's value (for "length", the buffer's length).
	Value uint64
	// Err is ErrTruncated, ErrLength, ErrUnsupported, ErrReserved or
	// ErrMismatch.
	Err error
}

// Error formats the error as "cm: REQ path MTU = 7: reserved value".
func (e *Error) Error() string {
	return fmt.Sprintf("cm: %s %s = %d (%#x): %v", e.Msg, e.Field, e.Value, e.Value, e.Err)
}

// Unwrap returns the reason, for errors.Is.
func (e *Error) Unwrap() error { return e.Err }

// need returns a truncation error unless len(b) >= n.
func need(msg string, b []byte, n int) error {
	if len(b) < n {
		return &Error{Msg: msg, Field: "length", Value: uint64(len(b)), Err: ErrTruncated}
	}
	return nil
}
