package oob

import (
	"context"
	"fmt"
)

// PerfTest names a perftest program.
type PerfTest uint8

// The perftest programs whose exchange sequences Plan knows.
const (
	WriteBW PerfTest = iota + 1
	ReadBW
	SendBW
	AtomicBW
	WriteLat
	ReadLat
	SendLat
	AtomicLat
)

var perfTestNames = [...]string{
	WriteBW: "write-bw", ReadBW: "read-bw", SendBW: "send-bw", AtomicBW: "atomic-bw",
	WriteLat: "write-lat", ReadLat: "read-lat", SendLat: "send-lat", AtomicLat: "atomic-lat",
}

// String returns the rocev2d subcommand name ("write-bw", …).
func (t PerfTest) String() string {
	if int(t) < len(perfTestNames) && perfTestNames[t] != "" {
		return perfTestNames[t]
	}
	return fmt.Sprintf("PerfTest(%d)", uint8(t))
}

// Valid reports whether t is one of the known tests.
func (t PerfTest) Valid() bool { return t >= WriteBW && t <= AtomicLat }

// IsBW reports whether t is a bandwidth test.
func (t PerfTest) IsBW() bool { return t >= WriteBW && t <= AtomicBW }

// Step is one element of a perftest exchange plan: either a wire exchange or
// a local action the caller performs through Hooks.
type Step uint8

// Plan steps.
const (
	StepVersion     Step = iota + 1 // 16-byte version exchange
	StepCycleBuffer                 // 4-byte BE int
	StepCacheLine                   // 4-byte BE int
	StepMTU                         // 2 bytes: enum digit + NUL
	StepDest                        // 108-byte QP data exchange
	StepConnect                     // local: bring the QP to RTR/RTS (Hooks.Connect)
	StepSync                        // 108-byte QP data re-exchange used as a barrier
	StepPrepare                     // local: post WQEs for the next size (Hooks.Prepare)
	StepTraffic                     // local: run the data phase of one size (Hooks.Traffic)
	StepReport                      // 5 × 8-byte bandwidth report exchange
	StepDone                        // "done\0" written by both sides
	StepCMSync                      // perftest -R: 56-byte empty QP data exchange around the rdma_cm connection
	StepCMConnect                   // perftest -R, local: connect the QP through rdma_cm (Hooks.CMConnect)
	StepDestRound                   // the QP data again, one record per QP (-q; the bandwidth tests' second round, which each side prints)
)

var stepNames = [...]string{
	StepVersion: PerfStepVersion, StepCycleBuffer: PerfStepCycleBuffer, StepCacheLine: PerfStepCacheLine,
	StepMTU: PerfStepMTU, StepDest: PerfStepDest, StepConnect: "connect", StepSync: PerfStepSync,
	StepPrepare: "prepare", StepTraffic: "traffic", StepReport: "report", StepDone: PerfStepDone,
	StepCMSync: PerfStepCMSync, StepCMConnect: "rdma_cm connect", StepDestRound: PerfStepDestRound,
}

// String returns the step's name.
func (s Step) String() string {
	if int(s) < len(stepNames) && stepNames[s] != "" {
		return stepNames[s]
	}
	return fmt.Sprintf("Step(%d)", uint8(s))
}

// WireBytes returns how many bytes each side writes in step s over TCP (0
// for local steps); WireBytesRDMACM the same for perftest -R's exchange.
func (s Step) WireBytes() int {
	switch s {
	case StepCMSync:
		return PerfDestCMSize
	case StepVersion:
		return VersionSize
	case StepCycleBuffer, StepCacheLine:
		return 4
	case StepMTU:
		return 2
	case StepDest, StepSync, StepDestRound:
		return PerfDestSize
	case StepReport:
		return ReportSize
	case StepDone:
		return len(doneMsg)
	}
	return 0
}

// WireBytesRDMACM returns how many bytes each side sends in step s of
// perftest -R's exchange (one SEND per message; 0 for local steps).
func (s Step) WireBytesRDMACM() int {
	switch s {
	case StepDest, StepSync, StepCMSync, StepDestRound:
		return PerfDestCMSize
	case StepDone:
		return 0
	}
	return s.WireBytes()
}

// Plan returns the exact sequence perftest 4.5 runs for test in role, in the
// default mode: one QP, ethernet exchange (no -R/rdma_cm), not bidirectional
// (-b: PlanBidi), not --run_infinitely. sizes is the number of message sizes: 1, or
// the count of sizes with -a. Duration mode (-D) does not change the
// sequence. "round" (StepDestRound) is the bandwidth tests' second round of
// QP data, one record per QP like dest (RunQPs; with one QP it is a sync).
// Derived from perftest 4.5-0.17 (src/*_bw.c, *_lat.c) and the
// captures in testdata/golden. Both roles' plans have the same wire steps in
// the same order; they differ only in local steps.
//
//	write/read/atomic-bw: version cycle cache mtu dest connect round sync
//	    client: [prepare traffic]×sizes; server: traffic (passive, once);
//	    both: sync report sync done
//	send-bw:  version cycle cache mtu dest connect sync round
//	    sizes=1: prepare sync traffic; -a: [prepare sync traffic sync]×sizes
//	    then sync done
//	write-lat: version cycle cache mtu dest sync connect sync sync
//	    [prepare traffic]×sizes; no done, each side just closes
//	read/atomic-lat: version cycle cache mtu dest sync connect sync sync
//	    client: [prepare traffic]×sizes; server: traffic (passive, once);
//	    both: sync done
//
// A passive side (the server of write/read/atomic-bw and read/atomic-lat)
// has nothing to do on the wire while the client runs; its plan holds a
// single StepTraffic there, and its next wire step waits for the client to
// finish.
//
//	send-lat: version cycle cache mtu dest connect sync sync
//	    [prepare sync traffic]×sizes; sync done
func Plan(test PerfTest, role Role, sizes int) ([]Step, error) {
	if !test.Valid() {
		return nil, fmt.Errorf("oob: unknown perftest %v", test)
	}
	if role != Client && role != Server {
		return nil, fmt.Errorf("oob: unknown role %v", role)
	}
	if sizes < 1 {
		return nil, fmt.Errorf("oob: sizes %d < 1", sizes)
	}
	p := []Step{StepVersion, StepCycleBuffer, StepCacheLine, StepMTU, StepDest}
	active := role == Client // does this side run a data phase?
	switch test {
	case WriteBW, ReadBW, AtomicBW:
		// dest; ctx_connect; hand_shake per QP (remote print); hand_shake
		// (after RTR).
		p = append(p, StepConnect, StepDestRound, StepSync)
		if active {
			for range sizes {
				p = append(p, StepPrepare, StepTraffic)
			}
		} else {
			p = append(p, StepTraffic) // passive: the peer's data phase
		}
		// half-duplex end: hand_shake; xchg_bw_reports; ctx_close_connection.
		p = append(p, StepSync, StepReport, StepSync, StepDone)
	case SendBW:
		// dest; ctx_connect; hand_shake; hand_shake per QP (remote print).
		p = append(p, StepConnect, StepSync, StepDestRound)
		if sizes == 1 {
			// RUN_REGULAR: set wqes; hand_shake; run_iter_bw(_server).
			p = append(p, StepPrepare, StepSync, StepTraffic)
		} else {
			// RUN_ALL: per size set wqes; hand_shake; run; hand_shake.
			for range sizes {
				p = append(p, StepPrepare, StepSync, StepTraffic, StepSync)
			}
		}
		p = append(p, StepSync, StepDone)
	case WriteLat:
		// hand_shake before the per-QP loop and one in it; ctx_connect;
		// hand_shake (remote print); hand_shake (after RTR).
		p = append(p, StepSync, StepConnect, StepSync, StepSync)
		for range sizes {
			p = append(p, StepPrepare, StepTraffic)
		}
		// write_lat 4.5 never calls ctx_close_connection.
	case ReadLat, AtomicLat:
		p = append(p, StepSync, StepConnect, StepSync, StepSync)
		if active {
			for range sizes {
				p = append(p, StepPrepare, StepTraffic)
			}
		} else {
			p = append(p, StepTraffic) // passive: the peer's data phase
		}
		p = append(p, StepSync, StepDone)
	case SendLat:
		p = append(p, StepConnect, StepSync, StepSync)
		for range sizes {
			// post receives; hand_shake so the client does not send early.
			p = append(p, StepPrepare, StepSync, StepTraffic)
		}
		p = append(p, StepSync, StepDone)
	}
	return p, nil
}

// PlanRDMACM returns the sequence perftest 4.5 runs for test in role with
// -R (rdma_cm QPs): the exchange of Plan, carried over a QP connected
// through rdma_cm instead of TCP (see NewPerfSessionRDMACM), with
// create_rdma_cm_connection between the MTU and the QP data — an empty
// 56-byte sync, the rdma_cm connection of the test QP, another empty sync —
// and without done (ctx_close_connection says it only over TCP). The QP
// data that follows still carries the rkey and address the RDMA tests
// need; Hooks.Connect then has no QP to connect (perftest skips
// ctx_connect).
//
//	version cycle cache mtu cm-sync cm-connect cm-sync dest ... (as Plan, no done)
func PlanRDMACM(test PerfTest, role Role, sizes int) ([]Step, error) {
	p, err := Plan(test, role, sizes)
	if err != nil {
		return nil, err
	}
	return RDMACM(p), nil
}

// PlanBidi returns the sequence perftest 4.5 runs for the bandwidth test
// test with -b (duplex), the same in both roles: both sides run a data phase
// and exchange reports, each size after a barrier (src/*_bw.c with
// user_param.duplex, version >= 4.6):
//
//	version cycle cache mtu dest connect round sync (send-bw: sync round)
//	write/read/atomic-bw: sizes=1: prepare sync traffic report
//	    -a: [prepare sync traffic sync report]×sizes
//	send-bw: sizes=1: prepare sync traffic report
//	    -a: [prepare sync traffic report sync]×sizes
//	then sync done (ctx_close_connection)
//
// RDMACM(PlanBidi(...)) is the sequence with -R.
func PlanBidi(test PerfTest, sizes int) ([]Step, error) {
	if !test.IsBW() {
		return nil, fmt.Errorf("oob: -b (bidirectional) is for the bandwidth tests, not %v", test)
	}
	if sizes < 1 {
		return nil, fmt.Errorf("oob: sizes %d < 1", sizes)
	}
	p := []Step{StepVersion, StepCycleBuffer, StepCacheLine, StepMTU, StepDest, StepConnect, StepDestRound, StepSync}
	if test == SendBW {
		p[6], p[7] = StepSync, StepDestRound
	}
	for range sizes {
		p = append(p, StepPrepare, StepSync, StepTraffic)
		switch {
		case sizes == 1:
			p = append(p, StepReport)
		case test == SendBW:
			p = append(p, StepReport, StepSync)
		default:
			p = append(p, StepSync, StepReport)
		}
	}
	return append(p, StepSync, StepDone), nil
}

// RDMACM turns a plan of Plan or PlanBidi into perftest -R's (see
// PlanRDMACM).
func RDMACM(p []Step) []Step {
	out := make([]Step, 0, len(p)+3)
	for _, st := range p {
		switch st {
		case StepDone:
			continue
		case StepDest:
			out = append(out, StepCMSync, StepCMConnect, StepCMSync)
		}
		out = append(out, st)
	}
	return out
}

// Hooks are the caller's local actions during Run. Nil hooks are skipped.
type Hooks struct {
	// Connect brings the QP to RTR (and RTS) using the peer's QP data and
	// the negotiated parameters (ctx_connect). With PlanRDMACM the QP is
	// connected already (CMConnect); Connect then only learns the peer's
	// QP data.
	Connect func(ctx context.Context, remote PerfDest, negotiated Params) error
	// ConnectQPs, if set, replaces Connect for a run with several QPs
	// (RunQPs): it gets the peer's QP data for each QP, in order.
	ConnectQPs func(ctx context.Context, remotes []PerfDest, negotiated Params) error
	// CMConnect connects the test QP through rdma_cm (perftest -R's
	// create_rdma_cm_connection): the client dials the server's port, the
	// server accepts. It returns this side's QP data for the rest of the
	// run, which replaces Run's local (perftest fills my_dest only after
	// connecting: the PSNs come from the CM). PlanRDMACM only.
	CMConnect func(ctx context.Context, negotiated Params) (local PerfDest, err error)
	// CMConnectQPs, if set, replaces CMConnect for a run with several QPs
	// (RunQPs with -R: perftest connects each QP through rdma_cm): it
	// returns this side's QP data for every QP, in order.
	CMConnectQPs func(ctx context.Context, negotiated Params) (locals []PerfDest, err error)
	// Prepare posts the WQEs for message size number i (0-based); for SEND
	// tests the server's receives must be posted here, before the barrier.
	Prepare func(ctx context.Context, i int) error
	// Traffic runs the data phase for size number i and returns this side's
	// report (used by bandwidth tests' report exchange; the last one wins).
	// On a passive side it is called once, with i = 0, and should return
	// at once (the wait for the peer happens in the next wire step).
	Traffic func(ctx context.Context, i int) (Report, error)
	// Report, if set, supplies the report to send at the report exchange
	// instead of the last one Traffic returned. A passive side (the server
	// of write/read/atomic-bw) has no Traffic; it sends zeros by default
	// (perftest's server sends uninitialised memory).
	Report func() Report
	// Reported, if set, is called after each report exchange with both
	// sides' reports; an error ends the run.
	Reported func(local, remote Report) error
}

// wire reports whether st is exchanged on the connection of a session.
func (s *PerfSession) wire(st Step) bool {
	if s.rdmacm {
		return st.WireBytesRDMACM() > 0
	}
	return st.WireBytes() > 0
}

// Result is what Run learned from the peer.
type Result struct {
	PeerVersion  string
	RemoteParams Params
	Negotiated   Params
	Remote       PerfDest   // the peer's QP data (from its first message)
	Remotes      []PerfDest // the peer's QP data for each QP (RunQPs); Remotes[0] is Remote
	LocalReport  Report     // the last report Traffic returned
	RemoteReport Report     // the peer's report, if HasReport
	HasReport    bool
}

// Run executes plan (from Plan, or PlanRDMACM for a session from
// NewPerfSessionRDMACM) on the session: wire steps through the step
// methods, local steps through hooks. params are this side's Params, local
// its QP data. Errors name the step; local hooks' errors are returned as
// StepErrors with Op "local". ctx bounds the whole run; with StepTimeout set,
// each wire step must also complete within StepTimeout, except the first
// wire step after a StepTraffic, which waits for the peer's data phase.
func (s *PerfSession) Run(ctx context.Context, plan []Step, params Params, local PerfDest, hooks Hooks) (Result, error) {
	return s.RunQPs(ctx, plan, params, []PerfDest{local}, hooks)
}

// RunQPs is Run for a side with len(locals) QPs (perftest's -q; with -R
// Hooks.CMConnectQPs connects them and supplies their QP data): StepDest exchanges one QP data record per QP, in order, and so does
// StepDestRound (perftest 4.5's second round, in which each side prints the
// peer's records), as perftest's ctx_hand_shake loops over num_of_qps; every
// sync re-sends the first record. The
// peer's record count is checked on the way: perftest does not exchange
// num_of_qps, but a peer with fewer QPs sends its first record again where
// the next QP's belongs, and one with more sends a new record where the
// repeat of its first belongs. Either ends the run with a *QPCountError
// (ErrQPCountMismatch) before any traffic, naming both counts.
func (s *PerfSession) RunQPs(ctx context.Context, plan []Step, params Params, locals []PerfDest, hooks Hooks) (Result, error) {
	var res Result
	if err := checkLocalMTU(params); err != nil {
		return res, err // before any I/O
	}
	if len(locals) < 1 || len(locals) > MaxPerfQPs {
		return res, &StepError{Protocol: s.c.proto, Step: PerfStepDest, Op: "check",
			Err: fmt.Errorf("%d QPs: want 1..%d", len(locals), MaxPerfQPs)}
	}
	for _, l := range locals {
		if err := l.Validate(); err != nil {
			return res, &StepError{Protocol: s.c.proto, Step: PerfStepDest, Op: "check", Err: err}
		}
	}
	// justDest: the step is the first wire exchange after the first round
	// of QP data, where a peer with more QPs still sends new records.
	justDest := false
	size := 0 // index of the current message size
	prepared := false
	afterTraffic := false
	for _, st := range plan {
		ctx, cancel := ctx, context.CancelFunc(func() {})
		if s.wire(st) {
			if s.StepTimeout > 0 && !afterTraffic {
				ctx, cancel = context.WithTimeoutCause(ctx, s.StepTimeout,
					fmt.Errorf("%w: no reply within %v", context.DeadlineExceeded, s.StepTimeout))
			}
			afterTraffic = false
		}
		var err error
		switch st {
		case StepVersion:
			res.PeerVersion, err = s.Handshake(ctx)
		case StepCycleBuffer:
			res.RemoteParams.CycleBuffer, err = s.exchangeCycleBuffer(ctx, params)
		case StepCacheLine:
			res.RemoteParams.CacheLine, err = s.exchangeCacheLine(ctx, params)
		case StepMTU:
			res.RemoteParams.MTU, err = s.exchangeMTU(ctx, params)
		case StepDest:
			res.Remotes, err = s.exchangeDests(ctx, locals)
			if len(res.Remotes) > 0 {
				res.Remote = res.Remotes[0]
			}
		case StepConnect:
			switch {
			case hooks.ConnectQPs != nil:
				err = s.localErr(st, hooks.ConnectQPs(ctx, res.Remotes, res.Negotiated))
			case hooks.Connect != nil:
				err = s.localErr(st, hooks.Connect(ctx, res.Remote, res.Negotiated))
			}
		case StepSync:
			if s.rdmacm || len(res.Remotes) == 0 {
				err = s.Sync(ctx)
			} else {
				err = s.syncChecked(ctx, locals, res.Remotes, justDest)
			}
		case StepDestRound:
			err = s.exchangeDestsAgain(ctx, locals, res.Remotes, justDest)
		case StepPrepare:
			if prepared {
				size++
			}
			prepared = true
			if hooks.Prepare != nil {
				err = s.localErr(st, hooks.Prepare(ctx, size))
			}
		case StepTraffic:
			if hooks.Traffic != nil {
				var r Report
				r, err = hooks.Traffic(ctx, size)
				err = s.localErr(st, err)
				if err == nil {
					res.LocalReport = r
				}
			}
			afterTraffic = true
		case StepReport:
			if hooks.Report != nil {
				res.LocalReport = hooks.Report()
			}
			res.RemoteReport, err = s.ExchangeReport(ctx, res.LocalReport)
			res.HasReport = err == nil
			if err == nil && hooks.Reported != nil {
				err = s.localErr(st, hooks.Reported(res.LocalReport, res.RemoteReport))
			}
		case StepDone:
			err = s.Done(ctx)
		case StepCMSync:
			err = s.CMSync(ctx)
		case StepCMConnect:
			if !s.rdmacm {
				err = &StepError{Protocol: s.c.proto, Step: st.String(), Op: "check", Err: fmt.Errorf("rdma_cm connect in a session over TCP")}
			} else if hooks.CMConnectQPs != nil {
				var ls []PerfDest
				if ls, err = hooks.CMConnectQPs(ctx, res.Negotiated); err == nil && len(ls) != len(locals) {
					err = fmt.Errorf("%d QP data records for %d QPs", len(ls), len(locals))
				}
				for _, l := range ls {
					if err == nil {
						err = l.Validate()
					}
				}
				if err == nil {
					locals = ls
				}
				err = s.localErr(st, err)
			} else if hooks.CMConnect != nil {
				var l PerfDest
				if l, err = hooks.CMConnect(ctx, res.Negotiated); err == nil {
					if err = l.Validate(); err == nil {
						locals = []PerfDest{l}
					}
				}
				err = s.localErr(st, err)
			}
		default:
			err = &StepError{Protocol: s.c.proto, Step: st.String(), Op: "check", Err: fmt.Errorf("unknown plan step")}
		}
		cancel()
		if err != nil {
			return res, err
		}
		if s.wire(st) {
			justDest = st == StepDest
		}
		res.Negotiated = params.Negotiate(res.RemoteParams)
	}
	return res, nil
}

func (s *PerfSession) localErr(st Step, err error) error {
	if err == nil {
		return nil
	}
	return &StepError{Protocol: s.c.proto, Step: st.String(), Op: "local", Err: err}
}
