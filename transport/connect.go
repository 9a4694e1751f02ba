package transport

import (
	"fmt"
	"net/netip"

	"github.com/gorocev2/rocev2/memreg"
)

// Retry holds a connection's timing and retry attributes: the requester's
// local ACK timeout, retry_cnt and rnr_retry, and the RNR NAK timer the
// responder advertises.
type Retry struct {
	Timeout     uint8 // local ACK timeout 4.096 µs × 2^Timeout; 0 = infinite
	RetryCnt    uint8 // 0..7
	RNRRetry    uint8 // 0..7, 7 = infinite
	MinRNRTimer uint8 // RNR NAK timer code 0..31 (aeth.RNRTimeout)
}

// DefaultRetry is what Connect uses when ConnParams.Retry is nil: the
// values rdma-core's ibv_rc_pingpong and perftest use (timeout 14, about
// 67 ms; retry_cnt 7; rnr_retry 7, infinite; min_rnr_timer 12, 0.64 ms).
var DefaultRetry = Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}

// ConnParams are what Connect needs to take an RC QP to RTS: the peer's
// address, QPN and starting PSN (learned out of band, through the CM or a
// TCP exchange), this side's starting PSN, and the QP's own settings.
//
// A zero PathMTU selects MTU1024; zero MaxRdAtomic and MaxDestRdAtomic
// select the device limit (DeviceConfig.MaxRdAtomic); a nil Retry selects
// DefaultRetry. Access is taken as given: zero grants the peer no remote
// access.
type ConnParams struct {
	// Peer is the peer's IP address (IPv4, IPv6 or an IPv4-mapped GID).
	Peer netip.Addr
	// TrafficClass is the IP TOS / traffic class to send with.
	TrafficClass uint8
	// DestQPN is the peer QP's number.
	DestQPN uint32
	// RQPSN is the first PSN this QP expects from the peer (the peer's
	// starting send PSN).
	RQPSN uint32
	// SQPSN is this QP's first send PSN.
	SQPSN uint32
	// PathMTU is the path MTU; both sides must use the same.
	PathMTU MTU
	// Access are the remote rights this QP's responder grants the peer
	// (memreg.AccessRemoteWrite, AccessRemoteRead, AccessRemoteAtomic).
	Access memreg.Access
	// MaxRdAtomic bounds the READ/atomic requests outstanding as
	// requester; it must not exceed the peer's MaxDestRdAtomic.
	MaxRdAtomic uint8
	// MaxDestRdAtomic is how many READ/atomic requests the responder
	// keeps saved for replay.
	MaxDestRdAtomic uint8
	// Retry holds the timeout and retry attributes; nil means DefaultRetry.
	Retry *Retry
	// SelectiveRepeat runs selective repeat instead of go-back-N
	// (QPAttr.SelectiveRepeat, RC only). Set it only when the peer is a
	// rocev2 QP that sets it too (agreed out of band, or negotiated by
	// the CM's ECE exchange): an rxe or hardware peer would not
	// understand the selective NAKs.
	SelectiveRepeat bool
}

// Init takes a QP from RESET to INIT with the given remote access rights,
// so that receive work requests can be posted before the peer's
// parameters are known (as ibv_rc_pingpong and perftest do). Connect then
// completes the connection.
func (qp *QP) Init(access memreg.Access) error {
	a := QPAttr{State: QPSInit, Port: 1, AccessFlags: access}
	if err := qp.Modify(&a, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
		return fmt.Errorf("transport: Init qp %#x: %w", qp.qpn, unwrapModify(err))
	}
	return nil
}

// Connect takes the QP from RESET or INIT through RTR to RTS with the
// parameters p: the three Modify calls of the verbs connection sequence in
// one (Init if needed, ReadyToReceive, ReadyToSend). A QP in INIT keeps its
// state and gets p.Access. An error names the transition and the
// attribute that failed, and leaves the QP in the last state reached.
func (qp *QP) Connect(p ConnParams) error {
	if err := qp.ReadyToReceive(p); err != nil {
		return err
	}
	return qp.ReadyToSend(p)
}

// ReadyToReceive takes an RC QP from RESET or INIT to RTR with p (the
// path, the peer's QPN and first PSN, the responder's resources): it
// receives from then on but sends only responses. The passive side of a
// CM connection stops here until the RTU; ReadyToSend completes it.
func (qp *QP) ReadyToReceive(p ConnParams) error {
	if qp.init.Type == QPTypeUD {
		return fmt.Errorf("transport: Connect qp %#x: a %v QP (ReadyUD readies UD QPs): %w", qp.qpn, qp.init.Type, ErrInvalidState)
	}
	uc := qp.init.Type == QPTypeUC
	rt := p.retry()
	mtu := p.PathMTU
	if mtu == 0 {
		mtu = MTU1024
	}
	maxDest := p.MaxDestRdAtomic
	if maxDest == 0 {
		maxDest = uint8(min(qp.dev.cfg.MaxRdAtomic, 255))
	}
	qp.mu.Lock()
	err := qp.postable("Connect")
	qp.mu.Unlock()
	if err != nil { // not "state ERR": the QP is gone, and errors.Is says so
		return err
	}
	switch st := qp.State(); st {
	case QPSReset:
		if err := qp.Init(p.Access); err != nil {
			return err
		}
	case QPSInit:
	default:
		return fmt.Errorf("transport: Connect qp %#x: state %v, want RESET or INIT: %w", qp.qpn, st, ErrInvalidState)
	}
	a := QPAttr{State: QPSRTR, AccessFlags: p.Access, AV: AddressVector{Addr: p.Peer, TrafficClass: p.TrafficClass},
		PathMTU: mtu, DestQPN: p.DestQPN, RQPSN: p.RQPSN, MaxDestRdAtomic: maxDest, MinRNRTimer: rt.MinRNRTimer}
	mask := AttrState | AttrAccessFlags | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	if uc { // no acknowledgements, no READ/atomic resources
		mask &^= AttrMaxDestRdAtomic | AttrMinRNRTimer
	}
	if p.SelectiveRepeat {
		a.SelectiveRepeat = true
		mask |= AttrSelectiveRepeat
	}
	if err := qp.Modify(&a, mask); err != nil {
		return fmt.Errorf("transport: Connect qp %#x: to RTR: %w", qp.qpn, unwrapModify(err))
	}
	return nil
}

// ReadyToSend takes an RC QP from RTR to RTS with p's send side: first
// PSN, timeout and retries, outstanding READ/atomic limit.
func (qp *QP) ReadyToSend(p ConnParams) error {
	rt := p.retry()
	maxRd := p.MaxRdAtomic
	if maxRd == 0 {
		maxRd = uint8(min(qp.dev.cfg.MaxRdAtomic, 255))
	}
	a := QPAttr{State: QPSRTS, SQPSN: p.SQPSN, Timeout: rt.Timeout, RetryCnt: rt.RetryCnt, RNRRetry: rt.RNRRetry,
		MaxQPRdAtomic: maxRd}
	mask := AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	if qp.init.Type == QPTypeUC {
		mask = AttrState | AttrSQPSN
	}
	if err := qp.Modify(&a, mask); err != nil {
		return fmt.Errorf("transport: Connect qp %#x: to RTS: %w", qp.qpn, unwrapModify(err))
	}
	return nil
}

func (p *ConnParams) retry() Retry {
	if p.Retry != nil {
		return *p.Retry
	}
	return DefaultRetry
}

// ReadyUD takes a UD QP from RESET to RTS (INIT, RTR, RTS in one call)
// with Q_Key qkey, the Q_Key the datagrams it receives must carry, and
// first send PSN sqPSN.
func (qp *QP) ReadyUD(qkey, sqPSN uint32) error {
	if qp.init.Type != QPTypeUD {
		return fmt.Errorf("transport: ReadyUD qp %#x: a %v QP: %w", qp.qpn, qp.init.Type, ErrInvalidState)
	}
	steps := []struct {
		a    QPAttr
		mask AttrMask
	}{
		{QPAttr{State: QPSInit, Port: 1, QKey: qkey}, AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
		{QPAttr{State: QPSRTR}, AttrState},
		{QPAttr{State: QPSRTS, SQPSN: sqPSN & 0xffffff}, AttrState | AttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.Modify(&s.a, s.mask); err != nil {
			return fmt.Errorf("transport: ReadyUD qp %#x: %w", qp.qpn, unwrapModify(err))
		}
	}
	return nil
}

// unwrapModify strips the "transport: " prefix of a Modify error so that a
// wrapping message does not repeat it; the sentinel stays matchable.
func unwrapModify(err error) error {
	return prefixless{err}
}

type prefixless struct{ err error }

func (e prefixless) Error() string {
	s := e.err.Error()
	const p = "transport: "
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

func (e prefixless) Unwrap() error { return e.err }
