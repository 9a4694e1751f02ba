package nvmf

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/nvme"
)

// tctrl is a controller of the target: created by an admin queue's
// Connect, joined by I/O queues' Connects, deleted with its admin queue
// or when its keep-alive timer expires.
type tctrl struct {
	t       *Target
	id      uint16
	sub     *Subsystem // nil: the discovery controller
	hostNQN string
	hostID  [16]byte

	mu      sync.Mutex
	cc      uint32
	csts    uint32
	kato    time.Duration
	ka      *time.Timer
	kaGen   uint64      // under mu: which timer is the live one
	seen    atomic.Bool // a command arrived since the timer last fired
	aec     uint32      // Asynchronous Event Configuration (Set Features 0Bh)
	nrIOQ   int
	queues  map[uint16]*tqueue
	aers    []uint16 // parked AERs' command IDs
	aborted []uint16 // AERs a reset or shutdown ended: the admin queue answers them
	deleted bool
	// Asynchronous events (aen.go), under mu: events found no AER
	// parked; nsMasked: a namespace attribute notice went out and the
	// host has not yet read log page 04h with RAE clear; changedNS the
	// Changed Namespace List (changedAll: more than it holds).
	events     []nvme.AsyncEvent
	nsMasked   bool
	changedNS  []uint32
	changedAll bool
	// The Error Information log (errlog.go), under mu: the last
	// errLogSlots errors, errNext the slot the next one takes.
	errLog   [errLogSlots]errEntry
	errNext  int
	errCount uint64
}

func (c *tctrl) discovery() bool { return c.sub == nil }

// touch notes a command for the keep-alive timer. The timer is traffic
// based, as nvmet's: it fires every KATO and the controller expires only
// when no command arrived between two firings — between one and two KATOs
// after the last command. (A host connecting its I/O queues over a lossy
// path can spend more than one KATO on them before it sends its first
// keep-alive; Linux's host does.)
func (c *tctrl) touch() { c.seen.Store(true) }

// kaFire is the keep-alive timer of generation gen.
func (c *tctrl) kaFire(gen uint64) {
	c.mu.Lock()
	if c.kaGen != gen || c.ka == nil || c.deleted {
		c.mu.Unlock()
		return
	}
	if c.seen.Swap(false) {
		c.ka.Reset(c.kato)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.t.st.katoExpired.Add(1)
	c.t.logf("nvmf: controller %d (%s): keep-alive timeout %v expired", c.id, c.hostNQN, c.kato)
	c.delete()
}

func (c *tctrl) setKATO(ms uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kato = time.Duration(ms) * time.Millisecond
	if c.ka != nil {
		c.ka.Stop()
		c.ka = nil
	}
	c.kaGen++
	if ms > 0 && !c.deleted {
		gen := c.kaGen
		c.ka = time.AfterFunc(c.kato, func() { c.kaFire(gen) })
	}
}

// delete removes the controller and ends all its queues.
func (c *tctrl) delete() {
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		return
	}
	c.deleted = true
	if c.ka != nil {
		c.ka.Stop()
	}
	qs := make([]*tqueue, 0, len(c.queues))
	for _, q := range c.queues {
		qs = append(qs, q)
	}
	c.mu.Unlock()
	t := c.t
	t.mu.Lock()
	if t.ctrls[c.id] == c {
		delete(t.ctrls, c.id)
		t.st.live.Add(-1)
	}
	t.mu.Unlock()
	for _, q := range qs {
		q.stop(errors.New("controller deleted"))
	}
}

// detach: queue q ended. The admin queue takes the controller with it.
func (c *tctrl) detach(q *tqueue) {
	c.mu.Lock()
	if c.queues[q.qid] == q {
		delete(c.queues, q.qid)
	}
	c.mu.Unlock()
	if q.qid == 0 {
		c.delete()
	}
}

// maxCNTLID is the largest controller ID handed out: 0xfff0-0xffff are
// reserved (0xffff: dynamic controller), and nvmet allocates from
// [1, 0xffef] likewise.
const maxCNTLID = 0xffef

// newCtrlID returns the next controller ID no live controller has, going
// round [1, maxCNTLID], or false when every one is taken (possible only
// with MaxControllers above maxCNTLID). Called with t.mu held.
func (t *Target) newCtrlID() (uint16, bool) {
	id := t.nextID
	for range maxCNTLID {
		if id == 0 || id > maxCNTLID {
			id = 1
		}
		if t.ctrls[id] == nil {
			t.nextID = id + 1
			return id, true
		}
		id++
	}
	return 0, false
}

// connect executes a Fabrics Connect on queue q.
func (q *tqueue) connect(r *treq, data []byte) (nvme.Status, uint64) {
	t := q.t
	cmd := nvme.ConnectOf(r.sqe)
	bad := func(off uint64) (nvme.Status, uint64) {
		// Invalid parameter: DW0 bits 15:0 the byte offset, bit 16 "in data".
		return nvme.StatusConnectInvalidParam | nvme.StatusDNR, off
	}
	if q.ctrl != nil {
		return nvme.StatusCmdSeqError | nvme.StatusDNR, 0
	}
	if cmd.RecFmt != nvme.RecFmt10 {
		return nvme.StatusConnectFormat | nvme.StatusDNR, 0
	}
	if len(data) < nvme.ConnectDataSize {
		return nvme.StatusSGLInvalidData | nvme.StatusDNR, 0
	}
	d, _ := nvme.ParseConnectData(data)
	df := d.Fields()
	if cmd.QID != q.qid {
		return bad(42)
	}
	if int(cmd.SQSize)+1 > q.depth || cmd.SQSize == 0 {
		return bad(44)
	}
	var sub *Subsystem
	if df.SubNQN != nvme.DiscoveryNQN {
		if sub = t.subs[df.SubNQN]; sub == nil {
			return bad(1<<16 | 256)
		}
		if !sub.allows(df.HostNQN) {
			return nvme.StatusConnectInvalidHost | nvme.StatusDNR, 0
		}
	} else if cmd.QID != 0 {
		return bad(42) // discovery controllers have no I/O queues
	}
	if cmd.QID == 0 {
		if df.CNTLID != nvme.DynamicCNTLID {
			return bad(1<<16 | 16)
		}
		t.mu.Lock()
		if len(t.ctrls) >= t.cfg.MaxControllers || t.closed {
			t.mu.Unlock()
			return nvme.StatusConnectCtrlBusy | nvme.StatusDNR, 0
		}
		id, ok := t.newCtrlID()
		if !ok {
			t.mu.Unlock()
			return nvme.StatusConnectCtrlBusy | nvme.StatusDNR, 0
		}
		c := &tctrl{t: t, id: id, sub: sub, hostNQN: df.HostNQN, hostID: df.HostID, queues: map[uint16]*tqueue{0: q},
			nrIOQ: t.cfg.MaxIOQueues}
		if sub != nil {
			c.aec = aenNSAttr // nvmet_alloc_ctrl: aen_enabled = NVMET_AEN_CFG_OPTIONAL
		}
		t.ctrls[id] = c
		t.st.live.Add(1)
		t.mu.Unlock()
		t.st.controllers.Add(1)
		kato := cmd.KATO
		if sub == nil && kato == 0 && t.cfg.DiscoveryKATO > 0 {
			// A discovery controller whose host asks for no keep-alive
			// (this package's Discover and nvme-cli's discover do) would
			// live as long as its connection, and an idle connection to a
			// host that vanished can live for ever: enough of them fill
			// MaxControllers, shared by every host. nvmet gives these
			// NVMET_DISC_KATO_MS (120 s) likewise.
			kato = uint32(max(t.cfg.DiscoveryKATO/time.Millisecond, 1))
		}
		c.setKATO(kato)
		q.ctrl = c
		q.connected.Store(true)
		t.logf("nvmf: controller %d for %s on %s (kato %d ms)", id, df.HostNQN, df.SubNQN, kato)
		return 0, uint64(id)
	}
	t.mu.Lock()
	c := t.ctrls[df.CNTLID]
	t.mu.Unlock()
	if c == nil || c.sub != sub || c.hostNQN != df.HostNQN {
		return bad(1<<16 | 16)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.deleted:
		return bad(1<<16 | 16)
	case c.csts&nvme.CSTSReady == 0:
		return nvme.StatusCmdSeqError | nvme.StatusDNR, 0
	case int(cmd.QID) > c.nrIOQ:
		return bad(42)
	case c.queues[cmd.QID] != nil:
		return nvme.StatusConnectInvalidParam | nvme.StatusDNR, 42
	}
	c.queues[cmd.QID] = q
	q.ctrl = c
	q.connected.Store(true)
	c.touch() // a host connecting its I/O queues is alive
	return 0, uint64(c.id)
}

// execute runs the command of r with its data in (host to controller) or
// into out (controller to host); it returns the status, the result, and
// the bytes of out to send.
func (q *tqueue) execute(r *treq, in, out []byte) (nvme.Status, uint64, int) {
	s := r.sqe
	if s.Opcode() == nvme.OpcodeFabrics {
		switch s.FCType() {
		case nvme.FCConnect:
			st, res := q.connect(r, in)
			return st, res, 0
		case nvme.FCPropertyGet, nvme.FCPropertySet:
			if q.qid != 0 {
				return nvme.StatusInvalidOpcode | nvme.StatusDNR, 0, 0
			}
			q.ctrl.touch()
			st, res := q.ctrl.property(nvme.PropertyOf(s))
			q.answerAborted()
			return st, res, 0
		case nvme.FCDisconnect:
			return 0, 0, 0
		}
		return nvme.StatusInvalidOpcode | nvme.StatusDNR, 0, 0
	}
	c := q.ctrl
	c.touch()
	if !c.ready() {
		return nvme.StatusCmdSeqError | nvme.StatusDNR, 0, 0
	}
	if q.qid == 0 {
		return q.admin(r, in, out)
	}
	return q.io(r, in, out)
}

// ready reports CSTS.RDY: enabled, not shut down.
func (c *tctrl) ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.csts&nvme.CSTSReady != 0
}

// check refuses a command the target would refuse anyway before any of
// its data moves, as nvmet_req_init parses a command before nvmet-rdma
// maps its SGL: refused only after the RDMA READ of its data, a write
// to a namespace that does not exist cost the transfer (up to
// MaxTransfer) and, with a key the host never registered, the whole
// queue, where an NVMe status was due. execute checks again when the
// data is there: the controller may have been reset meanwhile.
func (q *tqueue) check(r *treq) nvme.Status {
	s := r.sqe
	if s.Opcode() == nvme.OpcodeFabrics {
		return 0 // Connect's data is fetched; the others carry none
	}
	c := q.ctrl
	c.touch()
	if !c.ready() {
		return nvme.StatusCmdSeqError | nvme.StatusDNR
	}
	if q.qid == 0 {
		switch s.Opcode() {
		case nvme.AdminIdentify, nvme.AdminSetFeatures, nvme.AdminGetFeatures, nvme.AdminGetLogPage,
			nvme.AdminKeepAlive, nvme.AdminAsyncEvent, nvme.AdminAbort:
			return 0
		}
		return nvme.StatusInvalidOpcode | nvme.StatusDNR
	}
	_, st := q.ioCheck(r)
	return st
}

// answerAborted answers the AERs a reset or shutdown of the controller
// ended (on the admin queue: the Property Set that did it runs there),
// with nvmet's status for them (nvmet_async_events_failall): Internal
// Error, DNR.
func (q *tqueue) answerAborted() {
	c := q.ctrl
	c.mu.Lock()
	cids := c.aborted
	c.aborted = nil
	c.mu.Unlock()
	for _, cid := range cids {
		q.answer(cid, aerFailStatus)
	}
}

// aerFailStatus is what an AER that will never report an event ends
// with: Internal Error with DNR, as nvmet_async_events_failall answers
// the parked AERs when the admin queue goes (nvmet_sq_destroy).
const aerFailStatus = nvme.StatusInternal | nvme.StatusDNR

// property executes Property Get/Set.
func (c *tctrl) property(p nvme.Property) (nvme.Status, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.Set {
		if p.Offset != nvme.PropCC || p.Size8() {
			return nvme.StatusInvalidField | nvme.StatusDNR, 0
		}
		c.setCC(uint32(p.Value))
		return 0, 0
	}
	var v uint64
	switch p.Offset {
	case nvme.PropCAP:
		v = nvme.CAP{MQES: uint16(c.t.cfg.MaxQueueSize - 1), CQR: true, TO: 15, CSSNVM: true}.Value()
	case nvme.PropVS:
		v = uint64(nvme.Version(1, 3, 0))
	case nvme.PropCC:
		v = uint64(c.cc)
	case nvme.PropCSTS:
		v = uint64(c.csts)
	default:
		return nvme.StatusInvalidField | nvme.StatusDNR, 0
	}
	if !p.Size8() && p.Offset == nvme.PropCAP {
		return nvme.StatusInvalidField | nvme.StatusDNR, 0
	}
	return 0, v
}

// setCC applies a controller configuration write (nvmet_update_cc).
func (c *tctrl) setCC(v uint32) {
	old := c.cc
	c.cc = v
	if v&nvme.CCEnable != 0 && old&nvme.CCEnable == 0 {
		// IOSQES 6, IOCQES 4, MPS 0, AMS 0, CSS 0 or the controller is fatal.
		if (v>>16)&0xf != 6 || (v>>20)&0xf != 4 || (v>>7)&0xf != 0 || (v>>11)&7 != 0 || (v>>4)&7 != 0 {
			c.csts = nvme.CSTSFatal
			return
		}
		c.csts = nvme.CSTSReady
		// The timer ran since the admin Connect; enabling restarts it
		// (nvmet_start_ctrl).
		if c.ka != nil {
			c.ka.Reset(c.kato)
		}
	}
	if v&nvme.CCEnable == 0 && old&nvme.CCEnable != 0 {
		c.csts &^= nvme.CSTSReady | nvme.CSTSFatal
		c.abortAERs()
	}
	if v&nvme.CCShnMask != 0 && old&nvme.CCShnMask == 0 {
		// Not ready from here (nvmet_clear_ctrl): commands after the
		// shutdown get Command Sequence Error and are not executed, so
		// no write lands after the flush the host counts on. CC reads
		// 0 as in nvmet: enabling again needs no reset first.
		c.csts &^= nvme.CSTSReady
		c.cc = 0
		c.abortAERs()
		if c.sub != nil {
			c.sub.mu.RLock()
			for _, ns := range c.sub.Namespaces {
				ns.Backend.Flush()
			}
			c.sub.mu.RUnlock()
		}
		c.csts |= nvme.CSTSShstCmplt
	}
	if v&nvme.CCShnMask == 0 && old&nvme.CCShnMask != 0 {
		c.csts &^= nvme.CSTSShstMask
	}
}

// abortAERs ends the parked AERs (c.mu held): the controller stopped,
// none of them will ever report an event. Dropped silently, each kept a
// slot of the host's busy for the life of the association (the host
// may even park more after it re-enables); the admin queue answers them
// (answerAborted) with the status nvmet gives them, Internal Error with
// DNR. nvmet answers them later, when the admin queue goes
// (nvmet_sq_destroy; its CC.EN 1→0 and CC.SHN leave them parked), when
// the answer can no longer reach the host over RDMA: here the host gets
// its slots back on the live queue. (Linux's host ignores an AER's
// completion that is not a success.)
func (c *tctrl) abortAERs() {
	c.aborted = append(c.aborted, c.aers...)
	c.aers = nil
}

// admin executes an admin command.
func (q *tqueue) admin(r *treq, in, out []byte) (nvme.Status, uint64, int) {
	c := q.ctrl
	s := r.sqe
	inval := nvme.StatusInvalidField | nvme.StatusDNR
	switch s.Opcode() {
	case nvme.AdminIdentify:
		return c.identify(nvme.IdentifyOf(s), out)
	case nvme.AdminSetFeatures, nvme.AdminGetFeatures:
		set := s.Opcode() == nvme.AdminSetFeatures
		f := nvme.FeaturesOf(s)
		c.mu.Lock()
		defer c.mu.Unlock()
		switch f.FID {
		case nvme.FeatNumQueues:
			if c.discovery() {
				return inval, 0, 0
			}
			if set {
				if uint16(f.Value) == 0xffff || uint16(f.Value>>16) == 0xffff {
					return inval, 0, 0
				}
				nsq, ncq := nvme.SplitNumQueues(f.Value)
				c.nrIOQ = min(nsq, ncq, q.t.cfg.MaxIOQueues)
			}
			return 0, uint64(nvme.NumQueues(uint16(c.nrIOQ), uint16(c.nrIOQ))), 0
		case nvme.FeatKATO:
			if set {
				c.mu.Unlock()
				c.setKATO(f.Value)
				c.mu.Lock()
			}
			return 0, uint64(c.kato / time.Millisecond), 0
		case nvme.FeatAsyncEvent:
			// nvmet_set_feat_async_event: bits beyond what the
			// controller reports are refused; the SMART critical
			// warning bits are taken (and never used: no SMART
			// events here). A discovery controller reports none and
			// takes 0 only (nvmet's discovery controller reports and
			// takes the Discovery Log Page Change notice, bit 31,
			// which this target does not send).
			if set {
				mask := uint32(aecSupported)
				if c.discovery() {
					mask = 0
				}
				if f.Value&^mask != 0 {
					return inval, 0, 0
				}
				c.aec = f.Value
			}
			return 0, uint64(c.aec), 0
		case nvme.FeatVolatileWC:
			if c.discovery() || set {
				return inval, 0, 0
			}
			return 0, 1, 0
		case nvme.FeatHostID:
			// The 128-bit host identifier of the Connect (nvmet's
			// answer, nvme get-feature -f 0x81 -c 1 -l 16): it asks for
			// the extended identifier (EXHID) and takes 16 bytes. A
			// fabrics host sets it only in Connect.
			switch {
			case set:
				return nvme.StatusCmdSeqError | nvme.StatusDNR, 0, 0
			case f.Value&1 == 0:
				return inval, 0, 0
			case len(out) != len(c.hostID):
				return nvme.StatusSGLInvalidData | nvme.StatusDNR, 0, 0
			}
			return 0, 0, copy(out, c.hostID[:])
		}
		return inval, 0, 0
	case nvme.AdminGetLogPage:
		return c.logPage(nvme.GetLogPageOf(s), out)
	case nvme.AdminKeepAlive:
		return 0, 0, 0
	case nvme.AdminAsyncEvent:
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.aers) >= aerLimit {
			return nvme.StatusAERLimitExceeded | nvme.StatusDNR, 0, 0
		}
		// Parked: answered only when an event happens (an event that
		// found none parked waits in c.events: serveEvents answers it at
		// the end of this batch). Its receive buffer goes back now (the
		// host counts the AER as outstanding).
		c.aers = append(c.aers, r.cid)
		return parked, 0, 0
	case nvme.AdminAbort:
		return 0, 1, 0 // not aborted
	}
	return nvme.StatusInvalidOpcode | nvme.StatusDNR, 0, 0
}

// parked is an internal status: no response now.
const parked nvme.Status = 0xffff

// identify answers Identify.
func (c *tctrl) identify(id nvme.Identify, out []byte) (nvme.Status, uint64, int) {
	inval := nvme.StatusInvalidField | nvme.StatusDNR
	var b [nvme.IdentifySize]byte
	switch {
	case id.CNS == nvme.CNSController:
		f := nvme.IdentifyControllerFields{SN: "discovery", MN: "rocev2", FR: "1.0", MDTS: MDTS, CNTLID: c.id,
			VER: nvme.Version(1, 3, 0), LPA: 1 << 2, MAXCMD: uint16(c.t.cfg.MaxQueueSize), KAS: kas,
			SGLS: nvme.SGLSSupported | nvme.SGLSKeyed, SubNQN: nvme.DiscoveryNQN, CNTRLTYPE: nvme.CntrlTypeDiscovery}
		if !c.discovery() {
			f.SN, f.MN, f.SubNQN, f.CNTRLTYPE = c.sub.Serial, c.sub.Model, c.sub.NQN, nvme.CntrlTypeIO
			f.RAB, f.CTRATT, f.ACL, f.AERL, f.FRMW, f.LPA, f.ELPE = 6, nvme.CtrattHostID128, 3, aerLimit-1, 1<<1|1, 1<<2, errLogSlots-1
			f.SQES, f.CQES, f.NN = 0x66, 0x44, maxNSID(c.sub)
			f.OAES = aenNSAttr // namespace attribute notices (nvmet's NVMET_AEN_CFG_OPTIONAL but ANA)
			f.ONCS = nvme.ONCSWriteZeroes | nvme.ONCSDSM
			f.VWC = 1
			f.IOCCSZ = uint32(nvme.SQESize+c.t.inline) / 16
			f.IORCSZ = 1
			f.MSDBD = 1
			if c.t.inline > 0 {
				f.SGLS |= nvme.SGLSOffset
			}
		}
		nvme.IdentifyController(b[:]).Encode(&f)
	case c.discovery():
		return inval, 0, 0
	case id.CNS == nvme.CNSCSController && id.CSI == 0:
		// The NVM command set's controller structure: all zero (no
		// verify, write zeroes or DSM limits beyond MDTS). Linux's host
		// asks for it at every connect.
	case id.CNS == nvme.CNSNamespace:
		ns := c.sub.namespace(id.NSID)
		if ns == nil {
			return nvme.StatusInvalidNamespace | nvme.StatusDNR, 0, 0
		}
		blocks := ns.blocks.Load()
		f := nvme.IdentifyNamespaceFields{NSZE: blocks, NCAP: blocks, NUSE: blocks, NGUID: ns.NGUID,
			LBAF: [16]nvme.LBAFormat{{LBADS: ns.shift}}, NSFEAT: 0}
		if ns.ReadOnly {
			f.NSATTR = 1
		}
		nvme.IdentifyNamespace(b[:]).Encode(&f)
	case id.CNS == nvme.CNSActiveNSList:
		var ids []uint32
		c.sub.mu.RLock()
		for _, ns := range c.sub.Namespaces {
			if ns.ID > id.NSID {
				ids = append(ids, ns.ID)
			}
		}
		c.sub.mu.RUnlock()
		sortU32(ids)
		nvme.PutActiveNSList(b[:], ids)
	case id.CNS == nvme.CNSNSDescList:
		ns := c.sub.namespace(id.NSID)
		if ns == nil {
			return nvme.StatusInvalidNamespace | nvme.StatusDNR, 0, 0
		}
		nvme.PutNSDescriptors(b[:], []nvme.NSDescriptor{{Type: nvme.NIDTNGUID, ID: ns.NGUID[:]}, {Type: nvme.NIDTCSI, ID: []byte{0}}})
	default:
		return inval, 0, 0
	}
	return 0, 0, copy(out, b[:])
}

func maxNSID(s *Subsystem) uint32 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var m uint32
	for _, ns := range s.Namespaces {
		m = max(m, ns.ID)
	}
	return m
}

func sortU32(a []uint32) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// logPage answers Get Log Page.
func (c *tctrl) logPage(g nvme.GetLogPage, out []byte) (nvme.Status, uint64, int) {
	var page []byte
	switch {
	case g.LID == nvme.LogDiscovery && c.discovery():
		page = c.t.discoveryLog()
	case c.discovery():
		return nvme.StatusInvalidLogPage | nvme.StatusDNR, 0, 0
	case g.LID == nvme.LogError:
		page = c.errorLog()
	case g.LID == nvme.LogSMART:
		page = c.smartLog()
	case g.LID == nvme.LogFWSlot:
		page = make([]byte, 512)
	case g.LID == nvme.LogChangedNS:
		// Checked before the list is taken: a read that fails leaves
		// it (and the notice's mask) as they were.
		if !logRangeOK(g, maxChangedNS*4, out) {
			return nvme.StatusInvalidField | nvme.StatusDNR, 0, 0
		}
		page = c.takeChangedNSLog(g.RAE)
	case g.LID == nvme.LogCmdEffects:
		page = make([]byte, 4096)
	default:
		return nvme.StatusInvalidLogPage | nvme.StatusDNR, 0, 0
	}
	if !logRangeOK(g, len(page), out) {
		return nvme.StatusInvalidField | nvme.StatusDNR, 0, 0
	}
	want := logWant(g)
	n := copy(out[:want], page[g.Offset:])
	clear(out[n:want])
	return 0, 0, int(want)
}

// logWant is how many bytes Get Log Page g asks for.
func logWant(g nvme.GetLogPage) uint64 {
	if g.NumD == 0 {
		return 1 << 34 // NUMD all ones: 2^32 dwords, more than any page
	}
	return uint64(g.NumD) * 4
}

// logRangeOK reports whether g's offset and length fit a page of size
// bytes and the buffer out.
func logRangeOK(g nvme.GetLogPage, size int, out []byte) bool {
	return g.Offset <= uint64(size) && g.Offset&3 == 0 && logWant(g) <= uint64(len(out))
}

// discoveryLog builds the discovery log page: one entry per subsystem.
func (t *Target) discoveryLog() []byte {
	nqns := make([]string, 0, len(t.subs))
	for _, s := range t.cfg.Subsystems {
		nqns = append(nqns, s.NQN)
	}
	b := make([]byte, nvme.DiscoveryHeaderSize+len(nqns)*nvme.DiscoveryEntrySize)
	h := nvme.DiscoveryHeader{GenCtr: 1, NumRec: uint64(len(nqns))}
	h.Put(b)
	addr := t.dev.Addr().Unmap()
	fam := uint8(nvme.AdrfamIPv4)
	if addr.Is6() {
		fam = nvme.AdrfamIPv6
	}
	for i, n := range nqns {
		e := nvme.DiscoveryEntry{TrType: nvme.TrtypeRDMA, AdrFam: fam, SubType: nvme.SubtypeNVMe, TReq: nvme.TreqNotSpec,
			PortID: 1, CNTLID: nvme.DynamicCNTLID, ASQSZ: nvme.AdminQueueDepth, TrSvcID: itoa(int(t.cfg.Port)), SubNQN: n,
			TrAddr: addr.String(), RDMAQPType: nvme.RDMAQPTypeRC, RDMAPrType: nvme.RDMAPrtNone, RDMACMS: nvme.RDMACMSRDMA}
		e.Put(b[nvme.DiscoveryHeaderSize+i*nvme.DiscoveryEntrySize:])
	}
	return b
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [8]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// ioCheck validates an NVM command as far as it can before its data
// moves: namespace, opcode, LBA range, write protection and the data
// length the SGL gives.
func (q *tqueue) ioCheck(r *treq) (*Namespace, nvme.Status) {
	ns := q.ctrl.sub.namespace(r.sqe.NSID())
	if ns == nil {
		return nil, nvme.StatusInvalidNamespace | nvme.StatusDNR
	}
	return q.ioCheckNS(r, ns)
}

// ioCheckNS is ioCheck for the namespace ns the command names.
func (q *tqueue) ioCheckNS(r *treq, ns *Namespace) (*Namespace, nvme.Status) {
	s := r.sqe
	switch op := s.Opcode(); op {
	case nvme.IORead, nvme.IOWrite, nvme.IOWriteZeroes:
		rw := nvme.RWOf(s)
		n, blocks := uint64(rw.Blocks()), ns.blocks.Load()
		if rw.SLBA >= blocks || n > blocks-rw.SLBA {
			return nil, nvme.StatusLBARange | nvme.StatusDNR
		}
		if op != nvme.IORead && ns.ReadOnly {
			return nil, nvme.StatusNSWriteProtected | nvme.StatusDNR
		}
		if op != nvme.IOWriteZeroes && int(n<<ns.shift) != r.xfer {
			return nil, nvme.StatusSGLInvalidData | nvme.StatusDNR
		}
	case nvme.IOFlush:
	case nvme.IODSM:
		if ns.ReadOnly && nvme.DSMOf(s).Attr&nvme.DSMDeallocate != 0 {
			return nil, nvme.StatusNSWriteProtected | nvme.StatusDNR
		}
	default:
		return nil, nvme.StatusInvalidOpcode | nvme.StatusDNR
	}
	return ns, 0
}

// io executes an NVM command.
func (q *tqueue) io(r *treq, in, out []byte) (nvme.Status, uint64, int) {
	s := r.sqe
	held := q.ctrl.sub.acquire(s.NSID())
	if held == nil {
		return nvme.StatusInvalidNamespace | nvme.StatusDNR, 0, 0
	}
	defer held.running.RUnlock() // RemoveNamespace waits for it
	ns, st := q.ioCheckNS(r, held)
	if st != 0 {
		return st, 0, 0
	}
	switch op := s.Opcode(); op {
	case nvme.IORead, nvme.IOWrite, nvme.IOWriteZeroes:
		rw := nvme.RWOf(s)
		off, size := int64(rw.SLBA<<ns.shift), int(uint64(rw.Blocks())<<ns.shift)
		switch op {
		case nvme.IORead:
			if len(out) < size {
				return nvme.StatusSGLInvalidData | nvme.StatusDNR, 0, 0
			}
			if _, err := ns.Backend.ReadAt(out[:size], off); err != nil {
				return nvme.StatusReadError, 0, 0
			}
			q.t.st.readBytes.Add(uint64(size))
			return 0, 0, size
		case nvme.IOWrite:
			if size != len(in) {
				return nvme.StatusSGLInvalidData | nvme.StatusDNR, 0, 0
			}
			if _, err := ns.Backend.WriteAt(in, off); err != nil {
				return nvme.StatusWriteFault, 0, 0
			}
			if rw.FUA {
				if err := ns.Backend.Flush(); err != nil {
					return nvme.StatusWriteFault, 0, 0
				}
			}
			q.t.st.writeBytes.Add(uint64(size))
			return 0, 0, 0
		default:
			var z [64 << 10]byte
			for done := 0; done < size; {
				k := min(size-done, len(z))
				if _, err := ns.Backend.WriteAt(z[:k], off+int64(done)); err != nil {
					return nvme.StatusWriteFault, 0, 0
				}
				done += k
			}
			return 0, 0, 0
		}
	case nvme.IOFlush:
		if err := ns.Backend.Flush(); err != nil {
			return nvme.StatusWriteFault, 0, 0
		}
		return 0, 0, 0
	default: // nvme.IODSM
		d := nvme.DSMOf(s)
		if len(in) < (int(d.NR)+1)*nvme.DSMRangeSize {
			return nvme.StatusSGLInvalidData | nvme.StatusDNR, 0, 0
		}
		blocks := ns.blocks.Load()
		for _, rg := range nvme.DSMRanges(in[:(int(d.NR)+1)*nvme.DSMRangeSize]) {
			if rg.SLBA >= blocks || uint64(rg.NLB) > blocks-rg.SLBA {
				return nvme.StatusLBARange | nvme.StatusDNR, 0, 0
			}
		}
		// Deallocation is advisory (DLFEAT 0: reads of deallocated
		// blocks return what they held).
		return 0, 0, 0
	}
}
