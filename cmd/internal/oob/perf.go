package oob

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"
)

// PerfVersion is the version perftest 4.5 (Debian 12, perftest 4.5+0.17)
// announces, and so do we: newer perftest (>= 6.28) then skips its binary
// parameter negotiation with us.
const PerfVersion = "6.06"

// VersionSize is the length of the version message (MAX_VERSION).
const VersionSize = 16

// Peer versions this package accepts: perftest 4.5 refuses peers older than
// 5.70 (check_version_compatibility); from 6.28 on a peer expects the binary
// perftest_parameters_negotiate exchange, which 4.5 does not speak.
const (
	MinPeerVersion = 5.70
	MaxPeerVersion = 6.28 // exclusive
)

// MTU is the ibv_mtu enum perftest exchanges: 1 = 256 B … 5 = 4096 B.
type MTU uint8

// IB MTU values.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Valid reports whether m is one of the five IB MTUs.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// Bytes returns the MTU in bytes (0 if invalid).
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the enum for 256, 512, 1024, 2048 or 4096; ok is false
// for any other size.
func MTUFromBytes(n int) (m MTU, ok bool) {
	for m = MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// Params are the system parameters perftest exchanges after the versions.
type Params struct {
	CycleBuffer uint32 // page size (sysconf(_SC_PAGESIZE)), 4096
	CacheLine   uint32 // cache line size, 64
	MTU         MTU    // active path MTU the side wants
}

// DefaultParams are what perftest 4.5 sends on x86-64 with MTU 1024.
var DefaultParams = Params{CycleBuffer: 4096, CacheLine: 64, MTU: MTU1024}

// Negotiate combines local p with the peer's remote the way perftest does:
// the larger cycle buffer and cache line, and the smaller MTU (the remote MTU
// only if it is valid).
func (p Params) Negotiate(remote Params) Params {
	n := p
	n.CycleBuffer = max(p.CycleBuffer, remote.CycleBuffer)
	n.CacheLine = max(p.CacheLine, remote.CacheLine)
	if remote.MTU.Valid() && p.MTU > remote.MTU {
		n.MTU = remote.MTU
	}
	return n
}

// ReportSize is the length of the bandwidth report exchange: five 8-byte
// values, each a separate lock-step exchange.
const ReportSize = 5 * 8

// Report is perftest's bandwidth report (struct bw_report_data) as exchanged
// by xchg_bw_reports with a peer >= 5.33: size and iters as big-endian
// uint64, the rest as big-endian IEEE-754 doubles. A perftest server sends
// uninitialised memory here (it never measures); only the client's report is
// meaningful, and the server prints it as the result.
type Report struct {
	Size    uint64  // message size in bytes
	Iters   uint64  // completed iterations (× QPs)
	BWPeak  float64 // peak bandwidth in the sender's unit: MiB/s (2^20 B/s), or Gb/s with --report_gbits
	BWAvg   float64 // average bandwidth, same unit
	MsgRate float64 // average message rate in Mpps
}

// Encode writes the 40 bytes of r, in exchange order, into b.
func (r Report) Encode(b []byte) {
	b = b[:ReportSize]
	binary.BigEndian.PutUint64(b[0:], r.Size)
	binary.BigEndian.PutUint64(b[8:], r.Iters)
	binary.BigEndian.PutUint64(b[16:], math.Float64bits(r.BWPeak))
	binary.BigEndian.PutUint64(b[24:], math.Float64bits(r.BWAvg))
	binary.BigEndian.PutUint64(b[32:], math.Float64bits(r.MsgRate))
}

// ParseReport decodes 40 bytes in exchange order.
func ParseReport(b []byte) (Report, error) {
	if len(b) != ReportSize {
		return Report{}, &ParseError{Message: "perftest report", Field: "length",
			Detail: fmt.Sprintf("%d bytes, want %d", len(b), ReportSize)}
	}
	return Report{
		Size:    binary.BigEndian.Uint64(b[0:]),
		Iters:   binary.BigEndian.Uint64(b[8:]),
		BWPeak:  math.Float64frombits(binary.BigEndian.Uint64(b[16:])),
		BWAvg:   math.Float64frombits(binary.BigEndian.Uint64(b[24:])),
		MsgRate: math.Float64frombits(binary.BigEndian.Uint64(b[32:])),
	}, nil
}

// reportFieldNames name the five report exchanges in errors.
var reportFieldNames = [5]string{"report size", "report iters", "report bw peak", "report bw avg", "report msg rate"}

// EncodeVersion writes v NUL-padded into a 16-byte version message. v is
// truncated to 15 bytes so that the message stays NUL-terminated.
func EncodeVersion(b []byte, v string) {
	b = b[:VersionSize]
	clear(b)
	copy(b[:VersionSize-1], v)
}

// ParseVersion returns the version string of a 16-byte version message (up
// to the first NUL) and its numeric value as perftest's atof computes it.
func ParseVersion(b []byte) (string, float64, error) {
	if len(b) != VersionSize {
		return "", 0, &ParseError{Message: "perftest version", Field: "length",
			Detail: fmt.Sprintf("%d bytes, want %d", len(b), VersionSize)}
	}
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	s := b[:n]
	// Leading decimal number, as atof reads it: digits [ '.' digits ].
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intDigits := i
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if intDigits == 0 {
		return string(s), 0, &ParseError{Message: "perftest version", Field: "version",
			Detail: fmt.Sprintf("%q is not a version number", printable(b))}
	}
	f, err := strconv.ParseFloat(string(s[:i]), 64)
	if err != nil {
		return string(s), 0, &ParseError{Message: "perftest version", Field: "version",
			Detail: fmt.Sprintf("%q: %v", printable(s), err)}
	}
	return string(s), f, nil
}

// CheckPeerVersion returns nil if a peer announcing version v (numeric value
// f) uses the exchange format of perftest 4.5, or an error matching
// ErrIncompatibleVersion that says why not.
func CheckPeerVersion(v string, f float64) error {
	switch {
	case f < MinPeerVersion:
		return fmt.Errorf("%w: peer announces %q; perftest 4.5 refuses versions older than %.2f", ErrIncompatibleVersion, v, MinPeerVersion)
	case f >= MaxPeerVersion:
		return fmt.Errorf("%w: peer announces %q; versions from %.2f on expect the binary parameter negotiation, which this implementation (announcing %s) does not speak", ErrIncompatibleVersion, v, MaxPeerVersion, PerfVersion)
	}
	return nil
}

// Perftest step names, as they appear in StepErrors.
const (
	PerfStepVersion     = "version"
	PerfStepCycleBuffer = "cycle buffer"
	PerfStepCacheLine   = "cache line"
	PerfStepMTU         = "mtu"
	PerfStepDest        = "qp data"
	PerfStepSync        = "sync"
	PerfStepDone        = "done"
	PerfStepCMSync      = "rdma_cm sync"
	PerfStepDestRound   = "qp data (second round)"
)

// PerfSession runs the perftest 4.5 exchange on one TCP connection. Use the
// step methods directly, or Run with a Plan. A PerfSession is not safe for
// concurrent use; it owns conn's deadlines while a step runs.
type PerfSession struct {
	// StepTimeout, if positive, bounds each wire step of Run (see Run).
	StepTimeout time.Duration

	c      stepConn
	role   Role
	rdmacm bool // perftest -R: QP data in the binary form, no done

	peerVersion string
	local       PerfDest
	remote      PerfDest
	haveLocal   bool
}

// NewPerfSession returns a session for conn playing role.
func NewPerfSession(conn net.Conn, role Role) *PerfSession {
	return &PerfSession{c: stepConn{conn: conn, proto: "perftest"}, role: role}
}

// NewPerfSessionRDMACM returns a session for perftest -R's exchange: conn
// carries each message as one RC SEND on the QP perftest connects through
// rdma_cm first (see PerfDestCMSize); QP data messages are the 56-byte
// binary struct, and the plan comes from PlanRDMACM. conn's Read must
// return one whole message per call.
func NewPerfSessionRDMACM(conn net.Conn, role Role) *PerfSession {
	return &PerfSession{c: stepConn{conn: conn, proto: "perftest rdma_cm"}, role: role, rdmacm: true}
}

// RDMACM reports whether the session runs perftest -R's exchange.
func (s *PerfSession) RDMACM() bool { return s.rdmacm }

// Role returns the session's role.
func (s *PerfSession) Role() Role { return s.role }

// PeerVersion returns the version the peer announced in Handshake.
func (s *PerfSession) PeerVersion() string { return s.peerVersion }

// Local returns the last QP data sent (ExchangeDest's local).
func (s *PerfSession) Local() PerfDest { return s.local }

// Remote returns the last QP data received from the peer.
func (s *PerfSession) Remote() PerfDest { return s.remote }

// Handshake exchanges versions (16 bytes, "6.06" NUL-padded) and checks the
// peer's with CheckPeerVersion. On an incompatible version the returned error
// matches ErrIncompatibleVersion; the caller should close the connection.
func (s *PerfSession) Handshake(ctx context.Context) (peerVersion string, err error) {
	var out, in [VersionSize]byte
	EncodeVersion(out[:], PerfVersion)
	if err := s.c.exchange(ctx, s.role, PerfStepVersion, out[:], in[:]); err != nil {
		return "", err
	}
	v, f, err := ParseVersion(in[:])
	if v == RDMACMVersion {
		return v, &StepError{Protocol: s.c.proto, Step: PerfStepVersion, Op: "check",
			Err: fmt.Errorf("%w: the server runs with -R (rdma_cm) and answers TCP clients only to say so: add -R here too", ErrModeMismatch)}
	}
	if err != nil {
		return v, &StepError{Protocol: s.c.proto, Step: PerfStepVersion, Op: "parse", Err: err}
	}
	s.peerVersion = v
	if err := CheckPeerVersion(v, f); err != nil {
		return v, &StepError{Protocol: s.c.proto, Step: PerfStepVersion, Op: "check", Err: err}
	}
	return v, nil
}

// ExchangeParams exchanges the cycle buffer (4-byte big-endian int), cache
// line size (likewise) and MTU (2 bytes: the ibv_mtu enum as one decimal
// digit and a NUL), in that order, and returns the peer's values. Combine them
// with Params.Negotiate.
func (s *PerfSession) ExchangeParams(ctx context.Context, local Params) (Params, error) {
	var remote Params
	if err := checkLocalMTU(local); err != nil {
		return remote, err
	}
	var err error
	if remote.CycleBuffer, err = s.exchangeCycleBuffer(ctx, local); err != nil {
		return remote, err
	}
	if remote.CacheLine, err = s.exchangeCacheLine(ctx, local); err != nil {
		return remote, err
	}
	remote.MTU, err = s.exchangeMTU(ctx, local)
	return remote, err
}

func (s *PerfSession) exchangeUint32(ctx context.Context, step string, v uint32) (uint32, error) {
	var out, in [4]byte
	binary.BigEndian.PutUint32(out[:], v)
	if err := s.c.exchange(ctx, s.role, step, out[:], in[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(in[:]), nil
}

func (s *PerfSession) exchangeCycleBuffer(ctx context.Context, local Params) (uint32, error) {
	return s.exchangeUint32(ctx, PerfStepCycleBuffer, local.CycleBuffer)
}

func (s *PerfSession) exchangeCacheLine(ctx context.Context, local Params) (uint32, error) {
	return s.exchangeUint32(ctx, PerfStepCacheLine, local.CacheLine)
}

func (s *PerfSession) exchangeMTU(ctx context.Context, local Params) (MTU, error) {
	if err := checkLocalMTU(local); err != nil {
		return 0, err
	}
	out := [2]byte{'0' + byte(local.MTU), 0}
	var in [2]byte
	if err := s.c.exchange(ctx, s.role, PerfStepMTU, out[:], in[:]); err != nil {
		return 0, err
	}
	m, err := ParseMTU(in[:])
	if err != nil {
		return 0, &StepError{Protocol: s.c.proto, Step: PerfStepMTU, Op: "parse", Err: err}
	}
	return m, nil
}

// ParseMTU parses the 2-byte MTU message ("3\0" = 1024 B).
func ParseMTU(b []byte) (MTU, error) {
	if len(b) != 2 {
		return 0, &ParseError{Message: "perftest mtu", Field: "length", Detail: fmt.Sprintf("%d bytes, want 2", len(b))}
	}
	m := MTU(b[0] - '0')
	if b[0] < '0' || b[0] > '9' || !m.Valid() {
		return 0, &ParseError{Message: "perftest mtu", Field: "mtu",
			Detail: fmt.Sprintf("%q is not an ibv_mtu enum 1..5", printable(b))}
	}
	if b[1] != 0 {
		return 0, &ParseError{Message: "perftest mtu", Field: "terminator",
			Detail: fmt.Sprintf("byte 1 is %q, want NUL", b[1])}
	}
	return m, nil
}

// ExchangeDest exchanges 108-byte QP data messages and returns the peer's.
// local is remembered and re-sent by Sync.
func (s *PerfSession) ExchangeDest(ctx context.Context, local PerfDest) (PerfDest, error) {
	if err := local.Validate(); err != nil {
		return PerfDest{}, &StepError{Protocol: s.c.proto, Step: PerfStepDest, Op: "check", Err: err}
	}
	s.local, s.haveLocal = local, true
	return s.exchangeDest(ctx, PerfStepDest)
}

// Sync is perftest's ctx_hand_shake used as a barrier: it re-exchanges the
// QP data last given to ExchangeDest (perftest sends the same message every
// time) and checks that the peer's parses.
func (s *PerfSession) Sync(ctx context.Context) error {
	if !s.haveLocal {
		return &StepError{Protocol: s.c.proto, Step: PerfStepSync, Op: "check",
			Err: fmt.Errorf("no local QP data yet: call ExchangeDest first")}
	}
	_, err := s.exchangeDest(ctx, PerfStepSync)
	return err
}

func (s *PerfSession) exchangeDest(ctx context.Context, step string) (PerfDest, error) {
	if s.rdmacm {
		return s.exchangeDestCM(ctx, step)
	}
	var out, in [PerfDestSize]byte
	s.local.Encode(out[:])
	if err := s.c.exchange(ctx, s.role, step, out[:], in[:]); err != nil {
		return PerfDest{}, err
	}
	d, err := ParsePerfDest(in[:])
	if err != nil {
		return PerfDest{}, &StepError{Protocol: s.c.proto, Step: step, Op: "parse", Err: err}
	}
	s.remote = d
	return d, nil
}

// exchangeDestCM is exchangeDest in perftest -R's binary form. An empty
// message (what perftest -R sends around its rdma_cm connection) where QP
// data belongs means the peer's exchange runs a different sequence.
func (s *PerfSession) exchangeDestCM(ctx context.Context, step string) (PerfDest, error) {
	var out, in [PerfDestCMSize]byte
	s.local.EncodeCM(out[:])
	if err := s.c.exchange(ctx, s.role, step, out[:], in[:]); err != nil {
		return PerfDest{}, err
	}
	d, err := ParsePerfDestCM(in[:])
	if err != nil {
		return PerfDest{}, &StepError{Protocol: s.c.proto, Step: step, Op: "parse", Err: err}
	}
	if emptyCM(in[:]) {
		return PerfDest{}, &StepError{Protocol: s.c.proto, Step: step, Op: "check",
			Err: fmt.Errorf("%w: the peer sent an empty QP data message (all zero), which perftest -R sends only around its rdma_cm connection: the two sides run different exchanges", ErrModeMismatch)}
	}
	s.remote = d
	return d, nil
}

// ExchangeReport exchanges bandwidth reports: five lock-step exchanges of 8
// bytes (size, iters, bw peak, bw avg, msg rate). The server's values are
// meaningless with a real perftest server; it is the client's report the
// server prints.
func (s *PerfSession) ExchangeReport(ctx context.Context, local Report) (Report, error) {
	var out, in [ReportSize]byte
	local.Encode(out[:])
	for i := 0; i < 5; i++ {
		o := 8 * i
		if err := s.c.exchange(ctx, s.role, reportFieldNames[i], out[o:o+8], in[o:o+8]); err != nil {
			return Report{}, err
		}
	}
	return ParseReport(in[:])
}

// Done is perftest's goodbye: each side writes "done\0" without waiting for
// the other (then closes). Done writes ours and reads the peer's concurrently,
// so it works against the real tool and against itself on a synchronous
// net.Pipe. Once the peer's "done\0" has arrived, a failure to write ours
// (the tool may already have closed) is not an error.
func (s *PerfSession) Done(ctx context.Context) error {
	if s.rdmacm {
		return &StepError{Protocol: s.c.proto, Step: PerfStepDone, Op: "check",
			Err: errors.New("perftest -R says no done over rdma_cm (ctx_close_connection skips it)")}
	}
	return s.c.run(ctx, PerfStepDone, func() (string, error) {
		werr := make(chan error, 1)
		go func() { werr <- s.c.write(doneMsg[:]) }()
		var in [len(doneMsg)]byte
		rerr := s.c.read(in[:])
		if rerr != nil {
			// Unblock the writer (synchronous pipes) before waiting for it.
			_ = s.c.conn.SetWriteDeadline(aLongTimeAgo)
			<-werr
			return "read", rerr
		}
		if in != doneMsg {
			_ = s.c.conn.SetWriteDeadline(aLongTimeAgo)
			<-werr
			return "parse", &ParseError{Message: "perftest done", Field: "payload",
				Detail: fmt.Sprintf("got %q, want \"done\\0\"", printable(in[:]))}
		}
		<-werr
		return "", nil
	})
}

func checkLocalMTU(local Params) error {
	if local.MTU.Valid() {
		return nil
	}
	return &StepError{Protocol: "perftest", Step: PerfStepMTU, Op: "check",
		Err: &ParseError{Message: "perftest mtu", Field: "mtu", Detail: fmt.Sprintf("local MTU enum %d is not 1..5", local.MTU)}}
}
