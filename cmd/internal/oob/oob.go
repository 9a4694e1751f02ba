// Package oob implements the out-of-band TCP exchanges that rdma-core's
// ibv_{rc,uc,ud,srq}_pingpong and perftest 4.5 (ib_write_bw, ib_read_lat, …) use to
// swap queue-pair parameters before any RDMA traffic flows, so that rocev2d can
// talk to the real tools and to itself.
//
// Two protocols live here:
//
//   - Pingpong (ibv_*_pingpong, TCP 18515): the client writes its 52-byte
//     [PingpongDest], reads the server's, and writes "done\0". See
//     [PingpongClient] and [PingpongServer]. ibv_srq_pingpong sends
//     [SRQPingpongMaxQP] of them each way, one per QP and zero entries
//     after: [SRQPingpongClient] and [SRQPingpongServer].
//   - Perftest 4.5 (TCP 18515): a fixed sequence of lock-step exchanges —
//     version, cycle buffer, cache line, MTU, 108-byte [PerfDest] messages used
//     both for the QP data and as barriers, bandwidth reports, "done\0". See
//     [PerfSession] and [Plan]. With -R the same messages run as SENDs over a
//     connection made through rdma_cm, the QP data as perftest's 56-byte
//     binary struct, with the test QP's own rdma_cm connection between two
//     empty ones and no "done": [NewPerfSessionRDMACM], [PlanRDMACM],
//     [PerfDestCMSize]. The caller supplies that connection as a net.Conn
//     whose Reads return whole messages.
//
// Every exchange is client-writes-then-reads, server-reads-then-writes, as the
// tools do. Every message is written with a single Write call, because the
// tools read each message with a single read(2) of the exact size.
//
// All functions take a [context.Context]; its deadline and cancellation are
// applied to the net.Conn (the exchange owns the connection's deadlines while
// it runs and clears them afterwards). Errors name the step that failed and
// match [ErrMalformed], [ErrPeerClosed], [ErrIncompatibleVersion],
// [context.DeadlineExceeded] or [context.Canceled] with errors.Is.
//
// It imports nothing of this module (the standard library only) and serves
// cmd/rocev2d, the only package that may import it.
package oob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// DefaultPort is the TCP port on which ibv_*_pingpong and perftest exchange
// their out-of-band data.
const DefaultPort = 18515

// Sentinel errors; test with errors.Is.
var (
	// ErrMalformed reports a message that does not have the tools' format.
	ErrMalformed = errors.New("malformed out-of-band message")
	// ErrPeerClosed reports that the peer closed (or reset) the connection
	// before a complete message arrived.
	ErrPeerClosed = errors.New("peer closed the connection")
	// ErrIncompatibleVersion reports a perftest peer whose version announces
	// an exchange format this package does not speak.
	ErrIncompatibleVersion = errors.New("incompatible perftest version")
)

// ParseError describes a malformed message: which message, which field, what
// is wrong. It matches ErrMalformed with errors.Is.
type ParseError struct {
	Message string // "pingpong dest", "perftest qp data", …
	Field   string // "qpn", "gid[3]", "length", …
	Detail  string
}

// Error implements error.
func (e *ParseError) Error() string {
	return fmt.Sprintf("oob: malformed %s: %s: %s", e.Message, e.Field, e.Detail)
}

// Unwrap returns ErrMalformed.
func (e *ParseError) Unwrap() error { return ErrMalformed }

// StepError reports the failure of one step of an exchange. Err carries the
// cause (a *ParseError, ErrPeerClosed, a context error, a net error …).
type StepError struct {
	Protocol string // "pingpong" or "perftest"
	Step     string // "qp data", "sync", "done", …
	Op       string // "read", "write", "parse", "check" or "local"
	Err      error
}

// Error implements error.
func (e *StepError) Error() string {
	return fmt.Sprintf("oob: %s step %q: %s: %v", e.Protocol, e.Step, e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *StepError) Unwrap() error { return e.Err }

// Role says which side of an exchange a party plays. The client is the side
// that was given the server's address (perftest: servername != NULL).
type Role uint8

// Roles.
const (
	Client Role = iota + 1
	Server
)

// String returns "client" or "server".
func (r Role) String() string {
	switch r {
	case Client:
		return "client"
	case Server:
		return "server"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// doneMsg is what both tools write to say goodbye: "done" with its NUL.
var doneMsg = [5]byte{'d', 'o', 'n', 'e', 0}

// aLongTimeAgo is a deadline in the past, used to interrupt blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// stepConn runs the I/O of one protocol on a net.Conn with context handling.
type stepConn struct {
	conn  net.Conn
	proto string
}

// run executes fn with ctx's deadline on the connection and with cancellation
// of ctx interrupting it. Errors returned by fn are converted to StepErrors
// naming step.
func (c *stepConn) run(ctx context.Context, step string, fn func() (op string, err error)) error {
	if err := ctx.Err(); err != nil {
		return &StepError{Protocol: c.proto, Step: step, Op: "start", Err: err}
	}
	if d, ok := ctx.Deadline(); ok {
		_ = c.conn.SetDeadline(d)
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.conn.SetDeadline(aLongTimeAgo)
		close(fired)
	})
	op, err := fn()
	if !stop() {
		<-fired
	}
	_ = c.conn.SetDeadline(time.Time{})
	if err == nil {
		return nil
	}
	if isTimeout(err) {
		cerr := context.Cause(ctx)
		if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
			// The conn's timer fired just before the context's: wait for it
			// to get the context's cause.
			select {
			case <-ctx.Done():
				cerr = context.Cause(ctx)
			case <-time.After(100 * time.Millisecond):
				cerr = context.DeadlineExceeded
			}
		}
		if cerr != nil {
			err = fmt.Errorf("%w (%w)", cerr, err)
		}
	}
	return &StepError{Protocol: c.proto, Step: step, Op: op, Err: err}
}

// write writes b with a single Write call.
func (c *stepConn) write(b []byte) error {
	n, err := c.conn.Write(b)
	if err != nil {
		if isReset(err) {
			return fmt.Errorf("%w after %d of %d bytes: %w", ErrPeerClosed, n, len(b), err)
		}
		return err
	}
	if n != len(b) {
		return fmt.Errorf("short write: %d of %d bytes", n, len(b))
	}
	return nil
}

// read fills b completely.
func (c *stepConn) read(b []byte) error {
	n, err := io.ReadFull(c.conn, b)
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
		return fmt.Errorf("%w after %d of %d bytes", ErrPeerClosed, n, len(b))
	}
	if n > 0 {
		return fmt.Errorf("after %d of %d bytes: %w", n, len(b), err)
	}
	return err
}

// exchange performs one lock-step exchange of fixed-size messages: the
// client writes out then reads in; the server reads in then writes out.
func (c *stepConn) exchange(ctx context.Context, role Role, step string, out, in []byte) error {
	return c.run(ctx, step, func() (string, error) {
		if role == Client {
			if err := c.write(out); err != nil {
				return "write", err
			}
			if err := c.read(in); err != nil {
				return "read", err
			}
			return "", nil
		}
		if err := c.read(in); err != nil {
			return "read", err
		}
		if err := c.write(out); err != nil {
			return "write", err
		}
		return "", nil
	})
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrClosedPipe)
}

// Hex helpers (lower-case output, either case accepted on input).

const hexDigits = "0123456789abcdef"

// putHex writes v as exactly len(b) lower-case hex digits (the low 4*len(b)
// bits of v).
func putHex(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = hexDigits[v&0xf]
		v >>= 4
	}
}

// unhex returns the value of one hex digit, or -1.
func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// parseHex parses b, which must be all hex digits (len(b) <= 16).
func parseHex(msg, field string, b []byte) (uint64, error) {
	var v uint64
	for i, c := range b {
		d := unhex(c)
		if d < 0 {
			return 0, &ParseError{Message: msg, Field: field,
				Detail: fmt.Sprintf("bad hex digit %q at offset %d of %q", c, i, printable(b))}
		}
		v = v<<4 | uint64(d)
	}
	return v, nil
}

// expectByte checks that b[off] == want; suffix is appended to the field
// name in the error (only then, to keep the success path allocation-free).
func expectByte(msg, field, suffix string, b []byte, off int, want byte) error {
	if b[off] != want {
		return &ParseError{Message: msg, Field: field + suffix,
			Detail: fmt.Sprintf("byte %d is %q, want %q", off, b[off], want)}
	}
	return nil
}

// printable renders b for an error message, escaping non-printable bytes.
func printable(b []byte) string {
	const max = 120
	if len(b) > max {
		b = b[:max]
	}
	out := make([]byte, 0, len(b))
	for _, c := range b {
		switch {
		case c == 0:
			out = append(out, '\\', '0')
		case c < 0x20 || c >= 0x7f:
			out = append(out, '\\', 'x', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			out = append(out, c)
		}
	}
	return string(out)
}
