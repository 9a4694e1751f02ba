package transport

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// MADSize is the size of a management datagram (IBTA 13.4).
const MADSize = 256

// MAD header offsets this package reads to route management datagrams (the
// full header is package cm's).
const (
	madBaseVersion = 0
	madMgmtClass   = 1
	madMethod      = 3
	madTID         = 8
	madAttrID      = 16
	madMethodResp  = 0x80 // R bit: a response, routed by transaction ID
)

// MAD is a received management datagram and where it came from.
type MAD struct {
	Data  [MADSize]byte
	Src   netip.Addr // the sender's IP address
	SrcQP uint32     // the sender's QP (1 for the GSI)
	TOS   uint8      // traffic class it arrived with
}

// GSI is a device's General Services Interface: QP1. The device owns it
// and never hands QP1 out as a user QP. It receives 256-byte MADs with
// the GSI Q_Key (0x80010000), checks the MAD header and passes each MAD
// to the agent registered for its management class (or, for a response,
// to the agent whose transaction ID it carries); it sends what agents give
// it. Every MAD sent, received and dropped is counted, with the reason of
// each drop (Counters.MAD*).
//
// QP1 exists from the first datagram addressed to it, as the kernel's GSI
// always does: while no agent holds the CM class (no rdmacm object uses
// the device), the GSI itself answers a CM REQ with a REJ and a SIDR_REQ
// with a SIDR_REP, both "invalid service ID" (IBTA 12.6.7, 12.11), and a
// DREQ with a DREP, so a peer that dials a port nobody listens on is
// refused at once instead of retrying until its timeout, and one that
// disconnects a connection this device forgot (a restarted process) is
// answered. Such a MAD counts as mad_drop_no_agent, its
// answer as mad_sent.
//
// All methods are safe for concurrent use.
type GSI struct {
	dev *Device
	qp  *QP // the UD QP with QPN 1; its mu serializes sends

	mu      sync.Mutex
	byClass map[uint8]*MADAgent
	byID    map[uint32]*MADAgent
	nextID  uint32
}

// MADAgent receives the MADs of one management class and sends MADs
// through the GSI. Its queue is bounded: MADs that arrive while it is full
// are dropped and counted (mad_drop_queue_full), so a flood costs no
// memory.
type MADAgent struct {
	gsi   *GSI
	class uint8
	id    uint32
	c     chan MAD
	// req and reqAttrs: SeparateRequests (under gsi.mu).
	req      *fairQueue
	reqAttrs []uint16
	tid      atomic.Uint32
	once     sync.Once
	done     chan struct{}
	gone     chan struct{} // closed once done or the device's done is
	errs     chan *udp.ICMPError
}

// GSI returns the device's GSI, opening QP1 on first use.
func (d *Device) GSI() (*GSI, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isClosed() {
		return nil, ErrClosed
	}
	if d.gsi != nil {
		return d.gsi, nil
	}
	qp := &QP{dev: d, qpn: 1, transport: bth.TransportUD, srcPort: udSourcePort(1),
		init: QPInitAttr{Type: QPTypeUD, MaxSendWR: 1, MaxRecvWR: 1, MaxSGE: 1}}
	qp.attr = QPAttr{State: QPSRTS, QKey: GSIQKey, Port: 1}
	qp.initRoles()
	qp.initTimers()
	qp.out = make([]udp.Packet, 1)
	qp.outBufs = make([]*[udp.MaxPacketSize]byte, 1)
	qp.outFixed = true // every MAD leaves alone
	g := &GSI{dev: d, qp: qp, byClass: map[uint8]*MADAgent{}, byID: map[uint32]*MADAgent{}, nextID: 1}
	d.gsi = g
	d.qps[1] = qp
	d.qpTab.set(1, qp)
	return g, nil
}

// Register returns an agent for the management class, with a receive
// queue of depth MADs (default 256 when depth <= 0). One agent per class.
func (g *GSI) Register(class uint8, depth int) (*MADAgent, error) {
	if depth <= 0 {
		depth = 256
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, busy := g.byClass[class]; busy {
		return nil, errorf(ErrBusy, "GSI.Register: class %#x has an agent", class)
	}
	a := &MADAgent{gsi: g, class: class, id: g.nextID, c: make(chan MAD, depth), done: make(chan struct{}), gone: make(chan struct{}),
		errs: make(chan *udp.ICMPError, 16)}
	go func() {
		select {
		case <-a.done:
		case <-g.dev.done:
		}
		close(a.gone)
	}()
	g.nextID++
	g.byClass[class] = a
	g.byID[a.id] = a
	return a, nil
}

// C returns the agent's receive queue. It is never closed; Close ends the
// agent's registration, and Recv returns ErrClosed.
func (a *MADAgent) C() <-chan MAD { return a.c }

// SeparateRequests gives the agent a second receive queue, of depth MADs
// (default 256 when depth <= 0), for the MADs whose attribute ID is one of
// attrs: a class's requests, which any peer may send at any rate. They go
// there instead of C, so that a flood of them never fills the queue the
// answers arrive on, and that queue is fair to the senders: when it is
// full, the oldest request of the source address holding the most is
// dropped (counted as mad_drop_queue_full), and TakeRequests hands out the
// newest request of each source in turn. Call it once, before the MADs
// arrive.
func (a *MADAgent) SeparateRequests(depth int, attrs ...uint16) {
	if depth <= 0 {
		depth = 256
	}
	g := a.gsi
	g.mu.Lock()
	defer g.mu.Unlock()
	if a.req == nil {
		a.req = newFairQueue(depth)
	}
	a.reqAttrs = append([]uint16(nil), attrs...)
}

// TakeRequests appends up to max of the requests SeparateRequests queues
// to dst — the newest of each source in turn — and returns it; it does not
// wait.
func (a *MADAgent) TakeRequests(dst []MAD, max int) []MAD {
	if a.req == nil {
		return dst
	}
	return a.req.take(dst, max)
}

// RequestsReady returns a channel that receives when requests may be
// waiting for TakeRequests (nil before SeparateRequests).
func (a *MADAgent) RequestsReady() <-chan struct{} {
	if a.req == nil {
		return nil
	}
	return a.req.ready
}

// Done returns a channel closed when the agent is closed or its device
// goes.
func (a *MADAgent) Done() <-chan struct{} { return a.gone }

// Recv waits for the next MAD.
func (a *MADAgent) Recv(ctx context.Context) (MAD, error) {
	select {
	case <-a.done:
		return MAD{}, ErrClosed
	default:
	}
	select {
	case m := <-a.c:
		return m, nil
	case <-a.done:
		return MAD{}, ErrClosed
	case <-a.gsi.dev.done:
		return MAD{}, ErrClosed
	case <-ctx.Done():
		return MAD{}, ctx.Err()
	}
}

// Unreachable returns the ICMP errors (port, host or network unreachable)
// the network returned for MADs of the agent's class the device sent, on
// links that report them (udp.ErrorReporter: the SocketLink). The error's
// Payload holds the bounced datagram from its BTH on: the MAD starts at
// byte MADOffset, so a requester can match the transaction ID it sent
// and give up at once instead of resending into the void. The channel
// holds 16; more are dropped. It is never closed.
func (a *MADAgent) Unreachable() <-chan *udp.ICMPError { return a.errs }

// MADOffset is where a MAD starts in a QP1 datagram's UDP payload: behind
// the BTH (12 bytes) and the DETH (8).
const MADOffset = 12 + 8

// unreachable routes an ICMP error for a datagram QP1 sent to the agent
// of the bounced MAD's class.
func (g *GSI) unreachable(e *udp.ICMPError) {
	if len(e.Payload) < MADOffset+madTID+8 {
		return
	}
	mad := e.Payload[MADOffset:]
	class := mad[madMgmtClass]
	g.mu.Lock()
	a := g.byClass[class]
	if mad[madMethod]&madMethodResp != 0 {
		if b := g.byID[uint32(binary.BigEndian.Uint64(mad[madTID:])>>32)]; b != nil && b.class == class {
			a = b
		}
	}
	g.mu.Unlock()
	if a == nil {
		return
	}
	select {
	case a.errs <- e:
	default:
	}
}

// linkError is the link's ICMP error handler (udp.ErrorReporter): counted,
// and a MAD's passed to its agent.
func (d *Device) linkError(e *udp.ICMPError) {
	inc(&d.ctr.DestUnreachable)
	if qpn, ok := e.DestQP(); !ok || qpn != 1 {
		return
	}
	d.mu.Lock()
	g := d.gsi
	d.mu.Unlock()
	if g != nil {
		g.unreachable(e)
	}
}

// NewTID returns a transaction ID for a request this agent sends: the
// agent's ID in the high 32 bits (so that responses find it) and a counter
// in the low 32.
func (a *MADAgent) NewTID() uint64 { return uint64(a.id)<<32 | uint64(a.tid.Add(1)) }

// Close unregisters the agent.
func (a *MADAgent) Close() error {
	a.once.Do(func() {
		g := a.gsi
		g.mu.Lock()
		if g.byClass[a.class] == a {
			delete(g.byClass, a.class)
		}
		delete(g.byID, a.id)
		g.mu.Unlock()
		close(a.done)
	})
	return nil
}

// Send sends one MAD (MADSize bytes) to the QP dstQP (1 for another GSI)
// at dst, with the GSI Q_Key and traffic class tos.
func (a *MADAgent) Send(dst netip.Addr, dstQP uint32, tos uint8, mad []byte) error {
	return a.gsi.send(dst, dstQP, tos, mad)
}

func (g *GSI) send(dst netip.Addr, dstQP uint32, tos uint8, mad []byte) error {
	if len(mad) != MADSize {
		return errorf(ErrInvalidWR, "GSI send: MAD of %d bytes, want %d", len(mad), MADSize)
	}
	d := g.dev
	pa := dst.Unmap()
	if !pa.IsValid() || pa.Is4() != d.addr.Is4() {
		return errorf(ErrInvalidWR, "GSI send: destination %v", dst)
	}
	if dstQP == 0 || dstQP > bth.PSNMask {
		return errorf(ErrInvalidWR, "GSI send: destination QP %#x", dstQP)
	}
	if d.isClosed() {
		return ErrClosed
	}
	g.qp.mu.Lock()
	defer g.qp.mu.Unlock()
	return g.sendLocked(pa, dstQP, tos, mad)
}

// sendLocked builds and sends one checked MAD to QP dstQP at pa. Called
// with g.qp.mu held.
func (g *GSI) sendLocked(pa netip.Addr, dstQP uint32, tos uint8, mad []byte) error {
	d, qp := g.dev, g.qp
	f := &qp.reqF
	*f = packet.Fields{}
	f.BTH.Opcode = bth.UDSendOnly
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = dstQP
	f.BTH.PSN = qp.req.psn
	f.BTH.AckReq = true // as rxe's GSI sends MADs
	f.DETH.QKey = GSIQKey
	f.DETH.SrcQP = 1
	f.Payload = mad
	buf := qp.outBufN(packet.Len(f.BTH.Opcode, len(mad)))
	n, err := packet.Build(buf, f)
	if err != nil {
		return fmt.Errorf("transport: GSI send: %w", err)
	}
	qp.commitTo(n, pa, qp.srcPort, tos)
	qp.req.psn = qp.req.psn.Add(1)
	qp.flushOut()
	inc(&d.ctr.MADSent)
	return nil
}

// gsiInput takes a datagram for QP1: checks, routing to an agent, counts.
// Called with qp.mu held (the GSI's QP).
func (g *GSI) input(p *packetT, up *udp.Packet) {
	d := g.dev
	switch {
	case p.Info.Kind != bth.KindSend || p.DETH == nil || p.Info.Imm:
		inc(&d.ctr.TransportMismatch)
		return
	case p.DETH.QKey() != GSIQKey:
		inc(&d.ctr.MADDropQKey)
		return
	case len(p.Payload) != MADSize:
		inc(&d.ctr.MADDropSize)
		return
	case p.Payload[madBaseVersion] != 1:
		inc(&d.ctr.MADDropVersion)
		return
	}
	class, method := p.Payload[madMgmtClass], p.Payload[madMethod]
	g.mu.Lock()
	var a *MADAgent
	if method&madMethodResp != 0 {
		a = g.byID[uint32(binary.BigEndian.Uint64(p.Payload[madTID:])>>32)]
		if a != nil && a.class != class {
			a = nil
		}
	}
	if a == nil {
		a = g.byClass[class]
	}
	var fq *fairQueue
	if a != nil && a.req != nil {
		attr := binary.BigEndian.Uint16(p.Payload[madAttrID:])
		for _, x := range a.reqAttrs {
			if x == attr {
				fq = a.req
				break
			}
		}
	}
	g.mu.Unlock()
	if a == nil {
		inc(&d.ctr.MADDropNoAgent)
		if class == cm.ClassCM {
			g.answerUnclaimedCM(p.Payload, up)
		}
		return
	}
	m := MAD{Src: up.Addr.Unmap(), SrcQP: p.DETH.SrcQP(), TOS: up.TOS}
	copy(m.Data[:], p.Payload)
	if fq != nil {
		inc(&d.ctr.MADRcvd)
		if fq.put(&m) {
			inc(&d.ctr.MADDropQueueFull)
		}
		return
	}
	select {
	case a.c <- m:
		inc(&d.ctr.MADRcvd)
	default:
		inc(&d.ctr.MADDropQueueFull)
	}
}
