package nvmf

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

// Namespace is one namespace of a subsystem.
type Namespace struct {
	// ID is the namespace ID (1..); zero takes the next free one.
	ID uint32
	// Backend holds the blocks; its size is rounded down to whole blocks.
	Backend Backend
	// BlockSize is the LBA data size: 512 (default) or 4096.
	BlockSize int
	// ReadOnly refuses writes (namespace write protected).
	ReadOnly bool
	// NGUID is the namespace's globally unique ID; zero derives one
	// from the subsystem NQN and the namespace ID. A host that reconnects
	// compares it with the one it knew (Linux drops the namespace when it
	// changed): give each set of data its own — derived from what backs
	// it, as rocev2d nvmf-target does from a file's device, inode and
	// birth time, random for memory that a restart empties — or a host
	// reconnecting to a target restarted on other data takes that data
	// for its old disk.
	NGUID [16]byte

	shift  uint8
	blocks atomic.Uint64 // the size in blocks (RevalidateNamespace changes it)
	// running is held shared by each command executing on the Backend
	// (Subsystem.acquire); RemoveNamespace takes it to wait for them.
	running sync.RWMutex
}

// Subsystem is an NVM subsystem a target exports.
type Subsystem struct {
	// NQN is the subsystem's NVMe Qualified Name.
	NQN string
	// Namespaces are its namespaces (at least one). Once the target
	// runs, change them only through the Target's AddNamespace,
	// RemoveNamespace and RevalidateNamespace: they tell the connected
	// hosts (docs/NVMEOF.md, "Namespace changes").
	Namespaces []*Namespace
	// AllowedHosts lists the host NQNs that may connect; empty allows
	// any host.
	AllowedHosts []string
	// Serial and Model fill Identify Controller (defaults derived from
	// the NQN and "rocev2").
	Serial, Model string

	mu sync.RWMutex // Namespaces, once the target runs
}

// TargetConfig configures a target.
type TargetConfig struct {
	// Port is the rdma_cm port (TCP port space), default 4420.
	Port uint16
	// Subsystems are what the target exports (at least one).
	Subsystems []*Subsystem
	// InlineDataSize is the in-capsule data an I/O command may carry
	// (default 4096, at most 16384; negative: none).
	InlineDataSize int
	// MaxQueueSize bounds an I/O queue's entries (default 128, at most
	// 1024); the admin queue has 32.
	MaxQueueSize int
	// MaxIOQueues bounds the I/O queues of one controller (default 8).
	MaxIOQueues int
	// MaxControllers bounds the controllers (hosts' associations) at once
	// (default 64). Controller IDs go round [1, 0xffef] (as nvmet's); a
	// Connect finding all of them live is refused as busy.
	MaxControllers int
	// QueueBufferBytes bounds the data buffers one queue holds at once
	// (default 16 MiB); commands beyond it wait for buffers to free.
	QueueBufferBytes int
	// Backlog bounds connection requests waiting to be accepted
	// (default 128).
	Backlog int
	// PathMTU is the largest path MTU a queue accepts (default 1024, what
	// rxe uses on a 1500-byte Ethernet). A queue takes the host's (the
	// one its connection request names, as Linux's CM does: both ends
	// must use the same); a host asking for more is rejected (rdmacm:
	// invalid path MTU). On a link that carries 4096-byte payloads, set
	// 4096 to accept every host.
	PathMTU transport.MTU
	// ConnectTimeout is how long a queue may stay connected without a
	// Fabrics Connect before the target closes it (default 10 s).
	ConnectTimeout time.Duration
	// DiscoveryKATO is the keep-alive timeout of a discovery controller
	// whose Connect asks for none (KATO 0, as Discover and nvme-cli's
	// discover send): default 120 s, nvmet's NVMET_DISC_KATO_MS; negative
	// keeps such a controller as long as its connection. (Idle, it would
	// otherwise hold one of MaxControllers for as long as the connection
	// lives.) It counts in milliseconds (less is 1 ms), at most MaxKATO.
	DiscoveryKATO time.Duration
	// NoSelectiveRepeat refuses selective repeat to hosts that offer it
	// (HostConfig.SelectiveRepeat). By default a queue whose connection
	// request offers it runs it; a request without the offer (Linux's
	// nvme-rdma) gets the same reply as before, and go-back-N.
	NoSelectiveRepeat bool
	// Log, if set, receives one line per connection event.
	Log func(format string, args ...any)

	// testNoInvalidate (tests): answer every command with a plain SEND,
	// as a target that ignores the host's invalidate request would.
	testNoInvalidate bool
}

// Limits.
const (
	// MDTS is the maximum data transfer size exponent the target
	// advertises: 2^8 pages of 4 KiB = 1 MiB per command (nvmet-rdma's).
	MDTS = 8
	// MaxTransfer is the largest data transfer of one command.
	MaxTransfer = 4096 << MDTS
	// kas is the keep-alive granularity advertised in Identify (100 ms units).
	kas = 10
	// aerLimit is how many Asynchronous Event Requests a controller holds (AERL+1).
	aerLimit = 4
	// MaxKATO is the largest keep-alive timeout: KATO is a 32-bit count
	// of milliseconds (about 49.7 days).
	MaxKATO = time.Duration(1<<32-1) * time.Millisecond
)

// TargetStats are a target's counters.
type TargetStats struct {
	Connections   uint64 // queue connections accepted
	Rejected      uint64 // connection requests refused with an NVMe-RDMA REJ
	Disconnects   uint64 // queue connections ended
	Controllers   uint64 // controllers created (admin Connects accepted)
	LiveCtrls     int64  // controllers alive now
	Commands      uint64 // commands received
	Errors        uint64 // completions with a non-success status
	Malformed     uint64 // capsules too short to be a command
	ReadBytes     uint64 // bytes read by hosts (Read)
	WriteBytes    uint64 // bytes written by hosts (Write)
	KATOExpired   uint64 // controllers deleted because keep-alive expired
	TransportErrs uint64 // work completions with an error status (a queue torn down)
	Waits         uint64 // commands that waited for a data buffer
	Invalidates   uint64 // responses sent as SEND with Invalidate (the host asked: keyed SGL subtype 0xF)
}

type targetStats struct {
	connections, rejected, disconnects, controllers, commands, errs, malformed atomic.Uint64
	readBytes, writeBytes, katoExpired, transportErrs, waits, invalidates      atomic.Uint64
	live                                                                       atomic.Int64
}

// Target is an NVMe over Fabrics target on RDMA: an rdma_cm listener on
// one device whose connections are NVMe queues of controllers of its
// subsystems and of its discovery controller.
type Target struct {
	dev    *transport.Device
	cfg    TargetConfig
	subs   map[string]*Subsystem
	l      *rdmacm.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	st     targetStats
	inline int

	mu     sync.Mutex
	ctrls  map[uint16]*tctrl
	queues map[*tqueue]struct{}
	nextID uint16
	closed bool
}

// Listen starts a target on dev: it listens on cfg.Port and serves until
// Close.
func Listen(dev *transport.Device, cfg TargetConfig) (*Target, error) {
	if dev == nil {
		return nil, errors.New("nvmf: Listen: dev is nil")
	}
	if cfg.Port == 0 {
		cfg.Port = nvme.Port
	}
	switch {
	case cfg.InlineDataSize == 0:
		cfg.InlineDataSize = 4096
	case cfg.InlineDataSize < 0:
		cfg.InlineDataSize = 0
	case cfg.InlineDataSize > 16384:
		return nil, fmt.Errorf("nvmf: TargetConfig.InlineDataSize %d exceeds 16384", cfg.InlineDataSize)
	}
	if cfg.MaxQueueSize == 0 {
		cfg.MaxQueueSize = 128
	}
	if cfg.MaxQueueSize < 2 || cfg.MaxQueueSize > 1024 {
		return nil, fmt.Errorf("nvmf: TargetConfig.MaxQueueSize %d not in 2..1024", cfg.MaxQueueSize)
	}
	if cfg.MaxIOQueues <= 0 {
		cfg.MaxIOQueues = 8
	}
	if cfg.MaxControllers <= 0 {
		cfg.MaxControllers = 64
	}
	if cfg.QueueBufferBytes <= 0 {
		cfg.QueueBufferBytes = 16 << 20
	}
	cfg.QueueBufferBytes = max(cfg.QueueBufferBytes, MaxTransfer)
	if cfg.Backlog <= 0 {
		cfg.Backlog = 128
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.DiscoveryKATO == 0 {
		cfg.DiscoveryKATO = 120 * time.Second
	}
	if cfg.DiscoveryKATO > MaxKATO {
		// Beyond the 32-bit count of milliseconds KATO is: it wrapped
		// (2^32 ms became 0, then 1 ms: every discovery controller
		// expired at once).
		return nil, fmt.Errorf("nvmf: TargetConfig.DiscoveryKATO %v exceeds MaxKATO (%v)", cfg.DiscoveryKATO, MaxKATO)
	}
	if len(cfg.Subsystems) == 0 {
		return nil, errors.New("nvmf: TargetConfig.Subsystems is empty")
	}
	t := &Target{dev: dev, cfg: cfg, subs: map[string]*Subsystem{}, ctrls: map[uint16]*tctrl{}, queues: map[*tqueue]struct{}{},
		inline: cfg.InlineDataSize, nextID: 1}
	for i, s := range cfg.Subsystems {
		if err := s.check(i); err != nil {
			return nil, err
		}
		if _, dup := t.subs[s.NQN]; dup || s.NQN == nvme.DiscoveryNQN {
			return nil, fmt.Errorf("nvmf: TargetConfig.Subsystems[%d].NQN %q used twice or reserved", i, s.NQN)
		}
		t.subs[s.NQN] = s
	}
	l, err := rdmacm.Listen(dev, cfg.Port, &rdmacm.ListenOptions{Backlog: cfg.Backlog})
	if err != nil {
		return nil, fmt.Errorf("nvmf: %w", err)
	}
	t.l = l
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

func (s *Subsystem) check(i int) error {
	if s == nil {
		return fmt.Errorf("nvmf: TargetConfig.Subsystems[%d] is nil", i)
	}
	if s.NQN == "" || len(s.NQN) > nvme.NQNSize-1 {
		return fmt.Errorf("nvmf: TargetConfig.Subsystems[%d].NQN %q: empty or longer than 255 bytes", i, s.NQN)
	}
	if len(s.Namespaces) == 0 {
		return fmt.Errorf("nvmf: TargetConfig.Subsystems[%d].Namespaces is empty", i)
	}
	used := map[uint32]bool{}
	for j, ns := range s.Namespaces {
		if err := ns.setup(s.NQN, used, fmt.Sprintf("Subsystems[%d].Namespaces[%d]", i, j)); err != nil {
			return err
		}
	}
	if s.Serial == "" {
		h := sha256.Sum256([]byte(s.NQN))
		s.Serial = fmt.Sprintf("%x", h[:10])
	}
	if s.Model == "" {
		s.Model = "rocev2"
	}
	return nil
}

// setup checks ns and fills in its defaults: the block size, the size in
// blocks, the ID (the lowest one not in used) and the NGUID. name names
// it in errors.
func (ns *Namespace) setup(nqn string, used map[uint32]bool, name string) error {
	if ns == nil {
		return fmt.Errorf("nvmf: %s is nil", name)
	}
	if ns.BlockSize == 0 {
		ns.BlockSize = 512
	}
	switch ns.BlockSize {
	case 512:
		ns.shift = 9
	case 4096:
		ns.shift = 12
	default:
		return fmt.Errorf("nvmf: %s.BlockSize %d (512 or 4096)", name, ns.BlockSize)
	}
	if ns.Backend == nil {
		return fmt.Errorf("nvmf: %s.Backend is nil", name)
	}
	blocks := uint64(max(ns.Backend.Size(), 0)) >> ns.shift
	if blocks == 0 {
		return fmt.Errorf("nvmf: %s: backend smaller than a block", name)
	}
	ns.blocks.Store(blocks)
	if ns.ID == 0 {
		for ns.ID = 1; used[ns.ID]; ns.ID++ {
		}
	}
	if used[ns.ID] || ns.ID == 0xffffffff {
		return fmt.Errorf("nvmf: %s.ID %d used twice or invalid", name, ns.ID)
	}
	used[ns.ID] = true
	if ns.NGUID == [16]byte{} {
		h := sha256.Sum256([]byte(nqn + "/" + strconv.Itoa(int(ns.ID))))
		copy(ns.NGUID[:], h[:16])
	}
	return nil
}

// acquire returns namespace id with its running lock held shared (the
// caller releases it when its command is done with the Backend), or nil.
// The lock is taken before s.mu is released: RemoveNamespace, which
// takes it after dropping the namespace from the list, waits for every
// command that found the namespace.
func (s *Subsystem) acquire(id uint32) *Namespace {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, ns := range s.Namespaces {
		if ns.ID == id {
			ns.running.RLock()
			return ns
		}
	}
	return nil
}

// namespace returns namespace id, or nil.
func (s *Subsystem) namespace(id uint32) *Namespace {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, ns := range s.Namespaces {
		if ns.ID == id {
			return ns
		}
	}
	return nil
}

func (s *Subsystem) allows(host string) bool {
	if len(s.AllowedHosts) == 0 {
		return true
	}
	for _, h := range s.AllowedHosts {
		if h == host {
			return true
		}
	}
	return false
}

// Addr returns the address the target listens on.
func (t *Target) Addr() netip.AddrPort { return t.l.Addr() }

// Stats returns the target's counters.
func (t *Target) Stats() TargetStats {
	s := &t.st
	return TargetStats{Connections: s.connections.Load(), Rejected: s.rejected.Load(), Disconnects: s.disconnects.Load(),
		Controllers: s.controllers.Load(), LiveCtrls: s.live.Load(), Commands: s.commands.Load(), Errors: s.errs.Load(),
		Malformed: s.malformed.Load(), ReadBytes: s.readBytes.Load(), WriteBytes: s.writeBytes.Load(),
		KATOExpired: s.katoExpired.Load(), TransportErrs: s.transportErrs.Load(), Waits: s.waits.Load(),
		Invalidates: s.invalidates.Load()}
}

// Queues returns the number of queue connections alive (for tests and
// monitoring: zero after every host left).
func (t *Target) Queues() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queues)
}

func (t *Target) logf(format string, args ...any) {
	if t.cfg.Log != nil {
		t.cfg.Log(format, args...)
	}
}

// Close stops listening, disconnects every queue and waits for them.
func (t *Target) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	qs := make([]*tqueue, 0, len(t.queues))
	for q := range t.queues {
		qs = append(qs, q)
	}
	t.mu.Unlock()
	err := t.l.Close()
	t.cancel()
	for _, q := range qs {
		q.shutdown()
	}
	t.wg.Wait()
	return err
}

func (t *Target) acceptLoop() {
	defer t.wg.Done()
	for {
		r, err := t.l.Next(t.ctx)
		if err != nil {
			return
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			t.accept(r)
		}()
	}
}

func rejectData(st nvme.CMStatus) []byte {
	b := make([]byte, nvme.CMRejSize)
	nvme.CMRej(b).Encode(&nvme.CMRejFields{RecFmt: nvme.RecFmt10, Status: st})
	return b
}

// checkReq validates the NVMe-RDMA private data of a connection request
// (nvmet_rdma_parse_cm_connect_req) and returns the queue's receive
// depth (hsqsize+1) and the host's receive depth.
func (t *Target) checkReq(pd []byte) (f nvme.CMReqFields, st nvme.CMStatus) {
	r, err := nvme.ParseCMReq(pd)
	if err != nil {
		return f, nvme.CMInvalidLen
	}
	f = r.Fields()
	switch {
	case f.RecFmt != nvme.RecFmt10:
		return f, nvme.CMInvalidRecFmt
	case int(f.QID) > t.cfg.MaxIOQueues:
		return f, nvme.CMInvalidQID
	case f.HSQSize < 1 || (f.QID == 0 && int(f.HSQSize)+1 > nvme.AdminQueueDepth) ||
		(f.QID != 0 && int(f.HSQSize)+1 > t.cfg.MaxQueueSize): // the admin queue's 32 are fixed
		return f, nvme.CMInvalidHSQSize
	case f.HRQSize < 1 || int(f.HRQSize) > 1024:
		return f, nvme.CMInvalidHRQSize
	}
	return f, 0
}

func (t *Target) accept(r *rdmacm.Request) {
	f, st := t.checkReq(r.PrivateData())
	if st == 0 {
		t.mu.Lock()
		if t.closed || len(t.queues) >= t.cfg.MaxControllers*(1+t.cfg.MaxIOQueues) {
			st = nvme.CMNoResources
		}
		t.mu.Unlock()
	}
	if st != 0 {
		t.st.rejected.Add(1)
		t.logf("nvmf: reject %v qid %d: %v", r.RemoteAddr(), f.QID, st)
		r.Reject(rejectData(st))
		return
	}
	q, err := t.newQueue(f)
	if err != nil {
		t.st.rejected.Add(1)
		t.logf("nvmf: reject %v qid %d: %v", r.RemoteAddr(), f.QID, err)
		r.Reject(rejectData(nvme.CMNoResources))
		return
	}
	rep := make([]byte, nvme.CMRepSize)
	nvme.CMRep(rep).Encode(&nvme.CMRepFields{RecFmt: nvme.RecFmt10, CRQSize: uint16(q.depth)})
	ctx, cancel := context.WithTimeout(t.ctx, 10*time.Second)
	conn, err := r.Accept(ctx, &rdmacm.Options{SelectiveRepeat: !t.cfg.NoSelectiveRepeat, PD: q.pd, PathMTU: t.cfg.PathMTU, SendCQ: q.cq, RecvCQ: q.cq,
		MaxSendWR: q.sendDepth, MaxRecvWR: q.depth, MaxSGE: 2, Prepare: q.prepare, PrivateData: rep})
	cancel()
	if err != nil {
		t.logf("nvmf: accept %v qid %d: %v", r.RemoteAddr(), f.QID, err)
		q.free()
		return
	}
	q.conn, q.qp = conn, conn.QP()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		conn.Close()
		q.free()
		return
	}
	t.queues[q] = struct{}{}
	t.mu.Unlock()
	t.st.connections.Add(1)
	t.logf("nvmf: %v qid %d connected (depth %d)", conn.RemoteAddr(), f.QID, q.depth)
	q.run()
	t.mu.Lock()
	delete(t.queues, q)
	t.mu.Unlock()
	t.st.disconnects.Add(1)
	t.logf("nvmf: %v qid %d disconnected: %v", conn.RemoteAddr(), f.QID, q.reason())
}
