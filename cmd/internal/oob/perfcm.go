package oob

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// The rdma_cm form of perftest's exchange (-R, perftest 4.5-0.17
// src/perftest_communication.c): the same lock-step messages as over TCP,
// each one RC SEND on a QP that perftest connects through rdma_cm on the
// same port (-p, default 18515) before anything else; the peer receives
// each into a single 56-byte receive buffer. The QP data is not text there
// but struct pingpong_dest as it lies in memory on x86-64 with every field
// big-endian (rdma_write_keys / rdma_read_keys with HAVE_ENDIAN):
//
//	 0 lid        int32        4 out_reads  int32
//	 8 qpn        int32       12 psn        int32
//	16 rkey       uint32      20 (padding: whatever was on the sender's stack)
//	24 vaddr      uint64      32 gid        16 bytes
//	48 srqn       uint32      52 gid_index  int32
//
// The receiver reads lid, out_reads, qpn, psn, rkey, vaddr and gid.

// PerfDestCMSize is the length of the QP data message over rdma_cm:
// sizeof(struct pingpong_dest) on x86-64.
const PerfDestCMSize = 56

// Offsets in the binary QP data message.
const (
	pdcLIDOff      = 0
	pdcOutReadsOff = 4
	pdcQPNOff      = 8
	pdcPSNOff      = 12
	pdcRKeyOff     = 16
	pdcPadOff      = 20
	pdcVAddrOff    = 24
	pdcGIDOff      = 32
	pdcSRQNOff     = 48
	pdcGIDIndexOff = 52
	pdcMsgName     = "perftest rdma_cm qp data"
)

// ErrModeMismatch reports a peer that runs perftest's exchange in another
// mode (with or without -R, or -z) than this side.
var ErrModeMismatch = errors.New("perftest mode mismatch")

// RDMACMVersion is what a rocev2d server with -R answers on TCP, in the
// place of the version, to a client that connects there: perftest -R
// listens through rdma_cm only, and rocev2d listens on TCP as well just
// to tell clients without -R (and rocev2d clients with -R that look for a
// server without it) which mode it runs. Not a version number: a perftest
// client refuses it, a rocev2d one names the mismatch.
const RDMACMVersion = "rdma_cm"

// EncodeCM writes d as the 56-byte binary message into b, which must be at
// least PerfDestCMSize long. The padding and gid_index are written as zero.
func (d PerfDest) EncodeCM(b []byte) {
	b = b[:PerfDestCMSize]
	clear(b)
	be := binary.BigEndian
	be.PutUint32(b[pdcLIDOff:], uint32(d.LID))
	be.PutUint32(b[pdcOutReadsOff:], uint32(d.OutReads))
	be.PutUint32(b[pdcQPNOff:], d.QPN&0xffffff)
	be.PutUint32(b[pdcPSNOff:], d.PSN&0xffffff)
	be.PutUint32(b[pdcRKeyOff:], d.RKey)
	be.PutUint64(b[pdcVAddrOff:], d.VAddr)
	copy(b[pdcGIDOff:pdcGIDOff+16], d.GID[:])
	be.PutUint32(b[pdcSRQNOff:], d.SRQN)
}

// MarshalCM returns the 56-byte binary message for d.
func (d PerfDest) MarshalCM() []byte {
	b := make([]byte, PerfDestCMSize)
	d.EncodeCM(b)
	return b
}

// ParsePerfDestCM parses a 56-byte binary QP data message. It refuses
// values perftest cannot send: a LID or out_reads beyond 16 bits, a QPN or
// PSN beyond 24 bits (perftest masks its PSN to 24 bits). The padding and
// gid_index are ignored, as perftest ignores them.
func ParsePerfDestCM(b []byte) (PerfDest, error) {
	var d PerfDest
	if len(b) != PerfDestCMSize {
		return d, &ParseError{Message: pdcMsgName, Field: "length",
			Detail: fmt.Sprintf("%d bytes, want %d", len(b), PerfDestCMSize)}
	}
	be := binary.BigEndian
	for _, f := range [...]struct {
		name string
		off  int
		max  uint32
	}{
		{"lid", pdcLIDOff, 0xffff}, {"out_reads", pdcOutReadsOff, 0xffff},
		{"qpn", pdcQPNOff, 0xffffff}, {"psn", pdcPSNOff, 0xffffff},
	} {
		if v := be.Uint32(b[f.off:]); v > f.max {
			return d, &ParseError{Message: pdcMsgName, Field: f.name,
				Detail: fmt.Sprintf("%#x at offset %d does not fit in %#x", v, f.off, f.max)}
		}
	}
	d.LID = uint16(be.Uint32(b[pdcLIDOff:]))
	d.OutReads = uint16(be.Uint32(b[pdcOutReadsOff:]))
	d.QPN = be.Uint32(b[pdcQPNOff:])
	d.PSN = be.Uint32(b[pdcPSNOff:])
	d.RKey = be.Uint32(b[pdcRKeyOff:])
	d.VAddr = be.Uint64(b[pdcVAddrOff:])
	copy(d.GID[:], b[pdcGIDOff:pdcGIDOff+16])
	d.SRQN = be.Uint32(b[pdcSRQNOff:])
	return d, nil
}

// emptyCM reports whether b is perftest's empty QP data message: the
// zeroed struct pingpong_dest that perftest -R exchanges right before and
// right after connecting its QPs through rdma_cm (create_rdma_cm_connection
// hands ctx_hand_shake the freshly zeroed my_dest). The padding may hold
// anything.
func emptyCM(b []byte) bool {
	for i, c := range b {
		if c != 0 && (i < pdcPadOff || i >= pdcVAddrOff) {
			return false
		}
	}
	return true
}

// CMSync is one of the two exchanges perftest -R makes around connecting
// its QPs through rdma_cm: an empty (zeroed) 56-byte QP data message each
// way. A peer that sends real QP data here runs with -z (the exchange over
// rdma_cm, but its QPs connected from the QP data, without the CM): the
// error then matches ErrModeMismatch.
func (s *PerfSession) CMSync(ctx context.Context) error {
	if !s.rdmacm {
		return &StepError{Protocol: s.c.proto, Step: PerfStepCMSync, Op: "check",
			Err: errors.New("the rdma_cm sync belongs to perftest -R's exchange; this session runs over TCP")}
	}
	var out, in [PerfDestCMSize]byte
	if err := s.c.exchange(ctx, s.role, PerfStepCMSync, out[:], in[:]); err != nil {
		return err
	}
	if !emptyCM(in[:]) {
		d, _ := ParsePerfDestCM(in[:])
		return &StepError{Protocol: s.c.proto, Step: PerfStepCMSync, Op: "check",
			Err: fmt.Errorf("%w: the peer sent QP data (QPN %#x, rkey %#x) where perftest -R sends an empty message before connecting its QPs through rdma_cm: the peer runs with -z (exchange over rdma_cm, QPs connected without the CM), which is not supported; run both sides with -R",
				ErrModeMismatch, d.QPN, d.RKey)}
	}
	return nil
}
