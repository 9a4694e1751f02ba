package transport

import (
	"fmt"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// Congestion control (RoCEv2 Annex A17 and DCQCN), in three parts:
//
//   - ECN: every RoCEv2 packet the device sends, except CNPs, carries the
//     configured ECN codepoint, ECT(0) by default, so that a switch can
//     mark it Congestion Experienced (CE) instead of dropping it.
//   - Notification point (NP): a CE-marked packet for an RC or UC QP makes
//     the QP send a CNP to its peer's QP, at most one per CNPInterval.
//   - Reaction point (RP): a CNP for an RC or UC QP cuts that QP's send
//     rate (package dcqcn); the requester paces its packets at the rate
//     with one lazily created timer per QP (a packet never has a timer or
//     goroutine of its own), and the rate recovers by timer and byte count.
//
// Responses (ACKs, READ responses, atomic ACKs) are not paced: they answer
// the peer's requests, whose own requester is paced.

// ECNMode is the ECN codepoint of the packets a device sends.
type ECNMode uint8

// ECN codepoints. The zero value is the default, ECT(0).
const (
	ECNDefault ECNMode = iota // ECT(0)
	ECNNotECT                 // not ECN-capable: switches drop instead of marking
	ECNECT0                   // ECN-capable transport (0)
	ECNECT1                   // ECN-capable transport (1)
)

// String returns "ECT(0)", "Not-ECT" or "ECT(1)".
func (m ECNMode) String() string {
	switch m {
	case ECNDefault, ECNECT0:
		return "ECT(0)"
	case ECNNotECT:
		return "Not-ECT"
	case ECNECT1:
		return "ECT(1)"
	}
	return fmt.Sprintf("ECNMode(%d)", uint8(m))
}

// bits returns the two ECN bits of the TOS byte.
func (m ECNMode) bits() uint8 {
	switch m {
	case ECNNotECT:
		return udp.ECNNotECT
	case ECNECT1:
		return udp.ECNECT1
	}
	return udp.ECNECT0
}

// CongestionConfig configures a device's ECN marking, notification point
// and reaction point. The zero value is ECT(0), CNPs at most every 50 µs
// per QP, and DCQCN with NVIDIA's defaults.
type CongestionConfig struct {
	// ECN is the ECN codepoint of every RoCEv2 packet sent except CNPs
	// (default ECT(0)). A traffic class whose ECN bits are set keeps them.
	ECN ECNMode
	// CNPInterval is the notification point's minimum time between two
	// CNPs for one QP (default 50 µs, the Annex A17 rate).
	CNPInterval time.Duration
	// DisableNP stops CNPs: CE-marked packets are still counted.
	DisableNP bool
	// CNPDSCP is the DSCP of CNPs (default 48, like mlx5's cnp_dscp).
	// CNPs are sent Not-ECT.
	CNPDSCP int
	// DCQCN configures the reaction point of every RC and UC QP;
	// DCQCN.Disable turns it off (CNPs are then counted as ignored).
	DCQCN dcqcn.Config
}

// DefaultCNPInterval and DefaultCNPDSCP are CongestionConfig's defaults.
const (
	DefaultCNPInterval = 50 * time.Microsecond
	DefaultCNPDSCP     = 48
)

// normalize fills in the defaults and checks the ranges.
func (c CongestionConfig) normalize() (CongestionConfig, error) {
	if c.ECN > ECNECT1 {
		return c, fmt.Errorf("transport: NewDevice: Congestion.ECN %d: %w", c.ECN, ErrInvalidConfig)
	}
	if c.CNPInterval == 0 {
		c.CNPInterval = DefaultCNPInterval
	}
	if c.CNPInterval < 0 {
		return c, fmt.Errorf("transport: NewDevice: Congestion.CNPInterval %v < 0: %w", c.CNPInterval, ErrInvalidConfig)
	}
	if c.CNPDSCP == 0 {
		c.CNPDSCP = DefaultCNPDSCP
	}
	if c.CNPDSCP < 0 || c.CNPDSCP > 63 {
		return c, fmt.Errorf("transport: NewDevice: Congestion.CNPDSCP %d out of range 0..63: %w", c.CNPDSCP, ErrInvalidConfig)
	}
	d, err := c.DCQCN.Normalize()
	if err != nil {
		return c, fmt.Errorf("transport: NewDevice: Congestion.DCQCN: %v: %w", err, ErrInvalidConfig)
	}
	c.DCQCN = d
	return c, nil
}

// CongestionState is a QP's reaction point state.
type CongestionState struct {
	Limited    bool    // a CNP cut the rate and it has not recovered to line rate
	Rate       float64 // current rate, bits/s of IP datagrams (the line rate when not limited)
	TargetRate float64 // DCQCN's target rate, bits/s
	Alpha      float64 // DCQCN's α, in [0, 1]
	CNPs       uint64  // CNPs handled
	Cuts       uint64  // rate cuts
}

// qpCC is a QP's congestion control state. Guarded by qp.mu.
type qpCC struct {
	// paceArmed and rp's first bytes are read per requester turn; the
	// rest of rp and lastCNP only with congestion (QP's layout).
	paceArmed bool // qp.tq[timerPace] is armed
	cnpSent   bool // lastCNP is valid
	rp        dcqcn.RP
	lastCNP   time.Time // when the NP last sent a CNP for this QP
}

// ccInit sets up the QP's reaction point at line rate.
func (qp *QP) ccInit() {
	qp.cc.rp.Init(&qp.dev.cfg.Congestion.DCQCN)
	qp.cc.cnpSent = false
}

// Congestion returns the QP's reaction point state.
func (qp *QP) Congestion() CongestionState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	rp := &qp.cc.rp
	st := rp.Stats()
	return CongestionState{
		Limited:    rp.Limited(),
		Rate:       rp.Rate(qp.dev.clock.Now()),
		TargetRate: rp.TargetRate(),
		Alpha:      rp.Alpha(qp.dev.clock.Now()),
		CNPs:       st.CNPs,
		Cuts:       st.Cuts,
	}
}

// dataTOS returns the TOS byte of a packet with traffic class tc: the
// device's ECN codepoint unless tc sets ECN bits of its own.
func (d *Device) dataTOS(tc uint8) uint8 {
	if tc&udp.ECNMask != 0 {
		return tc
	}
	return tc | d.ecnBits
}

// ipOverhead is the IP and UDP header bytes around a RoCEv2 packet to the
// QP's peer: what a switch queue counts besides the UDP payload.
func (qp *QP) ipOverhead() int {
	if qp.peer.Is4() || qp.peer.Is4In6() {
		return 28
	}
	return 48
}

// paceHold reports whether the reaction point holds the requester's next
// packet; it then arms the pace timer for when the packet may go. Called
// with qp.mu held.
func (qp *QP) paceHold() bool {
	if !qp.cc.rp.Limited() {
		return false // inlined: the usual, unlimited case
	}
	return qp.paceHoldLimited()
}

// paceHoldLimited is paceHold for a rate-limited QP.
func (qp *QP) paceHoldLimited() bool {
	rp := &qp.cc.rp
	d := rp.Wait(qp.dev.clock.Now())
	if d <= 0 {
		return false
	}
	if !qp.cc.paceArmed {
		qp.cc.paceArmed = true
		qp.dev.tq.arm(&qp.tq[timerPace], qp.dev.clock.Now(), d)
	}
	return true
}

// paceSent accounts the request packet of n bytes (UDP payload) just
// queued. Called with qp.mu held.
func (qp *QP) paceSent(n int) {
	if qp.cc.rp.Limited() {
		qp.paceSentLimited(n) // the check inlined, the work out of line
	}
}

// paceSentLimited is paceSent for a rate-limited QP.
func (qp *QP) paceSentLimited(n int) {
	qp.cc.rp.Sent(qp.dev.clock.Now(), n+qp.ipOverhead())
}

// onPaceTimer resumes a requester the pacer held. Called with qp.mu held.
func (qp *QP) onPaceTimer() {
	qp.cc.paceArmed = false
	if qp.destroyed {
		return
	}
	qp.req.progress()
	qp.settle()
	qp.flushOut()
}

// stopPacing cancels the pace timer (reset, error, destroy). Called with
// qp.mu held.
func (qp *QP) stopPacing() {
	if qp.cc.paceArmed {
		qp.dev.tq.cancel(&qp.tq[timerPace])
		qp.cc.paceArmed = false
	}
}

// cnpInput handles a CNP for this QP: the reaction point cuts the rate.
// Called with qp.mu held.
func (qp *QP) cnpInput(up *udp.Packet) {
	d := qp.dev
	if qp.init.Type == QPTypeUD || qp.qpn == 1 || up.Addr.Unmap() != qp.peer ||
		!qp.cc.rp.CNP(d.clock.Now()) {
		inc(&d.ctr.RPCNPIgnored)
		return
	}
	inc(&d.ctr.RPCNPHandled)
	if qp.trace != nil {
		st := qp.cc.rp.Stats()
		qp.trace("cnp: rate %.0f b/s cuts %d", qp.cc.rp.Rate(d.clock.Now()), st.Cuts)
	}
}

// ceMarked is the notification point: a packet for this RC/UC QP arrived
// marked CE. It queues a CNP to the peer's QP unless one was sent less
// than CNPInterval ago. Called with qp.mu held.
func (qp *QP) ceMarked() {
	d := qp.dev
	inc(&d.ctr.NPECNMarkedRocePackets)
	cfg := &d.cfg.Congestion
	if cfg.DisableNP {
		return
	}
	now := d.clock.Now()
	if qp.cc.cnpSent && now.Sub(qp.cc.lastCNP) < cfg.CNPInterval {
		return
	}
	buf := qp.outBufN(packet.Len(bth.CNP, 0))
	var f packet.Fields
	f.BTH.Opcode = bth.CNP
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.BECN = true
	f.BTH.DestQP = qp.attr.DestQPN
	n, err := packet.Build(buf, &f)
	if err != nil {
		return
	}
	qp.commitTo(n, qp.peer, qp.srcPort, uint8(cfg.CNPDSCP)<<2)
	qp.out[qp.nout-1].TOS = uint8(cfg.CNPDSCP) << 2 // Not-ECT, whatever the device's ECN mode
	qp.cc.lastCNP = now
	qp.cc.cnpSent = true
	inc(&d.ctr.NPCNPSent)
}
