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
	"github.com/gorocev2/rocev2/internal/cmjournal"
	"github.com/gorocev2/rocev2/transport"
)

// Errors. A rejected connection returns a *RejectError, which matches
// ErrRejected, and ErrRefused when the peer has no listener for the port.
var (
	ErrRejected = errors.New("rdmacm: connection rejected")
	ErrRefused  = errors.New("rdmacm: connection refused")
	ErrTimeout  = errors.New("rdmacm: no response from the peer")
	ErrClosed   = errors.New("rdmacm: closed")
	// ErrInUse: a port (Listen, ListenUD) or the device (NewManager: it
	// has a connection manager already) is taken.
	ErrInUse = errors.New("rdmacm: in use")
	// ErrUnreachable: the network answered a CM message with an ICMP
	// error (nothing listens on UDP 4791 at the peer's address — or the
	// address is shared, udp/share, by processes none of which runs a
	// connection manager, whose steering program drops the message — or
	// the host or network is unreachable), on links that report them
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

// Error gives the SIDR status for a refused ResolveUD, else the REJ's
// reason and its number, e.g. "rdmacm: connection rejected: invalid
// service ID (8)".
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
	Duplicates    uint64 // duplicate REQ/REP/DREQ answered again; MRAs after a message's first (ignored)
	Malformed     uint64 // MADs that did not decode
	Unknown       uint64 // messages for no known connection, or unexpected in its state
	RejNoListener uint64 // REQs and SIDR_REQs for a service nobody listens on
	RejBacklog    uint64 // REQs refused because the listener's backlog was full
	RejStale      uint64 // REQs for a QP pair already connected
	Established   uint64 // connections established
	Disconnected  uint64 // connections that ended (either side)
	// Shed counts half-open connections a listener dropped, oldest (of
	// the source holding the most) first, to admit a newer request when
	// its backlog was full: an unanswered one without a word, one
	// answered (its QP set up, its REP sent) with a REJ (no resources).
	Shed uint64
	// BacklogDropped counts REQs a listener with a full backlog dropped
	// on arrival, without a word, instead of shedding a request: their
	// source held the most, and all its other requests were answered
	// (or sent again). Each requester sends its REQ again.
	BacklogDropped uint64
	// AcceptQueueFull counts requests Listener.Accept left waiting
	// unanswered (no QP created, no REP sent) because its accept queue
	// was full — Backlog connections answered or established and not
	// yet handed out by Accept — or their source address held its half
	// of it (ListenOptions.Backlog); each counts once. AcceptQueueDropped
	// counts those that ended still waiting: the listener's
	// HalfOpenTimeout (a REJ, timeout), shedding, the requester giving up
	// or the listener closing. AcceptQueueEvicted counts connections that
	// ended in the accept queue and were released unseen, because more
	// than Backlog such waited for Accept.
	AcceptQueueFull, AcceptQueueDropped, AcceptQueueEvicted uint64
	// SpoofDropped counts REJs that named a connection by one
	// communication ID (or the wrong source address) and were ignored:
	// an established connection ends on a REJ or DREQ only when both IDs
	// and the address match.
	SpoofDropped uint64
	// StrayDREQ counts DREQs for no known connection (each answered
	// with a DREP, so a peer that lost its state stops sending them).
	StrayDREQ uint64
	// DREQForDead counts the DREQs this manager sent for the connections
	// of dead processes on its address (the connection journal,
	// JournalEnv): each once, as Linux's kernel sends them for a killed
	// process's cm_ids. DREPForDead counts the peers' DREPs to them (not
	// counted as Unknown).
	DREQForDead, DREPForDead uint64
	// FarewellDREQs counts the DREQs Manager.Close or Device.Close sent
	// for connections the application left established (each sent once,
	// its DREP not awaited).
	FarewellDREQs uint64
	// RejSent and RejRecv count REJs sent and received by reason.
	RejSent, RejRecv map[cm.RejectReason]uint64
	// Ended counts connections that ended, by cause (a connection counts
	// once, by what ended it first).
	Ended map[Cause]uint64
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
	// TimeWait is how many of them wait out their TimeWait (a gauge).
	TimeWait uint64
}

type stats struct {
	madsIn, madsOut, retransmits, duplicates, malformed, unknown   atomic.Uint64
	rejNoListener, rejBacklog, rejStale, established, disconnected atomic.Uint64
	shed, spoofDropped, strayDREQ, farewellDREQs, backlogDropped   atomic.Uint64
	dreqForDead, drepForDead                                       atomic.Uint64
	acceptQFull, acceptQDropped, acceptQEvicted                    atomic.Uint64
	rejSent, rejRecv                                               [maxReason + 1]atomic.Uint64
	ended                                                          [numCauses]atomic.Uint64
	qpFailed, keepAliveFailed, keepAliveProbes, unreachable        atomic.Uint64
}

// maxReason is the highest REJ reason counted by its own number; higher
// (vendor, reserved) reasons count under it.
const maxReason = 63

func reasonSlot(r cm.RejectReason) int { return int(min(uint16(r), maxReason)) }

// Manager is the connection manager of one device: it registers the CM
// management class with the device's GSI, runs the state machine of every
// connection, listener and SIDR exchange of the device (dispatch.go) and
// counts what it did (Stats). NewManager starts one; Dial, Listen,
// ResolveUD and ListenUD are its methods. The package-level functions of
// the same names use the device's manager, starting one on first use: a
// device has at most one (the CM class has one agent per GSI), so
// NewManager on a device that has one fails with ErrInUse.
type Manager struct {
	dev   *transport.Device
	agent *transport.MADAgent
	clock transport.Clock
	guid  uint64
	st    stats
	tag   cm.CommIDTag // owner bits of our communication and request IDs (shared address)

	mu        sync.Mutex
	conns     map[uint32]*Conn     // by local communication ID
	remote    map[remoteKey]*Conn  // passive side: by peer address and its comm ID
	byQPN     map[qpnKey]*Conn     // by peer address and QPN, while it can match (stale check)
	gaveUp    map[remoteKey]bool   // requesters whose REJ "timeout" came before their REQ was handled
	shedIDs   map[remoteKey]bool   // requests shed unanswered (a REQ sent again proves its requester is there)
	nextID    uint32               // local comm IDs: a counter ...
	idXor     uint32               // ... XORed with a random value (as Linux's cm.c)
	timeWait  int                  // connections in TimeWait
	listeners map[uint64]*Listener // by service ID
	udl       map[uint64]*UDListener
	sidr      map[uint32]*sidrWait // by request ID
	closed    bool
	stop      chan struct{} // closed by shutdown
	down      chan struct{} // closed when shutdown is done
	// closeErr and closeCause are what shutdown ends everything with:
	// errDeviceClosed and CauseDeviceClosed unless Close set them.
	closeErr   error
	closeCause Cause
	// leaving: the peers were told (farewell); stopFarewell
	// unregisters farewell from the device's Close.
	leaving      atomic.Bool   // set under m.mu by farewell; read without it
	farewellDone chan struct{} // closed when the farewell is sent
	stopFarewell func() bool
	// The connection journal (replay.go): nil without one (journalErr
	// says why); deadSent the dead connections' DREQs awaiting DREPs.
	// abandoned: Dials given up before the REP (their REJ sent with no
	// remote ID), by local comm ID, to answer a late REP (onREP).
	abandoned  map[uint32]abandonedDial
	jr         *cmjournal.Journal
	journalErr error
	deadSent   map[uint32]deadSent
	// replayed is closed when the first replay of the dead owners'
	// records is done (the guardian waits for it).
	replayed chan struct{}
	// journalDone is what the journal hook (SetJournalHook) returned
	// for this manager: called once its journal closed.
	journalDone func()
}

type remoteKey struct {
	addr netip.Addr
	id   uint32
}

// byDevice is the index of the running managers by device, which the
// package-level functions (Dial, Listen, ResolveUD, ListenUD, StatsOf)
// look a device's manager up in; each entry leaves when its manager shuts
// down. The state of the connections lives in the Manager.
var (
	byDeviceMu sync.Mutex
	byDevice   = map[*transport.Device]*Manager{}
)

// NewManager starts the connection manager of dev: it registers the CM
// class (0x07) with the device's GSI, volunteers to answer the requests
// nobody listens for on a shared address, and handles the device's CM
// messages until Close or until the device closes. A device has one
// manager: NewManager fails with ErrInUse when dev has one already (a
// previous NewManager, or the one the package-level functions started).
func NewManager(dev *transport.Device) (*Manager, error) {
	if dev == nil {
		return nil, errNilDevice("NewManager")
	}
	byDeviceMu.Lock()
	defer byDeviceMu.Unlock()
	if byDevice[dev] != nil {
		return nil, fmt.Errorf("rdmacm: NewManager: %w: the device %v has a connection manager already (ManagerOf returns it: use it, or Close it first)", ErrInUse, dev.Addr())
	}
	return startLocked(dev)
}

// managerFor returns the device's connection manager for the
// package-level functions, starting one on first use.
func managerFor(dev *transport.Device) (*Manager, error) {
	byDeviceMu.Lock()
	defer byDeviceMu.Unlock()
	if m := byDevice[dev]; m != nil {
		return m, nil
	}
	return startLocked(dev)
}

// startLocked starts dev's manager and enters it in byDevice. Called with
// byDeviceMu held.
func startLocked(dev *transport.Device) (*Manager, error) {
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
	// Requests, which anyone may send at any rate, queue apart: a flood
	// of them does not push out the answers that complete handshakes.
	agent.SeparateRequests(1024, uint16(cm.AttrREQ), uint16(cm.AttrSIDRREQ))
	m := &Manager{dev: dev, agent: agent, clock: dev.Clock(), guid: guidOf(dev.Addr()),
		conns: map[uint32]*Conn{}, remote: map[remoteKey]*Conn{}, byQPN: map[qpnKey]*Conn{},
		nextID: random32(), idXor: random32(), listeners: map[uint64]*Listener{},
		gaveUp: map[remoteKey]bool{}, shedIDs: map[remoteKey]bool{},
		udl: map[uint64]*UDListener{}, sidr: map[uint32]*sidrWait{}, deadSent: map[uint32]deadSent{}, abandoned: map[uint32]abandonedDial{}, replayed: make(chan struct{}), farewellDone: make(chan struct{}), stop: make(chan struct{}), down: make(chan struct{}),
		closeErr: errDeviceClosed, closeCause: CauseDeviceClosed}
	m.tag.Tag, m.tag.Mask = dev.CommIDTag()
	// On a shared address one process answers the REQs nobody listens
	// for (exactly one REJ each): every connection manager volunteers.
	if err := dev.VolunteerRejector(); err != nil {
		agent.Close()
		return nil, fmt.Errorf("rdmacm: %w", err)
	}
	m.stopFarewell = dev.OnClose(m.farewell)
	m.openJournal() // before the loops, which read m.jr
	if m.jr != nil {
		if h := journalHook.Load(); h != nil {
			m.journalDone = (*h)(m.jr.Dir(), m.jr.RootDir(), dev.Addr())
		}
	}
	byDevice[dev] = m
	go m.loop()
	go m.errLoop()
	if m.jr != nil {
		go m.replayLoop()
	}
	return m, nil
}

// Device returns the device the manager serves.
func (m *Manager) Device() *transport.Device { return m.dev }

// Close stops the manager: its listeners close, and its connections and
// pending Dials, Accepts and ResolveUDs end with ErrClosed
// (CauseManagerClosed). Each peer is told first, as Linux's
// rdma_destroy_id tells it: one DREQ for an established connection (not
// sent again, its DREP not awaited — Conn.Close is the goodbye that waits
// for the peer), a REJ for a connection in its handshake. It returns when
// all of that is done; the device stays open, and NewManager (or a
// package-level function) may start a new manager on it. Closing a closed
// manager does nothing.
//
// Closing the device does the same for its manager: its peers are told
// before the device's QPs fail (Device.OnClose).
func (m *Manager) Close() error {
	m.mu.Lock()
	if !m.closed {
		m.closeErr, m.closeCause = errManagerClosed, CauseManagerClosed
	}
	m.mu.Unlock()
	m.farewell()
	m.stopFarewell()
	m.agent.Close()
	<-m.down
	return nil
}

// Stats returns the manager's counters.
func (m *Manager) Stats() Stats {
	s := &m.st
	st := Stats{MADsIn: s.madsIn.Load(), MADsOut: s.madsOut.Load(), Retransmits: s.retransmits.Load(),
		Duplicates: s.duplicates.Load(), Malformed: s.malformed.Load(), Unknown: s.unknown.Load(),
		RejNoListener: s.rejNoListener.Load(), RejBacklog: s.rejBacklog.Load(), RejStale: s.rejStale.Load(),
		Established: s.established.Load(), Disconnected: s.disconnected.Load(),
		QPFailed: s.qpFailed.Load(), KeepAliveFailed: s.keepAliveFailed.Load(), KeepAliveProbes: s.keepAliveProbes.Load(),
		Unreachable: s.unreachable.Load(),
		Shed:        s.shed.Load(), BacklogDropped: s.backlogDropped.Load(), SpoofDropped: s.spoofDropped.Load(), StrayDREQ: s.strayDREQ.Load(), FarewellDREQs: s.farewellDREQs.Load(),
		DREQForDead: s.dreqForDead.Load(), DREPForDead: s.drepForDead.Load(),
		AcceptQueueFull: s.acceptQFull.Load(), AcceptQueueDropped: s.acceptQDropped.Load(), AcceptQueueEvicted: s.acceptQEvicted.Load(),
		RejSent: map[cm.RejectReason]uint64{}, RejRecv: map[cm.RejectReason]uint64{}, Ended: map[Cause]uint64{}}
	for i := range s.rejSent {
		if v := s.rejSent[i].Load(); v != 0 {
			st.RejSent[cm.RejectReason(i)] = v
		}
		if v := s.rejRecv[i].Load(); v != 0 {
			st.RejRecv[cm.RejectReason(i)] = v
		}
	}
	for i := range s.ended {
		if v := s.ended[i].Load(); v != 0 {
			st.Ended[Cause(i)] = v
		}
	}
	m.mu.Lock()
	st.Conns, st.TimeWait = uint64(len(m.conns)), uint64(m.timeWait)
	m.mu.Unlock()
	return st
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

// loopBatch is how many requests the manager takes at once.
const loopBatch = 64

// neverDone is a context that never ends: the loop ends with the device.
type neverDone struct{}

func (neverDone) Deadline() (time.Time, bool) { return time.Time{}, false }
func (neverDone) Done() <-chan struct{}       { return nil }
func (neverDone) Err() error                  { return nil }
func (neverDone) Value(any) any               { return nil }

// agentGone reports whether the manager's agent or device is closed (the
// device closed, or Close closed the manager) while the manager's loop may not
// have shut it down yet: a call that starts then fails as one after the
// shutdown does, with m.closeErr.
func (m *Manager) agentGone() bool {
	select {
	case <-m.agent.Done():
		return true
	default:
	}
	// Device.Close may return before it has closed the agents.
	_, err := m.dev.GSI()
	return errors.Is(err, transport.ErrClosed)
}

// farewell tells the peers of the manager's connections that they end,
// as Linux's cm_destroy_id does when an application destroys a connected
// ID: one DREQ for each established connection (with what its QP has
// queued for the wire sent first, as Conn.Close does), not sent again and
// its DREP not awaited; a REJ for each connection in its handshake (reason
// timeout from the active side, consumer from the passive side, as abort
// sends), with a DREQ after it when the REP went out (the peer may be
// established already). Connections in a disconnect of their own are left
// to it. From then on the manager completes no handshake (leaving). It runs
// once, from Manager.Close or Device.Close (OnClose), before shutdown
// fails the connections. A killed process sends nothing itself: the
// connection journal has the next manager on its address send the DREQs
// (journal_linux.go, docs/connection-life.md).
func (m *Manager) farewell() {
	m.mu.Lock()
	if m.leaving.Load() { // being sent by another Close: wait for it
		m.mu.Unlock()
		<-m.farewellDone
		return
	}
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.leaving.Store(true)
	var out []farewellMAD
	for _, c := range m.conns {
		add := func(msg cm.Message) {
			out = append(out, farewellMAD{peer: c.peer, tos: c.opts.TrafficClass, tid: c.tid, msg: msg, mod: c.eceMod(msg)})
		}
		switch c.state {
		case stEstablished:
			c.qp.SendQueued()
			add(&cm.DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.params.DestQPN})
			m.st.farewellDREQs.Add(1)
			c.unjournalLocked() // told: no later process tells it again
		case stREQSent, stREQRcvd, stREPSent:
			add(c.giveUpREJLocked())
			if c.state == stREPSent {
				// The peer may have the REP and be established
				// already (its RTU on the way): a REJ means nothing
				// to an established connection, a DREQ does.
				add(&cm.DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.params.DestQPN})
			}
		}
	}
	m.mu.Unlock()
	// Paced as the journal's replay is: a peer host with a thousand of
	// these connections would drop a burst at its CM's queue (seen: 2 of
	// 1021 DREQs lost to one peer manager's 1024-MAD queue).
	var buf [transport.MADSize]byte
	for i, f := range out {
		if i > 0 && i%replayBatch == 0 {
			time.Sleep(replayPause)
		}
		m.sendMod(f.peer, f.tos, f.tid, f.msg, &buf, f.mod)
	}
	close(m.farewellDone)
}

// farewellMAD is one message of the farewell.
type farewellMAD struct {
	peer netip.Addr
	tos  uint8
	tid  uint64
	msg  cm.Message
	mod  uint32
}

// shutdown fails every connection when the device goes away or Close
// closed the manager's agent.
func (m *Manager) shutdown() {
	m.stopFarewell()
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
	closeErr, cause := m.closeErr, m.closeCause
	for _, l := range m.listeners {
		l.closeErr = closeErr
		l.closeLocked()
	}
	m.mu.Unlock()
	for _, c := range conns {
		m.mu.Lock()
		c.endedBy(cause)
		c.finishLocked(closeErr)
		m.mu.Unlock()
	}
	for _, w := range waits {
		w.done(sidrResult{err: closeErr})
	}
	if m.jr != nil {
		m.jr.Close()
	}
	if m.journalDone != nil {
		m.journalDone() // after the journal closed: nothing left to send
	}
	m.agent.Close()
	byDeviceMu.Lock()
	if byDevice[m.dev] == m {
		delete(byDevice, m.dev)
	}
	byDeviceMu.Unlock()
	close(m.down)
}

// send encodes and sends one CM MAD to the peer's QP1.
func (m *Manager) send(dst netip.Addr, tos uint8, tid uint64, msg cm.Message, out *[transport.MADSize]byte) error {
	return m.sendMod(dst, tos, tid, msg, out, 0)
}

// sendMod is send with the MAD header's AttributeModifier (ECE options).
func (m *Manager) sendMod(dst netip.Addr, tos uint8, tid uint64, msg cm.Message, out *[transport.MADSize]byte, attrMod uint32) error {
	h := cm.NewHeader(0, tid)
	h.AttributeModifier = attrMod
	if err := cm.Encode(out[:], &h, msg); err != nil {
		return err
	}
	m.st.madsOut.Add(1)
	if r, ok := msg.(*cm.REJFields); ok {
		m.st.rejSent[reasonSlot(r.Reason)].Add(1)
	}
	return m.agent.Send(dst, 1, tos, out[:])
}

// newLocalID returns a communication ID no known connection uses (in
// TimeWait included): a counter XORed with a random value drawn when the
// manager started, as Linux's cm.c numbers its IDs, so that IDs do not
// repeat for 2^32 connections and a restarted process does not start
// where its previous life did. Called with m.mu held.
func (m *Manager) newLocalID() uint32 {
	for {
		// On a shared address the top byte names this process
		// (cm.CommIDTag): the replies are steered to it.
		id := m.tag.Apply(m.nextID ^ m.idXor)
		m.nextID++
		if _, busy := m.conns[id]; id != 0 && !busy {
			return id
		}
	}
}
