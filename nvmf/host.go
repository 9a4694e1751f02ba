package nvmf

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/transport"
)

// ErrClosed is returned for commands on a closed controller.
var ErrClosed = errors.New("nvmf: controller closed")

// HostConfig configures a host controller. The zero value of every field
// selects a default.
type HostConfig struct {
	// HostNQN names the host (default a UUID-based NQN made once per
	// process); HostID is its 128-bit ID (default random).
	HostNQN string
	HostID  [16]byte
	// IOQueues is how many I/O queues to connect (default 4, at most what
	// the controller grants).
	IOQueues int
	// QueueSize is each I/O queue's size (default 128; the admin queue
	// has 32); QueueSize-1 commands can be in flight on a queue. 2 to
	// 1024 (Connect refuses others); the controller's MQES and MAXCMD
	// may make it smaller.
	QueueSize int
	// KATO is the keep-alive timeout (default 5 s; a keep-alive goes
	// out every KATO/2; 1 ms to MaxKATO). Negative: none.
	KATO time.Duration
	// ConnectTimeout bounds each connection step (default 3 s).
	ConnectTimeout time.Duration
	// ReconnectDelay is the wait between reconnection attempts after the
	// controller was lost (default 1 s); CtrlLossTimeout how long to keep
	// trying (default 60 s; negative: never reconnect).
	ReconnectDelay  time.Duration
	CtrlLossTimeout time.Duration
	// IOTimeout is how long a command on an I/O queue (its Fabrics
	// Connect included) may go unanswered (default 30 s, Linux's
	// nvme_core io_timeout; negative: forever). One that does ends the
	// association as a lost connection would: the host reconnects and
	// sends its reads and writes again (see CtrlLossTimeout), up to
	// maxTimeoutRetries times for a command that keeps timing out; other
	// commands fail with ErrDisconnected. It also bounds how long a
	// command whose caller gave up (its context ended) keeps its slot:
	// the target may still write into the slot's buffer until the
	// association is torn down, so such a slot is reused only after its
	// response or the teardown — without the timeout a target that never
	// answers it keeps it forever, and QueueSize-1 of them wedge the
	// queue.
	IOTimeout time.Duration
	// AdminTimeout is the same for the admin queue (default 60 s,
	// Linux's nvme_core admin_timeout; negative: forever): its Fabrics
	// Connect, Property Get/Set, Identify, Set Features, Get Log Page.
	// A command unanswered for longer ends the association (it fails
	// with ErrAdminTimeout, wrapped with ErrDisconnected; the reads and
	// writes lost with it are sent again after the reconnect). Keep
	// Alive is bounded by KATO instead, as Linux's is. ConnectTimeout
	// still bounds each step of connecting as a whole.
	AdminTimeout time.Duration
	// NoInline never puts write data in the command capsule.
	NoInline bool
	// RemoteInvalidate gives every command that moves data by keyed SGL
	// a key of its own — a type 2 memory window on the slot's buffer,
	// bound just before the command with a new key byte — and asks the
	// target to invalidate it (keyed SGL subtype 0xF), as Linux's
	// nvme-rdma host does with its fast registrations: the target
	// answers with SEND with Invalidate, and a key the target leaves
	// valid is invalidated by the host before the command completes. A
	// response that invalidates any other key ends the association.
	// Without it (the default) the slot's buffer region is named by its
	// own long-lived key. HostStats counts both endings.
	RemoteInvalidate bool
	// PathMTU bounds the path MTU of the queues (default 1024).
	PathMTU transport.MTU
	// SelectiveRepeat offers selective repeat loss recovery on every
	// queue (rdmacm.Options.SelectiveRepeat, docs/SELECTIVE-REPEAT.md): a
	// rocev2 target accepts it (unless TargetConfig.NoSelectiveRepeat),
	// and the queues then resend only lost packets, with a short
	// retransmission timer, instead of go-back-N: on a lossy path without
	// PFC, go-back-N's tail-loss timeouts take NVMe-oF I/O down to a few
	// MB/s at 1 % loss. Other targets (Linux's nvmet-rdma) do not answer
	// the offer and the queues run go-back-N as without it. Off by
	// default: the connection requests then carry no ECE, as before.
	SelectiveRepeat bool
	// OnNamespaceChange, if set, is called when the controller reports
	// that namespaces changed (added, removed, resized): the host then
	// keeps an Asynchronous Event Request outstanding on every
	// association with a controller that reports namespace attribute
	// notices (OAES bit 8), enables them (Set Features 0Bh), and on the
	// notice reads the Changed Namespace List (log page 04h, which
	// acknowledges it) and passes its NSIDs — nil when more than 1024
	// changed, and after every reconnect (what changed while the host
	// was away is not known) — as Linux's host rescans then. Controller.Namespace
	// identifies a namespace again (its new size); a HostNamespace made
	// before a resize fails with ErrNamespaceChanged from then on. It
	// runs on the host's event goroutine: the next event waits for it.
	OnNamespaceChange func(nsids []uint32)
	// Log, if set, receives one line per connection event.
	Log func(format string, args ...any)
}

var defaultHost struct {
	once sync.Once
	nqn  string
	id   [16]byte
}

func (c HostConfig) withDefaults() HostConfig {
	defaultHost.once.Do(func() {
		rand.Read(defaultHost.id[:])
		u := defaultHost.id
		defaultHost.nqn = fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	})
	if c.HostNQN == "" {
		c.HostNQN = defaultHost.nqn
	}
	if c.HostID == [16]byte{} {
		c.HostID = defaultHost.id
	}
	if c.IOQueues <= 0 {
		c.IOQueues = 4
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 128
	}
	c.QueueSize = min(max(c.QueueSize, 2), 1024)
	if c.KATO == 0 {
		c.KATO = 5 * time.Second
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 3 * time.Second
	}
	if c.ReconnectDelay <= 0 {
		c.ReconnectDelay = time.Second
	}
	if c.CtrlLossTimeout == 0 {
		c.CtrlLossTimeout = 60 * time.Second
	}
	if c.IOTimeout == 0 {
		c.IOTimeout = 30 * time.Second
	}
	if c.AdminTimeout == 0 {
		c.AdminTimeout = 60 * time.Second
	}
	return c
}

// HostStats are a host controller's counters.
type HostStats struct {
	Commands   uint64 // commands ended (any status; also those whose call ended before they went out)
	Errors     uint64 // of those, the ones that failed (status, transport, or the call's context)
	Reconnects uint64 // associations re-established after a loss
	KeepAlives uint64 // keep-alive commands sent
	Requeued   uint64 // reads and writes sent again after a reconnect (once per new queue they go to)
	// RemoteInvalidations counts responses that were a SEND with
	// Invalidate of the command's key, LocalInvalidations keys the host
	// invalidated itself because the response was a plain SEND
	// (HostConfig.RemoteInvalidate).
	RemoteInvalidations uint64
	LocalInvalidations  uint64
}

// association is one connected admin queue with its I/O queues.
type association struct {
	admin  *hqueue
	io     []*hqueue // appended under mu while connecting, fixed after
	cntlid uint16
	id     nvme.IdentifyControllerFields
	dead   chan struct{} // closed when any queue of it died
	once   sync.Once

	mu       sync.Mutex
	stopWD   chan struct{} // closed to stop the watchdog (nil: none)
	wdDone   chan struct{}
	stopOnce sync.Once
}

// Controller is a host's connection to an NVMe-oF controller over RDMA:
// the admin queue and its I/O queues, each its own rdma_cm connection.
// It keeps the controller alive and reconnects after losing it. All
// methods are safe for concurrent use; commands from many goroutines run
// concurrently, up to QueueSize-1 per I/O queue.
type Controller struct {
	dev    *transport.Device
	addr   netip.AddrPort
	subNQN string
	cfg    HostConfig

	mu      sync.Mutex
	cur     *association  // nil while reconnecting
	ready   chan struct{} // closed when cur is set again
	err     error         // permanent failure
	closed  bool
	closeCh chan struct{}
	rr      atomic.Uint32
	wg      sync.WaitGroup
	nss     map[uint32]*nsState // the namespaces handed out, checked at every reconnect
	nsCBMu  sync.Mutex          // one OnNamespaceChange call at a time

	cmds, errs, reconnects, kas, requeued atomic.Uint64
	invs                                  invCounters
}

// Connect connects to the subsystem subNQN of the target at addr (the
// IP address and rdma_cm port, normally 4420): admin queue, controller
// enable, Identify, the I/O queues.
func Connect(ctx context.Context, dev *transport.Device, addr netip.AddrPort, subNQN string, cfg *HostConfig) (*Controller, error) {
	var c HostConfig
	if cfg != nil {
		c = *cfg
	}
	if dev == nil {
		return nil, errors.New("nvmf: Connect: dev is nil")
	}
	if c.QueueSize < 0 || c.QueueSize == 1 || c.QueueSize > 1024 {
		// As Linux's nvmf_parse_options refuses queue_size outside its
		// bounds: 1 would leave no command slot (one entry stays
		// unused), and silently connecting with another size than asked
		// hid the mistake.
		return nil, fmt.Errorf("nvmf: HostConfig.QueueSize %d not in 2..1024 (0: default 128)", c.QueueSize)
	}
	if c.IOQueues < 0 {
		return nil, fmt.Errorf("nvmf: HostConfig.IOQueues %d is negative (0: default 4)", c.IOQueues)
	}
	if c.KATO > MaxKATO {
		// KATO goes out as a 32-bit count of milliseconds: beyond it the
		// target would get the value wrapped (2^32 ms + 1 s as 1 s).
		return nil, fmt.Errorf("nvmf: HostConfig.KATO %v exceeds MaxKATO (%v)", c.KATO, MaxKATO)
	}
	if c.KATO > 0 && c.KATO < time.Millisecond {
		// Below KATO's unit it would go out as 0 (no keep-alive timer at
		// the target) while the host sent keep-alives every KATO/2 (1 ns:
		// time.NewTicker(0), a panic in the supervisor).
		return nil, fmt.Errorf("nvmf: HostConfig.KATO %v is below 1ms, the unit KATO is sent in", c.KATO)
	}
	h := &Controller{dev: dev, addr: addr, subNQN: subNQN, cfg: c.withDefaults(), closeCh: make(chan struct{})}
	a, err := h.associate(ctx)
	if err != nil {
		return nil, err
	}
	h.cur = a
	h.ready = make(chan struct{})
	close(h.ready)
	h.wg.Add(1)
	go h.supervise(a)
	h.startEvents(a, false)
	return h, nil
}

func (h *Controller) logf(format string, args ...any) {
	if h.cfg.Log != nil {
		h.cfg.Log(format, args...)
	}
}

// associate connects and enables the controller and its I/O queues.
func (h *Controller) associate(ctx context.Context) (_ *association, err error) {
	disc := h.subNQN == nvme.DiscoveryNQN
	// Each step's deadline says which it is, so that a target that never
	// answers is not a bare "context deadline exceeded".
	stepErr := fmt.Errorf("no answer within HostConfig.ConnectTimeout (%v)", h.cfg.ConnectTimeout)
	step := func() (context.Context, context.CancelFunc) {
		return context.WithTimeoutCause(ctx, h.cfg.ConnectTimeout, stepErr)
	}
	sctx, cancel := step()
	adm, err := dialQueue(sctx, h.dev, h.addr, 0, nvme.AdminQueueDepth, 0, h.cfg.PathMTU, h.cfg.SelectiveRepeat)
	cancel()
	if err != nil {
		return nil, err
	}
	h.setup(adm)
	if h.cfg.SelectiveRepeat && !adm.conn.SelectiveRepeat() {
		// Offered, not agreed (Linux's nvmet-rdma, or NoSelectiveRepeat):
		// the queues run go-back-N, which the caller may want to know.
		h.logf("nvmf: controller %v declined selective repeat: queues run go-back-N", h.addr)
	}
	a := &association{admin: adm, dead: make(chan struct{})}
	// The timeouts apply from the first command on, the admin Connect
	// included (Linux's connect commands run with the admin and I/O
	// timeouts of their queues).
	h.startWatchdog(a)
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	// sctx is the step's context at the time of the error.
	defer func() { err = withCause(sctx, err) }()
	kato := uint32(0)
	if h.cfg.KATO > 0 && !disc {
		kato = uint32(h.cfg.KATO / time.Millisecond)
	}
	sctx, cancel = step()
	defer cancel()
	res, err := h.connectQueue(sctx, adm, nvme.DynamicCNTLID, kato)
	if err != nil {
		return nil, fmt.Errorf("nvmf: admin Connect: %w", err)
	}
	a.cntlid = uint16(res)
	capv, err := propGet(sctx, adm, nvme.PropCAP, true)
	if err != nil {
		return nil, fmt.Errorf("nvmf: Property Get CAP: %w", err)
	}
	capf := nvme.ParseCAP(capv)
	if _, err := adm.do(sctx, &request{build: func(s nvme.SQE) {
		(&nvme.Property{Set: true, Offset: nvme.PropCC, Value: nvme.CCEnable | nvme.CCIOSQES6IOCQ4}).Put(s)
	}}); err != nil {
		return nil, fmt.Errorf("nvmf: Property Set CC: %w", err)
	}
	deadline := time.Now().Add(time.Duration(max(capf.TO, 1)) * 500 * time.Millisecond)
	for {
		csts, err := propGet(sctx, adm, nvme.PropCSTS, false)
		if err != nil {
			return nil, fmt.Errorf("nvmf: Property Get CSTS: %w", err)
		}
		if csts&nvme.CSTSFatal != 0 {
			return nil, errors.New("nvmf: controller fatal status after enable")
		}
		if csts&nvme.CSTSReady != 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("nvmf: controller not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	idb := make([]byte, nvme.IdentifySize)
	if err := identify(sctx, adm, nvme.Identify{CNS: nvme.CNSController}, idb); err != nil {
		return nil, fmt.Errorf("nvmf: Identify Controller: %w", err)
	}
	a.id = nvme.IdentifyController(idb).Fields()
	switch {
	case a.id.CNTLID != a.cntlid:
		return nil, fmt.Errorf("nvmf: Identify says cntlid %d, Connect %d", a.id.CNTLID, a.cntlid)
	case a.id.SGLS&nvme.SGLSKeyed == 0:
		return nil, errors.New("nvmf: the controller does not support keyed SGLs")
	case a.id.ICDOFF != 0:
		return nil, fmt.Errorf("nvmf: icdoff %d not supported", a.id.ICDOFF)
	}
	if disc {
		return a, nil
	}
	if a.id.KAS == 0 {
		return nil, errors.New("nvmf: the controller has no keep-alive support")
	}
	n := min(h.cfg.IOQueues, 0xfffe)
	res, err = adm.do(sctx, &request{build: func(s nvme.SQE) {
		(&nvme.Features{FID: nvme.FeatNumQueues, Value: nvme.NumQueues(uint16(n), uint16(n))}).Put(s, nvme.AdminSetFeatures)
	}})
	if err != nil {
		return nil, fmt.Errorf("nvmf: Set Features (number of queues): %w", err)
	}
	nsq, ncq := nvme.SplitNumQueues(uint32(res))
	n = min(n, nsq, ncq)
	inline := 0
	if a.id.SGLS&nvme.SGLSOffset != 0 && a.id.IOCCSZ >= 4 && !h.cfg.NoInline {
		inline = inlineSize(a.id.IOCCSZ)
		if offer := uint64(a.id.IOCCSZ)*16 - nvme.SQESize; offer > uint64(inline) {
			h.logf("nvmf: controller %v offers %d bytes of in-capsule data (IOCCSZ %d); sending at most %d", h.addr,
				offer, a.id.IOCCSZ, inline)
		}
	}
	qs := min(h.cfg.QueueSize, int(ParseMQES(capv))+1)
	if a.id.MAXCMD > 0 {
		qs = min(qs, int(a.id.MAXCMD))
	}
	// MQES 0 is invalid and MAXCMD 1 leaves no room for the queue's one
	// unused entry: a queue of 2 still carries one command at a time
	// (fewer would be a queue without slots, where every command waits
	// forever).
	qs = max(qs, 2)
	for i := 1; i <= n; i++ {
		qctx, qcancel := step()
		q, err := dialQueue(qctx, h.dev, h.addr, uint16(i), qs, inline, h.cfg.PathMTU, h.cfg.SelectiveRepeat)
		if err == nil {
			h.setup(q)
			a.mu.Lock()
			a.io = append(a.io, q)
			a.mu.Unlock()
			_, err = h.connectQueue(qctx, q, a.cntlid, 0)
		}
		qcancel()
		if err != nil {
			return nil, fmt.Errorf("nvmf: I/O queue %d: %w", i, withCause(qctx, err))
		}
	}
	return a, nil
}

// maxInline bounds the in-capsule data of a write, whatever the
// controller's IOCCSZ offers: every slot of an I/O queue holds a capsule
// buffer of 64 bytes plus this, allocated and registered when the queue
// connects, so the offer sizes host memory (QueueSize-1 slots per queue).
// IOCCSZ is a 32-bit count of 16-byte units: taken as is, a hostile or
// broken target could make the host allocate 64 GiB per slot (a fatal
// out-of-memory, not a recoverable panic). 16 KiB is the most nvmet-rdma
// offers (its inline_data_size limit); Linux's host allocates nothing by
// IOCCSZ (it sends in-capsule data from the request's own pages, at most
// num_inline_segments of them) and uses it only as an upper bound, as
// this host does with a smaller one: sending less in the capsule than
// offered is always allowed, larger writes go by keyed SGL.
const maxInline = 16 << 10

// inlineSize returns the in-capsule data bytes to use for a controller's
// IOCCSZ (at least 4: the 64-byte command itself).
func inlineSize(ioccsz uint32) int {
	return int(min(uint64(ioccsz)*16-nvme.SQESize, maxInline))
}

// setup configures a new queue before its first command.
func (h *Controller) setup(q *hqueue) {
	q.logf = h.cfg.Log
	q.remoteInv = h.cfg.RemoteInvalidate
	q.invs = &h.invs
	q.timeout = h.cfg.IOTimeout
	if q.qid == 0 {
		q.timeout = h.cfg.AdminTimeout
	}
}

// ParseMQES returns CAP.MQES (0's based maximum queue entries).
func ParseMQES(capv uint64) uint16 { return nvme.ParseCAP(capv).MQES }

// connectQueue sends the Fabrics Connect of q.
func (h *Controller) connectQueue(ctx context.Context, q *hqueue, cntlid uint16, kato uint32) (uint64, error) {
	data := make([]byte, nvme.ConnectDataSize)
	nvme.ConnectData(data).Encode(&nvme.ConnectDataFields{HostID: h.cfg.HostID, CNTLID: cntlid, SubNQN: h.subNQN, HostNQN: h.cfg.HostNQN})
	res, err := q.do(ctx, &request{out: data, build: func(s nvme.SQE) {
		(&nvme.Connect{QID: q.qid, SQSize: uint16(q.depth), KATO: kato}).Put(s)
	}})
	return res, h.connectError(q, cntlid, kato, res, err)
}

// connectError says what a refused Fabrics Connect points at, as Linux's
// nvmf_log_connect_error does: for Invalid Parameter the result names the
// field (bit 16: in the Connect data, else in the command; bits 15:0 its
// byte offset), for Invalid Host the host NQN. The status stays wrapped
// (errors.Is(err, nvme.StatusConnectInvalidParam|nvme.StatusDNR)).
func (h *Controller) connectError(q *hqueue, cntlid uint16, kato uint32, res uint64, err error) error {
	var st nvme.Status
	if err == nil || !errors.As(err, &st) {
		return err
	}
	switch st.Code() {
	case nvme.StatusConnectInvalidHost:
		return fmt.Errorf("%w: host NQN %q not allowed on subsystem %q", err, h.cfg.HostNQN, h.subNQN)
	case nvme.StatusConnectInvalidParam:
	default:
		return err
	}
	off := res & 0xffff
	var what string
	if res&(1<<16) != 0 { // in the Connect data
		switch off {
		case 0:
			what = fmt.Sprintf("host ID %x", h.cfg.HostID)
		case 16:
			what = fmt.Sprintf("controller ID %d", cntlid)
		case 256:
			what = fmt.Sprintf("subsystem NQN %q (not served there)", h.subNQN)
		case 512:
			what = fmt.Sprintf("host NQN %q", h.cfg.HostNQN)
		default:
			what = fmt.Sprintf("Connect data byte %d", off)
		}
	} else {
		switch off {
		case 42:
			what = fmt.Sprintf("queue ID %d", q.qid)
		case 44:
			what = fmt.Sprintf("queue size %d (SQSIZE %d)", q.depth+1, q.depth)
		case 48:
			what = fmt.Sprintf("KATO %d ms", kato)
		default:
			what = fmt.Sprintf("Connect command byte %d", off)
		}
	}
	return fmt.Errorf("%w: the target refused the %s", err, what)
}

func propGet(ctx context.Context, q *hqueue, off uint32, size8 bool) (uint64, error) {
	p := nvme.Property{Offset: off}
	if size8 {
		p.Attrib = 1
	}
	return q.do(ctx, &request{build: p.Put})
}

func identify(ctx context.Context, q *hqueue, id nvme.Identify, out []byte) error {
	_, err := q.do(ctx, &request{in: out, build: id.Put})
	if hk := testHooks.Load(); err == nil && hk != nil && hk.identify != nil {
		hk.identify(id.CNS, out)
	}
	return err
}

// close disconnects every queue, in parallel (a peer that is gone costs
// each its DREQ retries).
func (a *association) close() {
	a.stopWatchdog()
	var wg sync.WaitGroup
	for _, q := range a.io {
		wg.Add(1)
		go func() { defer wg.Done(); q.close() }()
	}
	wg.Wait()
	if a.admin != nil {
		a.admin.close()
	}
}

// fail stops every queue of a lost association at once: no new command
// goes out on it, its QP moves to the error state, and the commands in
// flight on it end with ErrDisconnected. (A queue that did not die itself
// would otherwise keep them until close, which waits for the peer's DREP.)
func (a *association) fail() {
	a.mu.Lock()
	qs := append([]*hqueue{a.admin}, a.io...)
	a.mu.Unlock()
	for _, q := range qs {
		q.stop(errAssociationLost)
	}
}

// errAssociationLost ends the commands of an association's queues that
// were still up when another of its queues was lost.
var errAssociationLost = errors.New("another queue of the association was lost")

// watch closes a.dead when any queue dies.
func (a *association) watch() {
	for _, q := range append([]*hqueue{a.admin}, a.io...) {
		go func() {
			<-q.dead
			a.once.Do(func() { close(a.dead) })
		}()
	}
}

// expire ends the association when one of its commands went unanswered
// for longer than its queue's timeout (HostConfig.AdminTimeout on the
// admin queue, IOTimeout on the I/O queues), as Linux's
// nvme_rdma_timeout starts error recovery: the supervisor then
// reconnects, and the commands of the association end with
// ErrDisconnected (the one that timed out with ErrAdminTimeout or
// ErrIOTimeout too) and are sent again or fail as after any loss.
func (a *association) expire(now time.Time) {
	a.mu.Lock()
	qs := append([]*hqueue{a.admin}, a.io...)
	a.mu.Unlock()
	for _, q := range qs {
		if err := q.expire(now); err != nil {
			q.die(err)
			return
		}
	}
}

// startWatchdog starts the goroutine that checks a's commands against
// their timeouts (expire), from the admin queue's first command until
// a.close. None runs when both timeouts are off.
func (h *Controller) startWatchdog(a *association) {
	d := time.Duration(0)
	for _, t := range []time.Duration{h.cfg.AdminTimeout, h.cfg.IOTimeout} {
		if t > 0 && (d == 0 || t < d) {
			d = t
		}
	}
	if d == 0 {
		return
	}
	a.stopWD, a.wdDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(a.wdDone)
		t := time.NewTicker(min(max(d/8, 10*time.Millisecond), time.Second))
		defer t.Stop()
		for {
			select {
			case <-a.stopWD:
				return
			case now := <-t.C:
				a.expire(now)
			}
		}
	}()
}

// stopWatchdog stops a's watchdog, if any, and waits for it.
func (a *association) stopWatchdog() {
	if a.stopWD == nil {
		return
	}
	a.stopOnce.Do(func() { close(a.stopWD) })
	<-a.wdDone
}

// supervise keeps an association alive: keep-alive, and on loss, reconnect.
func (h *Controller) supervise(a *association) {
	defer h.wg.Done()
	for {
		a.watch()
		var tick <-chan time.Time
		var tickers []*time.Ticker
		if h.cfg.KATO > 0 && h.subNQN != nvme.DiscoveryNQN {
			t := time.NewTicker(h.cfg.KATO / 2)
			defer t.Stop()
			tickers = append(tickers, t)
			tick = t.C
		}
	loop:
		for {
			select {
			case <-h.closeCh:
				return
			case <-a.dead:
				break loop
			case <-tick:
				h.kas.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), h.cfg.KATO)
				// Bounded by KATO, not AdminTimeout (Linux: the keep-alive
				// request's timeout is KATO).
				_, err := a.admin.do(ctx, &request{timeout: h.cfg.KATO, build: func(s nvme.SQE) { s.SetOpcode(nvme.AdminKeepAlive) }})
				cancel()
				if err != nil && !errors.As(err, new(nvme.Status)) {
					a.admin.die(fmt.Errorf("keep-alive: %w", err))
				}
			}
		}
		lost := time.Now() // CtrlLossTimeout counts from here, not from the end of the teardown
		for _, t := range tickers {
			t.Stop()
		}
		if h.cfg.CtrlLossTimeout < 0 {
			h.logf("nvmf: controller %v %s lost", h.addr, h.subNQN)
		} else {
			h.logf("nvmf: controller %v %s lost; reconnecting, %v between attempts, for up to %v", h.addr, h.subNQN,
				h.cfg.ReconnectDelay, h.cfg.CtrlLossTimeout)
		}
		h.mu.Lock()
		h.cur = nil
		h.ready = make(chan struct{})
		h.mu.Unlock()
		// Every queue of the lost association stops now, not only the
		// one that died: its QP goes to the error state (the target can
		// no longer read or write the queue's buffers, as Linux's error
		// recovery drains the QPs before it cancels the requests) and
		// the commands still in flight on it fail, to be sent again on
		// the next association.
		a.fail()
		// The lost association is torn down while the host reconnects:
		// its disconnects wait for the DREPs (up to three CM response
		// timeouts each) of a peer that most likely does not answer any
		// more — 3 s before the first attempt, when the target hung or
		// the path broke. Linux's rdma_disconnect does not wait either.
		// Its queues and buffers are its own, never reused by the next
		// association; Close waits for it (wg).
		h.wg.Add(1)
		go func(a *association) {
			defer h.wg.Done()
			a.close()
		}(a)
		if h.cfg.CtrlLossTimeout < 0 {
			h.fail(ErrDisconnected)
			return
		}
		giveUp := lost.Add(h.cfg.CtrlLossTimeout)
		var na *association
		for na == nil {
			select {
			case <-h.closeCh:
				return
			case <-time.After(h.cfg.ReconnectDelay):
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-h.closeCh:
					cancel()
				case <-ctx.Done():
				}
			}()
			var err error
			na, err = h.associate(ctx)
			if err == nil {
				if err = h.revalidate(ctx, na); err != nil {
					na.close()
					na = nil
				}
			}
			cancel()
			if err != nil {
				h.logf("nvmf: reconnect %v: %v", h.addr, err)
				if time.Now().After(giveUp) {
					h.fail(fmt.Errorf("%w: gave up reconnecting: %v", ErrDisconnected, err))
					return
				}
			}
		}
		h.reconnects.Add(1)
		h.logf("nvmf: controller %v %s reconnected (cntlid %d)", h.addr, h.subNQN, na.cntlid)
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			na.close()
			return
		}
		h.cur = na
		close(h.ready)
		h.mu.Unlock()
		h.startEvents(na, true)
		a = na
	}
}

func (h *Controller) fail(err error) {
	h.mu.Lock()
	h.err = err
	close(h.ready)
	h.mu.Unlock()
}

// assoc returns the live association, waiting while reconnecting.
func (h *Controller) assoc(ctx context.Context) (*association, error) {
	for {
		h.mu.Lock()
		a, ready, err, closed := h.cur, h.ready, h.err, h.closed
		h.mu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case err != nil:
			return nil, err
		case a != nil:
			return a, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// admin submits an admin command.
func (h *Controller) admin(ctx context.Context, r *request) (uint64, error) {
	a, err := h.assoc(ctx)
	if err != nil {
		return 0, err
	}
	res, err := a.admin.do(ctx, r)
	h.count(err)
	return res, err
}

func (h *Controller) count(err error) {
	h.cmds.Add(1)
	if err != nil {
		h.errs.Add(1)
	}
}

// ioQueue picks an I/O queue round robin.
func (h *Controller) ioQueue(ctx context.Context) (*hqueue, error) {
	a, err := h.assoc(ctx)
	if err != nil {
		return nil, err
	}
	if len(a.io) == 0 {
		return nil, errors.New("nvmf: controller has no I/O queues")
	}
	return a.io[int(h.rr.Add(1))%len(a.io)], nil
}

// Identify returns the Identify Controller data of the current association.
func (h *Controller) Identify(ctx context.Context) (nvme.IdentifyControllerFields, error) {
	a, err := h.assoc(ctx)
	if err != nil {
		return nvme.IdentifyControllerFields{}, err
	}
	return a.id, nil
}

// IOQueues returns the number of connected I/O queues.
func (h *Controller) IOQueues() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		return 0
	}
	return len(h.cur.io)
}

// SelectiveRepeat reports whether the queues of the current association
// run selective repeat: HostConfig.SelectiveRepeat offered it and the
// target agreed (a rocev2 target without TargetConfig.NoSelectiveRepeat;
// Linux's nvmet-rdma does not). False while no association is up. A
// reconnect asks again, so a restarted target may answer otherwise.
func (h *Controller) SelectiveRepeat() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		return false
	}
	return h.cur.admin.conn.SelectiveRepeat()
}

// ActiveNamespaces lists the active namespace IDs.
func (h *Controller) ActiveNamespaces(ctx context.Context) ([]uint32, error) {
	b := make([]byte, nvme.IdentifySize)
	_, err := h.admin(ctx, &request{in: b, build: (&nvme.Identify{CNS: nvme.CNSActiveNSList}).Put})
	if err != nil {
		return nil, err
	}
	return nvme.ActiveNSList(b), nil
}

// Stats returns the controller's counters.
func (h *Controller) Stats() HostStats {
	return HostStats{Commands: h.cmds.Load(), Errors: h.errs.Load(), Reconnects: h.reconnects.Load(), KeepAlives: h.kas.Load(),
		Requeued: h.requeued.Load(), RemoteInvalidations: h.invs.remote.Load(), LocalInvalidations: h.invs.local.Load()}
}

// Close shuts the controller down (CC.SHN) and disconnects every queue.
func (h *Controller) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	a := h.cur
	close(h.closeCh)
	h.mu.Unlock()
	if a != nil {
		select {
		case <-a.dead:
		default:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			a.admin.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC,
				Value: nvme.CCEnable | nvme.CCIOSQES6IOCQ4 | nvme.CCShnNormal}).Put})
			cancel()
		}
	}
	h.wg.Wait()
	if a != nil {
		a.close()
	}
	h.mu.Lock()
	h.cur = nil // IOQueues reports none
	h.mu.Unlock()
	return nil
}

// Discover reads the discovery log page of the discovery controller at addr.
func Discover(ctx context.Context, dev *transport.Device, addr netip.AddrPort, cfg *HostConfig) ([]nvme.DiscoveryEntry, error) {
	c := HostConfig{CtrlLossTimeout: -1}
	if cfg != nil {
		c = *cfg
		c.CtrlLossTimeout = -1
	}
	h, err := Connect(ctx, dev, addr, nvme.DiscoveryNQN, &c)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	for try := 0; try < 4; try++ {
		hdr := make([]byte, nvme.DiscoveryHeaderSize)
		if err := h.logPage(ctx, nvme.LogDiscovery, hdr); err != nil {
			return nil, err
		}
		hd, _ := nvme.DiscoveryHeaderOf(hdr)
		if hd.NumRec > 1024 {
			return nil, fmt.Errorf("nvmf: discovery log with %d records", hd.NumRec)
		}
		page := make([]byte, nvme.DiscoveryHeaderSize+int(hd.NumRec)*nvme.DiscoveryEntrySize)
		if err := h.logPage(ctx, nvme.LogDiscovery, page); err != nil {
			return nil, err
		}
		hd2, _ := nvme.DiscoveryHeaderOf(page)
		if hd2.GenCtr != hd.GenCtr || hd2.NumRec != hd.NumRec {
			continue // changed meanwhile: read again
		}
		out := make([]nvme.DiscoveryEntry, hd.NumRec)
		for i := range out {
			out[i], _ = nvme.DiscoveryEntryOf(page, i)
		}
		return out, nil
	}
	return nil, errors.New("nvmf: discovery log kept changing")
}

// logPage reads len(out) bytes of log page lid from offset 0, in pieces
// of at most MDTS.
func (h *Controller) logPage(ctx context.Context, lid uint8, out []byte) error {
	for off := 0; off < len(out); {
		n := min(len(out)-off, MaxTransfer)
		g := nvme.GetLogPage{LID: lid, NumD: uint32(n / 4), Offset: uint64(off)}
		if _, err := h.admin(ctx, &request{in: out[off : off+n], build: g.Put}); err != nil {
			return err
		}
		off += n
	}
	return nil
}
