package oob

import (
	"context"
	"errors"
	"fmt"
)

// MaxPerfQPs is perftest's MAX_QP_NUM, the largest -q.
const MaxPerfQPs = 16384

// ErrQPCountMismatch reports a perftest peer that runs another number of
// QPs (-q) than this side; a *QPCountError says how many.
var ErrQPCountMismatch = errors.New("QP count mismatch")

// QPCountError is a -q mismatch found in the QP data exchange. perftest 4.5
// does not exchange num_of_qps: each side sends one QP data record per QP,
// twice (before and after ctx_connect), then its first record at every
// barrier, so the records themselves reveal the peer's count — a repeat of
// its first record where another QP's belongs (the peer has fewer), or a
// new record where the repeat belongs (it has more). In the second case this
// side keeps exchanging (sending its first record, as perftest's barriers
// do) until the peer's first record comes round again, which tells its
// count; a peer that hangs up first leaves a lower bound (AtLeast).
type QPCountError struct {
	Local   int  // this side's QPs
	Remote  int  // the peer's QPs (a lower bound if AtLeast)
	AtLeast bool // the peer hung up before its count was known
	Cause   error
}

// Error implements error.
func (e *QPCountError) Error() string {
	peer := fmt.Sprintf("the peer runs %s (-q %d)", qpCount(e.Remote), e.Remote)
	if e.AtLeast {
		why := "then hung up"
		if !errors.Is(e.Cause, ErrPeerClosed) {
			why = fmt.Sprintf("then: %v", e.Cause)
		}
		peer = fmt.Sprintf("the peer runs at least %s (it sent that many QP data records, %s)", qpCount(e.Remote), why)
	}
	return fmt.Sprintf("%v: %s, this side %s (-q %d); perftest sends one QP data record per QP and both sides need the same -q",
		ErrQPCountMismatch, peer, qpCount(e.Local), e.Local)
}

func qpCount(n int) string {
	if n == 1 {
		return "1 QP"
	}
	return fmt.Sprintf("%d QPs", n)
}

// Unwrap returns ErrQPCountMismatch (and the cause of an AtLeast count).
func (e *QPCountError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrQPCountMismatch, e.Cause}
	}
	return []error{ErrQPCountMismatch}
}

// exchangeDests is the first round of QP data: one record per local QP,
// lock-step. A record that names the peer's first QP again means the peer
// has fewer QPs: it has moved on to its second round.
func (s *PerfSession) exchangeDests(ctx context.Context, locals []PerfDest) ([]PerfDest, error) {
	remotes := make([]PerfDest, 0, len(locals))
	for i, l := range locals {
		d, err := s.ExchangeDest(ctx, l)
		if err != nil {
			return remotes, err
		}
		if i > 0 && d.QPN == remotes[0].QPN {
			s.local = locals[0]
			return remotes, &StepError{Protocol: s.c.proto, Step: PerfStepDest, Op: "check",
				Err: &QPCountError{Local: len(locals), Remote: i}}
		}
		remotes = append(remotes, d)
	}
	s.local = locals[0] // what every later barrier sends
	return remotes, nil
}

// exchangeDestsAgain is the second round (perftest prints the peer's
// records here): each record again, which must name the same QPs. A new
// QP where the peer's first belongs, right after the first round, means
// the peer has more QPs; the exchange then goes on to count them
// (QPCountError).
func (s *PerfSession) exchangeDestsAgain(ctx context.Context, locals, remotes []PerfDest, justDest bool) error {
	defer func() { s.local = locals[0] }()
	for i, l := range locals {
		s.local = l
		d, err := s.exchangeDest(ctx, PerfStepDestRound)
		if err != nil {
			return err
		}
		if d.QPN == remotes[i].QPN {
			continue
		}
		return s.recordMismatch(ctx, PerfStepDestRound, locals, remotes, i, d, justDest && i == 0)
	}
	return nil
}

// syncChecked is Sync for a run over TCP that knows the peer's records:
// perftest's barriers re-send the first record, so the peer's must name its
// first QP again.
func (s *PerfSession) syncChecked(ctx context.Context, locals, remotes []PerfDest, justDest bool) error {
	if !s.haveLocal {
		return s.Sync(ctx) // the error
	}
	d, err := s.exchangeDest(ctx, PerfStepSync)
	if err != nil || d.QPN == remotes[0].QPN {
		return err
	}
	return s.recordMismatch(ctx, PerfStepSync, locals, remotes, 0, d, justDest)
}

// recordMismatch is the error for the peer's record d where a repeat of
// its record i belonged. Right after the first round (count) it is the
// peer's next QP: count them.
func (s *PerfSession) recordMismatch(ctx context.Context, step string, locals, remotes []PerfDest, i int, d PerfDest, count bool) error {
	if count {
		return &StepError{Protocol: s.c.proto, Step: step, Op: "check", Err: s.countPeerQPs(ctx, locals, remotes[0])}
	}
	return &StepError{Protocol: s.c.proto, Step: step, Op: "check",
		Err: fmt.Errorf("%w: the peer's QP data for QP %d names QPN %#x, first %#x", ErrModeMismatch, i, d.QPN, remotes[i].QPN)}
}

// countPeerQPs counts the peer's first-round records after its record
// number len(locals) arrived where the repeat of first belonged: it sends
// the rest of this side's second round and then its first record, as
// perftest would, until first comes round again.
func (s *PerfSession) countPeerQPs(ctx context.Context, locals []PerfDest, first PerfDest) error {
	n := len(locals)
	seen := n + 1 // records 0..n
	for next := 1; seen <= MaxPerfQPs; next++ {
		s.local = locals[0]
		if next < n {
			s.local = locals[next]
		}
		d, err := s.exchangeDest(ctx, PerfStepDestRound)
		if err != nil {
			return &QPCountError{Local: n, Remote: seen, AtLeast: true, Cause: err}
		}
		if d.QPN == first.QPN {
			return &QPCountError{Local: n, Remote: seen}
		}
		seen++
	}
	return &QPCountError{Local: n, Remote: seen, AtLeast: true, Cause: fmt.Errorf("more than perftest's maximum of %d", MaxPerfQPs)}
}
