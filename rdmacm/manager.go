package rdmacm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
)

// Errors. A rejected connection returns a *RejectError, which matches
// ErrRejected, and ErrRefused when the peer has no listener for the port.
var (
	ErrRejected = errors.New("rdmacm: connection rejected")
	ErrRefused  = errors.New("rdmacm: connection refused")
	ErrTimeout  = errors.New("rdmacm: no response from the peer")
	ErrClosed   = errors.New("rdmacm: closed")
	ErrInUse    = errors.New("rdmacm: port in use")
	// ErrUnreachable: the network answered a CM message with an ICMP
	// error (nothing listens on UDP 4791 at the peer's address, or the
	// host or network is unreachable), on links that report them
	// (udp.SocketLink). The error names the address and wraps the
	// *udp.ICMPError (errors.Is(err, syscall.ECONNREFUSED) for port
	// unreachable).
	ErrUnreachable = errors.New("rdmacm: peer unreachable")
)

// RejectError is a REJ from the peer (or, for SIDR, a SIDR_REP with an
// error status).
type RejectError struct {
	Reason      cm.RejectReason
	SIDRStatus  cm.SIDRStatus // for ResolveUD
	PrivateData []byte        // the peer's REJ private data
}

func (e *RejectError) Error() string {
	if e.SIDRStatus != 0 {
		return fmt.Sprintf("rdmacm: service resolution rejected: %v", e.SIDRStatus)
	}
	return fmt.Sprintf("rdmacm: connection rejected: %v (%d)", e.Reason, uint16(e.Reason))
}

// Is makes a RejectError match ErrRejected, and ErrRefused for "invalid
// service ID" (nothing listens: librdmacm's ECONNREFUSED).
func (e *RejectError) Is(target error) bool {
	switch target {
	case ErrRejected:
		return true
	case ErrRefused:
		return e.Reason == cm.RejInvalidServiceID || e.SIDRStatus == cm.SIDRUnsupported
	}
	return false
}

// Stats counts what a device's connection manager did and dropped.
type Stats struct {
	MADsIn        uint64 // CM MADs received
	MADsOut       uint64 // CM MADs sent (retransmissions included)
	Retransmits   uint64 // MADs sent again after a response timeout
	Duplicates    uint64 // duplicate REQ/REP/DREQ answered again
	Malformed     uint64 // MADs that did not decode
	Unknown       uint64 // messages for no known connection, or unexpected in its state
	RejNoListener uint64 // REQs and SIDR_REQs for a service nobody listens on
	RejBacklog    uint64 // REQs refused because the listener's backlog was full
	RejStale      uint64 // REQs for a QP pair already connected
	Established   uint64 // connections established
	Disconnected  uint64 // connections that ended (either side)
	// QPFailed counts established connections ended because their QP
	// failed (ErrQPFailed); KeepAliveFailed those whose peer answered no
	// keep-alive probe (ErrKeepAlive); KeepAliveProbes the probes sent.
	QPFailed, KeepAliveFailed, KeepAliveProbes uint64
	// Unreachable counts ICMP errors for CM messages this device sent
	// (ErrUnreachable).
	Unreachable uint64
	// Conns is how many connections the manager holds now, in any state
	// (half-open, established, closing, TimeWait): a gauge, not a count.
	Conns uint64
}

type stats struct {
	madsIn, madsOut, retransmits, duplicates, malformed, unknown   atomic.Uint64
	rejNoListener, rejBacklog, rejStale, established, disconnected atomic.Uint64
	qpFailed, keepAliveFailed, keepAliveProbes, unreachable        atomic.Uint64
}

// manager is the connection manager of one device.
type manager struct {
	dev   *transport.Device
	agent *transport.MADAgent
	clock transport.Clock
	guid  uint64
	st    stats
	tag   cm.CommIDTag // owner bits of our communication and request IDs (shared address)

	mu        sync.Mutex
	conns     map[uint32]*Conn     // by local communication ID
	remote    map[remoteKey]*Conn  // passive side: by peer address and its comm ID
	listeners map[uint64]*Listener // by service ID
	udl       map[uint64]*UDListener
	sidr      map[uint32]*sidrWait // by request ID
	closed    bool
	stop      chan struct{} // closed by shutdown
}

type remoteKey struct {
	addr netip.Addr
	id   uint32
}

var (
	managersMu sync.Mutex
	managers   = map[*transport.Device]*manager{}
)

// managerFor returns the device's connection manager, starting it (and
// registering the CM class with the device's GSI) on first use.
func managerFor(dev *transport.Device) (*manager, error) {
	managersMu.Lock()
	defer managersMu.Unlock()
	if m := managers[dev]; m != nil {
		return m, nil
	}
	gsi, err := dev.GSI()
	if errors.Is(err, transport.ErrClosed) {
		return nil, errDeviceClosed
	}
	if err != nil {
		return nil, err
	}
	agent, err := gsi.Register(cm.ClassCM, 1024)
	if err != nil {
		return nil, fmt.Errorf("rdmacm: %w", err)
	}
	m := &manager{dev: dev, agent: agent, clock: dev.Clock(), guid: guidOf(dev.Addr()),
		conns: map[uint32]*Conn{}, remote: map[remoteKey]*Conn{}, listeners: map[uint64]*Listener{},
		udl: map[uint64]*UDListener{}, sidr: map[uint32]*sidrWait{}, stop: make(chan struct{})}
	m.tag.Tag, m.tag.Mask = dev.CommIDTag()
	// On a shared address one process answers the REQs nobody listens
	// for (exactly one REJ each): every connection manager volunteers.
	if err := dev.VolunteerRejector(); err != nil {
		agent.Close()
		return nil, fmt.Errorf("rdmacm: %w", err)
	}
	managers[dev] = m
	go m.loop()
	go m.errLoop()
	return m, nil
}

// StatsOf returns the counters of dev's connection manager (zero if it
// never started, or after its device closed).
func StatsOf(dev *transport.Device) Stats {
	managersMu.Lock()
	m := managers[dev]
	managersMu.Unlock()
	if m == nil {
		return Stats{}
	}
	s := &m.st
	m.mu.Lock()
	conns := uint64(len(m.conns))
	m.mu.Unlock()
	return Stats{Conns: conns, MADsIn: s.madsIn.Load(), MADsOut: s.madsOut.Load(), Retransmits: s.retransmits.Load(),
		Duplicates: s.duplicates.Load(), Malformed: s.malformed.Load(), Unknown: s.unknown.Load(),
		RejNoListener: s.rejNoListener.Load(), RejBacklog: s.rejBacklog.Load(), RejStale: s.rejStale.Load(),
		Established: s.established.Load(), Disconnected: s.disconnected.Load(),
		QPFailed: s.qpFailed.Load(), KeepAliveFailed: s.keepAliveFailed.Load(), KeepAliveProbes: s.keepAliveProbes.Load(),
		Unreachable: s.unreachable.Load()}
}

// guidOf makes a node GUID from the device address, the way rxe makes one
// from its MAC (an EUI-64 with the U/L bit flipped): stable per address.
func guidOf(a netip.Addr) uint64 {
	b := a.As16()
	return 0x0200_00ff_fe00_0000 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15]) | uint64(b[12])<<40
}

func random32() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}

// loop receives CM MADs until the device closes.
func (m *manager) loop() {
	for {
		mad, err := m.agent.Recv(neverDone{})
		if err != nil {
			m.shutdown()
			return
		}
		m.st.madsIn.Add(1)
		h, msg, err := cm.Decode(mad.Data[:])
		if err != nil {
			m.st.malformed.Add(1)
			continue
		}
		m.handle(&mad, &h, msg)
	}
}

// neverDone is a context that never ends: the loop ends with the device.
type neverDone struct{}

func (neverDone) Deadline() (time.Time, bool) { return time.Time{}, false }
func (neverDone) Done() <-chan struct{}       { return nil }
func (neverDone) Err() error                  { return nil }
func (neverDone) Value(any) any               { return nil }

// shutdown fails every connection when the device goes away.
func (m *manager) shutdown() {
	m.mu.Lock()
	m.closed = true
	close(m.stop)
	conns := make([]*Conn, 0, len(m.conns))
	for _, c := range m.conns {
		conns = append(conns, c)
	}
	waits := make([]*sidrWait, 0, len(m.sidr))
	for _, w := range m.sidr {
		waits = append(waits, w)
	}
	for _, l := range m.listeners {
		l.closeErr = errDeviceClosed
		l.closeLocked()
	}
	m.mu.Unlock()
	for _, c := range conns {
		m.mu.Lock()
		c.finishLocked(errDeviceClosed)
		m.mu.Unlock()
	}
	for _, w := range waits {
		w.done(sidrResult{err: errDeviceClosed})
	}
	managersMu.Lock()
	if managers[m.dev] == m {
		delete(managers, m.dev)
	}
	managersMu.Unlock()
	m.agent.Close()
}

// errLoop ends the connections whose CM messages the network bounced.
func (m *manager) errLoop() {
	for {
		select {
		case e := <-m.agent.Unreachable():
			m.onUnreachable(e.Dst, e.Payload, e)
		case <-m.stop:
			return
		}
	}
}

// onUnreachable: a REQ (or REP) of ours came back as an ICMP error: the
// connection waiting for its answer fails now, with an error naming the
// address, instead of resending for MaxRetries response timeouts.
// dst and payload are the bounced datagram's destination and quoted UDP
// payload, icmp the error (a *udp.ICMPError).
func (m *manager) onUnreachable(dst netip.Addr, payload []byte, icmp error) {
	if len(payload) < transport.MADOffset+16 {
		return
	}
	tid := binary.BigEndian.Uint64(payload[transport.MADOffset+8:])
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st.unreachable.Add(1)
	for _, c := range m.conns {
		if (c.state == stREQSent || c.state == stREPSent) && c.peer == dst && c.tid == tid {
			op := "Dial"
			if !c.active {
				op = "Accept"
			}
			c.finishLocked(fmt.Errorf("rdmacm: %s %v: %w: %w", op, netip.AddrPortFrom(c.peer, c.remotePort), ErrUnreachable, icmp))
		}
	}
}

func (m *manager) handle(mad *transport.MAD, h *cm.HeaderFields, msg cm.Message) {
	switch f := msg.(type) {
	case *cm.REQFields:
		m.onREQ(mad, h, f)
	case *cm.MRAFields:
		m.onMRA(f)
	case *cm.REJFields:
		m.onREJ(mad, f)
	case *cm.REPFields:
		m.onREP(mad, f)
	case *cm.RTUFields:
		m.onRTU(f)
	case *cm.DREQFields:
		m.onDREQ(mad, h, f)
	case *cm.DREPFields:
		m.onDREP(f)
	case *cm.SIDRREQFields:
		m.onSIDRREQ(mad, h, f)
	case *cm.SIDRREPFields:
		m.onSIDRREP(f)
	default:
		m.st.unknown.Add(1)
	}
}

// send encodes and sends one CM MAD to the peer's QP1.
func (m *manager) send(dst netip.Addr, tos uint8, tid uint64, msg cm.Message, out *[transport.MADSize]byte) error {
	h := cm.NewHeader(0, tid)
	if err := cm.Encode(out[:], &h, msg); err != nil {
		return err
	}
	m.st.madsOut.Add(1)
	return m.agent.Send(dst, 1, tos, out[:])
}

// newLocalID returns a communication ID no live connection uses. Called
// with m.mu held.
func (m *manager) newLocalID() uint32 {
	for {
		id := m.tag.Apply(random32())
		if _, busy := m.conns[id]; id != 0 && !busy {
			return id
		}
	}
}

// rejectUnknown answers a REQ that creates no state with a REJ.
func (m *manager) rejectUnknown(mad *transport.MAD, h *cm.HeaderFields, remoteID uint32, kind cm.MsgKind, reason cm.RejectReason) {
	rej := &cm.REJFields{RemoteCommID: remoteID, MessageRejected: kind, Reason: reason}
	var out [transport.MADSize]byte
	m.send(mad.Src, mad.TOS, h.TransactionID, rej, &out)
}
