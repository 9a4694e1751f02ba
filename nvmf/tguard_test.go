package nvmf

// The target against a host that sends what it should not, or withholds
// what it should send: the cases a hostile-peer probe found.

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// tgtAdmin connects a raw admin queue to nqn with kato (ms) and enables
// the controller; it returns the queue and the controller ID.
func tgtAdmin(t *testing.T, p *pair, nqn string, kato uint32) (*hqueue, uint16) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	adm := rawQueue(t, p, 0, 32)
	h := &Controller{cfg: HostConfig{}.withDefaults(), subNQN: nqn}
	res, err := h.connectQueue(ctx, adm, nvme.DynamicCNTLID, kato)
	if err != nil {
		t.Fatal(err)
	}
	if err := setCC(ctx, adm, nvme.CCEnable|nvme.CCIOSQES6IOCQ4); err != nil {
		t.Fatal(err)
	}
	return adm, uint16(res)
}

// tgtIO connects raw I/O queue qid of size entries to controller cntlid.
func tgtIO(t *testing.T, p *pair, cntlid, qid uint16, size int) *hqueue {
	t.Helper()
	q := rawQueue(t, p, qid, size)
	h := &Controller{cfg: HostConfig{}.withDefaults(), subNQN: testNQN}
	if _, err := h.connectQueue(ctxT(t, 10*time.Second), q, cntlid, 0); err != nil {
		t.Fatal(err)
	}
	return q
}

func setCC(ctx context.Context, adm *hqueue, v uint32) error {
	_, err := adm.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC, Value: uint64(v)}).Put})
	return err
}

// rawStatus sends capsule on q and returns its status, or the error that
// kept it from completing.
func rawStatus(ctx context.Context, q *hqueue, capsule []byte) error {
	c, err := q.raw(ctx, capsule)
	if err != nil {
		return err
	}
	if !c.Status.OK() {
		return c.Status
	}
	return nil
}

// ackHoldLink holds back the RC ACKs its device sends to QP qpn that
// acknowledge more than minMSN messages, while hold is set. (By MSN, not
// from the moment hold is set: the ACK of the response that came before
// may still be on its way to Link.Send then.)
type ackHoldLink struct {
	udp.Link
	hold   atomic.Bool
	qpn    atomic.Uint32
	minMSN uint32
	mu     sync.Mutex
	held   []udp.Packet
}

func (l *ackHoldLink) Send(pkts []udp.Packet) error {
	if !l.hold.Load() {
		return l.Link.Send(pkts)
	}
	var pass []udp.Packet
	for _, p := range pkts {
		var pk packet.Packet
		if pk.Parse(p.Buf) == nil && pk.BTH.Opcode() == bth.RCAck && pk.BTH.DestQP() == l.qpn.Load() && pk.AETH.MSN() > l.minMSN {
			l.mu.Lock()
			p.Buf = append([]byte(nil), p.Buf...)
			l.held = append(l.held, p)
			l.mu.Unlock()
			continue
		}
		pass = append(pass, p)
	}
	if len(pass) == 0 {
		return nil
	}
	return l.Link.Send(pass)
}

// release stops holding and sends what was held.
func (l *ackHoldLink) release() {
	l.hold.Store(false)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.held {
		l.Link.Send([]udp.Packet{p})
	}
	l.held = nil
}

// TestTargetPendingNoHeadOfLine: a command waiting for a data buffer at
// the head of the pending list must not hold back the commands behind it
// that wait only for a response buffer — they hold the data buffer it
// waits for. The host withholds its ACKs until every response buffer of
// the queue is in flight; then, with a 1 MiB buffer budget, X (512 KiB
// read) waits for a response buffer, A (1 MiB) for a data buffer, B
// (512 KiB) takes the other half of the budget and waits for a response
// buffer. Served strictly in order, A and B never completed.
func TestTargetPendingNoHeadOfLine(t *testing.T) {
	p := &pair{net: memnet.NewMemNetwork(memnet.Faults{})}
	p.tdev = newDevice(t, p.net, targetIP)
	link, err := p.net.Link(hostIP)
	if err != nil {
		t.Fatal(err)
	}
	hl := &ackHoldLink{Link: link, minMSN: 1} // the I/O queue's Connect response is message 1
	if p.hdev, err = transport.NewDevice(hl, transport.DeviceConfig{}); err != nil {
		t.Fatal(err)
	}
	p.backend, _ = NewMemBackend(8 << 20)
	for i := range p.backend.buf {
		p.backend.buf[i] = byte(i / 512)
	}
	p.t, err = Listen(p.tdev, TargetConfig{Log: t.Logf, QueueBufferBytes: 1 << 20,
		Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: p.backend}}}}})
	if err != nil {
		t.Fatal(err)
	}
	p.targetAddr = netip.AddrPortFrom(targetIP, nvme.Port)
	t.Cleanup(func() { p.t.Close(); p.hdev.Close(); p.tdev.Close() })
	ctx := ctxT(t, 30*time.Second)
	_, cntlid := tgtAdmin(t, p, testNQN, 0)
	ioq := tgtIO(t, p, cntlid, 1, 5) // 5 receive buffers: 2*5+4 = 14 response buffers
	a, err := ioq.qp.Query()
	if err != nil {
		t.Fatal(err)
	}
	hl.qpn.Store(a.DestQPN)
	big := make([]byte, 4<<20)
	mr, err := ioq.pd.RegisterMR(big, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	read := func(slba uint64, n int, off uint64) error {
		cmd := sqeWith(func(s nvme.SQE) { (&nvme.RW{NSID: 1, SLBA: slba, NLB: uint16(n/512 - 1)}).Put(s, nvme.IORead) })
		g := nvme.Keyed(mr.IOVA()+off, uint32(n), mr.RKey(), false)
		nvme.SQE(cmd).SGL().Encode(&g)
		rctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		defer cancel()
		if err := rawStatus(rctx, ioq, cmd); err != nil {
			return err
		}
		if !bytes.Equal(big[off:off+uint64(n)], p.backend.buf[slba*512:slba*512+uint64(n)]) {
			return errors.New("wrong data")
		}
		return nil
	}
	flush := sqeWith(func(s nvme.SQE) { s.SetOpcode(nvme.IOFlush); s.SetNSID(1) })
	hl.hold.Store(true)
	for i := 0; i < 14; i++ { // 14 responses never ACKed: no response buffer left
		if err := rawStatus(ctx, ioq, flush); err != nil {
			t.Fatalf("flush %d: %v", i, err)
		}
	}
	type result struct {
		name string
		err  error
	}
	res := make(chan result, 3)
	for i, c := range []struct {
		name string
		slba uint64
		n    int
		off  uint64
	}{{"X", 0, 512 << 10, 0}, {"A", 2048, 1 << 20, 1 << 20}, {"B", 4096, 512 << 10, 3 << 20}} {
		go func() { res <- result{c.name, read(c.slba, c.n, c.off)} }()
		// In this order: X waits for a response buffer, A for a
		// data buffer, B for a response buffer.
		waitFor(t, func() bool { return p.t.Stats().Waits == uint64(i+1) }, c.name+" waits")
	}
	hl.release()
	for i := 0; i < 3; i++ {
		if r := <-res; r.err != nil {
			t.Errorf("read %s: %v", r.name, r.err)
		}
	}
	if err := rawStatus(ctx, ioq, flush); err != nil {
		t.Errorf("flush after: %v", err)
	}
}

// TestTargetRefusesFused: Identify says fused operations are not
// supported (FUSES 0); a command marked fused is refused (Invalid Field,
// as nvmet), not run on its own — a Write that was the second half of a
// failed Compare and Write would overwrite the block.
func TestTargetRefusesFused(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 15*time.Second)
	_, cntlid := tgtAdmin(t, p, testNQN, 0)
	ioq := tgtIO(t, p, cntlid, 1, 8)
	copy(p.backend.buf, bytes.Repeat([]byte{0x11}, 512))
	g := nvme.InCapsule(0, 512)
	for _, tt := range []struct {
		name string
		op   nvme.Opcode
		fuse uint8
	}{
		{"compare, first", 0x05, 1},
		{"write, second", nvme.IOWrite, 2},
		{"write, first", nvme.IOWrite, 1},
		{"write, both bits", nvme.IOWrite, 3},
	} {
		cmd := sqeWith(func(s nvme.SQE) { (&nvme.RW{NSID: 1}).Put(s, tt.op) })
		nvme.SQE(cmd).SetFlags(nvme.FlagSGLMetabuf | tt.fuse)
		nvme.SQE(cmd).SGL().Encode(&g)
		err := rawStatus(ctx, ioq, append(cmd, bytes.Repeat([]byte{0x33}, 512)...))
		if want := nvme.StatusInvalidField | nvme.StatusDNR; !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", tt.name, err, want)
		}
	}
	if p.backend.buf[0] != 0x11 {
		t.Errorf("LBA 0 overwritten by a fused write: %#x", p.backend.buf[0])
	}
	// Unfused, the same write runs.
	cmd := sqeWith(func(s nvme.SQE) { (&nvme.RW{NSID: 1}).Put(s, nvme.IOWrite) })
	nvme.SQE(cmd).SGL().Encode(&g)
	if err := rawStatus(ctx, ioq, append(cmd, bytes.Repeat([]byte{0x33}, 512)...)); err != nil || p.backend.buf[0] != 0x33 {
		t.Errorf("plain write: %v, LBA 0 %#x", err, p.backend.buf[0])
	}
}

// TestTargetShutdownStopsIO: after CC.SHN the controller reports the
// shutdown complete and is not ready any more (nvmet_clear_ctrl): I/O
// gets Command Sequence Error and is not executed — nothing is written
// after the flush the host relied on. Enabling again (CC reads 0 after
// the shutdown, as nvmet's) makes it ready.
func TestTargetShutdownStopsIO(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 15*time.Second)
	adm, cntlid := tgtAdmin(t, p, testNQN, 0)
	ioq := tgtIO(t, p, cntlid, 1, 8)
	write := func(b byte) error {
		_, err := ioq.do(ctx, &request{out: bytes.Repeat([]byte{b}, 512), build: func(s nvme.SQE) { (&nvme.RW{NSID: 1}).Put(s, nvme.IOWrite) }})
		return err
	}
	if err := write(0x11); err != nil {
		t.Fatal(err)
	}
	if err := setCC(ctx, adm, nvme.CCEnable|nvme.CCIOSQES6IOCQ4|nvme.CCShnNormal); err != nil {
		t.Fatal(err)
	}
	if v, err := propGet(ctx, adm, nvme.PropCSTS, false); err != nil || v != uint64(nvme.CSTSShstCmplt) {
		t.Errorf("CSTS after SHN: %#x %v, want shutdown complete, not ready", v, err)
	}
	if err := write(0x22); !errors.Is(err, nvme.StatusCmdSeqError|nvme.StatusDNR) {
		t.Errorf("write after shutdown: %v, want command sequence error", err)
	}
	if p.backend.buf[0] != 0x11 {
		t.Errorf("write after shutdown executed: LBA 0 %#x", p.backend.buf[0])
	}
	if err := setCC(ctx, adm, nvme.CCEnable|nvme.CCIOSQES6IOCQ4); err != nil {
		t.Fatal(err)
	}
	if v, err := propGet(ctx, adm, nvme.PropCSTS, false); err != nil || v != uint64(nvme.CSTSReady) {
		t.Errorf("CSTS after enabling again: %#x %v", v, err)
	}
	if err := write(0x33); err != nil || p.backend.buf[0] != 0x33 {
		t.Errorf("write after enabling again: %v, LBA 0 %#x", err, p.backend.buf[0])
	}
}

// TestDiscoveryKATO: a discovery controller whose host asks for no
// keep-alive (KATO 0, as Discover sends) expires after DiscoveryKATO
// (nvmet: 120 s): idle discovery connections do not hold MaxControllers
// for ever and lock every other host out.
func TestDiscoveryKATO(t *testing.T) {
	if p := newPair(t, memnet.Faults{}, TargetConfig{}); p.t.cfg.DiscoveryKATO != 120*time.Second {
		t.Errorf("default DiscoveryKATO %v", p.t.cfg.DiscoveryKATO)
	}
	for _, tt := range []struct {
		name    string
		kato    time.Duration
		expires bool
	}{
		{"200ms", 200 * time.Millisecond, true},
		{"none", -1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPair(t, memnet.Faults{}, TargetConfig{MaxControllers: 2, DiscoveryKATO: tt.kato})
			ctx := ctxT(t, 20*time.Second)
			for i := 0; i < 2; i++ {
				adm := rawQueue(t, p, 0, 32)
				h := &Controller{cfg: HostConfig{}.withDefaults(), subNQN: nvme.DiscoveryNQN}
				if _, err := h.connectQueue(ctx, adm, nvme.DynamicCNTLID, 0); err != nil {
					t.Fatal(err)
				}
			}
			if !tt.expires {
				time.Sleep(time.Second)
				if st := p.t.Stats(); st.LiveCtrls != 2 || st.KATOExpired != 0 {
					t.Errorf("discovery controllers expired with DiscoveryKATO < 0: %+v", st)
				}
				return
			}
			waitFor(t, func() bool { return p.t.Stats().LiveCtrls == 0 }, "idle discovery controllers expire")
			if n := p.t.Stats().KATOExpired; n != 2 {
				t.Errorf("%d keep-alive expiries, want 2", n)
			}
			h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8, CtrlLossTimeout: -1})
			if err != nil {
				t.Fatalf("a host after the idle discovery controllers: %v", err)
			}
			h.Close()
		})
	}
}

// TestDiscoveryKATORange: KATO is a 32-bit count of milliseconds; a
// DiscoveryKATO beyond it is an error naming the field. It wrapped: 2^32
// ms became a KATO of 0, then 1 ms, and every discovery controller
// expired at once.
func TestDiscoveryKATORange(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	dev := newDevice(t, n, targetIP)
	defer dev.Close()
	subs := []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: MemBackendOn(make([]byte, 4096))}}}}
	for _, d := range []time.Duration{MaxKATO + time.Millisecond, time.Duration(1<<32) * time.Millisecond, 1<<63 - 1} {
		tg, err := Listen(dev, TargetConfig{Subsystems: subs, DiscoveryKATO: d})
		if err == nil {
			tg.Close()
			t.Errorf("DiscoveryKATO %v accepted", d)
		} else if !strings.Contains(err.Error(), "DiscoveryKATO") {
			t.Errorf("DiscoveryKATO %v: %v, not naming the field", d, err)
		}
	}
	tg, err := Listen(dev, TargetConfig{Subsystems: subs, DiscoveryKATO: MaxKATO})
	if err != nil {
		t.Fatalf("DiscoveryKATO MaxKATO: %v", err)
	}
	tg.Close()
}

// TestHostKATORange: the host's KATO is refused beyond MaxKATO, before
// anything connects; it went out wrapped (2^32 ms + 1 s as a KATO of
// 1 s, while the host sent a keep-alive every 24 days).
func TestHostKATORange(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 10*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{KATO: time.Duration(1<<32)*time.Millisecond + time.Second})
	if err == nil {
		h.Close()
		t.Fatal("KATO beyond MaxKATO accepted")
	}
	if !strings.Contains(err.Error(), "HostConfig.KATO") || p.t.Stats().Connections != 0 {
		t.Errorf("%v (not naming the field?); target %+v", err, p.t.Stats())
	}
}

// TestTargetChecksBeforeFetch: a command the target refuses gets its
// status before any RDMA READ of its data (nvmet_req_init parses it
// first): with a key the host never registered, fetching first lost the
// queue instead.
func TestTargetChecksBeforeFetch(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	adm, cntlid := tgtAdmin(t, p, testNQN, 0)
	blocks := uint64(8<<20) / 512
	qid := uint16(0)
	for _, tt := range []struct {
		name  string
		admin bool
		op    nvme.Opcode
		nsid  uint32
		slba  uint64
		nlb   uint16
		want  nvme.Status
	}{
		{"opcode 0x81", false, 0x81, 1, 0, 7, nvme.StatusInvalidOpcode},
		{"write nsid 99", false, nvme.IOWrite, 99, 0, 7, nvme.StatusInvalidNamespace},
		{"write nsid 0xffffffff", false, nvme.IOWrite, 0xffffffff, 0, 7, nvme.StatusInvalidNamespace},
		{"write past the end", false, nvme.IOWrite, 1, blocks - 4, 7, nvme.StatusLBARange},
		{"write length mismatch", false, nvme.IOWrite, 1, 0, 0, nvme.StatusSGLInvalidData},
		// Last: the admin queue lost takes the controller with it.
		{"admin opcode 0x81", true, 0x81, 0, 0, 7, nvme.StatusInvalidOpcode},
	} {
		cmd := sqeWith(func(s nvme.SQE) { (&nvme.RW{NSID: tt.nsid, SLBA: tt.slba, NLB: tt.nlb}).Put(s, tt.op) })
		g := nvme.Keyed(0x1000, 4096, 0xdead00, false)
		nvme.SQE(cmd).SGL().Encode(&g)
		q := adm
		if !tt.admin {
			qid++ // a queue of its own: a fetch with the bad key would end it
			q = tgtIO(t, p, cntlid, qid, 8)
		}
		ctx := ctxT(t, 5*time.Second)
		if err := rawStatus(ctx, q, cmd); !errors.Is(err, tt.want|nvme.StatusDNR) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want|nvme.StatusDNR)
		}
	}
	if n := p.t.Stats().TransportErrs; n != 0 {
		t.Errorf("%d transport errors: the target fetched data of a command it refused", n)
	}
}

// TestGetLogPageNUMD: NUMD is 0's based; all ones asks 2^32 dwords, more
// than any page: Invalid Field, not a success with no data (the count
// wrapped to 0).
func TestGetLogPageNUMD(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 15*time.Second)
	adm, _ := tgtAdmin(t, p, testNQN, 0)
	for _, tt := range []struct {
		name string
		g    nvme.GetLogPage
		want error
	}{
		{"NUMD all ones", nvme.GetLogPage{LID: nvme.LogSMART, NumD: 0}, nvme.StatusInvalidField | nvme.StatusDNR},
		{"past the buffer", nvme.GetLogPage{LID: nvme.LogSMART, NumD: 1 << 20}, nvme.StatusInvalidField | nvme.StatusDNR},
		{"offset past the page", nvme.GetLogPage{LID: nvme.LogSMART, NumD: 128, Offset: 1 << 40}, nvme.StatusInvalidField | nvme.StatusDNR},
		{"whole page", nvme.GetLogPage{LID: nvme.LogSMART, NumD: 128}, nil},
	} {
		_, err := adm.do(ctx, &request{in: make([]byte, 512), build: tt.g.Put})
		if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}

// TestAERAbortedOnReset: AERs parked when the controller is disabled
// (CC.EN 1→0) or shut down are answered, not dropped: the host gets its
// slots back and may park AERL+1 again. The status is nvmet's for them
// (nvmet_async_events_failall: Internal Error, DNR); it was Aborted due
// to SQ Deletion.
func TestAERAbortedOnReset(t *testing.T) {
	for _, tt := range []struct {
		name string
		cc   uint32
	}{{"disable", 0}, {"shutdown", nvme.CCEnable | nvme.CCIOSQES6IOCQ4 | nvme.CCShnNormal}} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPair(t, memnet.Faults{}, TargetConfig{})
			ctx := ctxT(t, 20*time.Second)
			adm, _ := tgtAdmin(t, p, testNQN, 0)
			for round := 0; round < 2; round++ {
				errs := make(chan error, aerLimit)
				for i := 0; i < aerLimit; i++ {
					go func() {
						_, err := adm.do(ctx, &request{build: func(s nvme.SQE) { s.SetOpcode(nvme.AdminAsyncEvent) }})
						errs <- err
					}()
				}
				waitFor(t, func() bool { return parkedAERs(p.t) == aerLimit }, "AERs parked")
				_, err := adm.do(ctx, &request{build: func(s nvme.SQE) { s.SetOpcode(nvme.AdminAsyncEvent) }})
				if !errors.Is(err, nvme.StatusAERLimitExceeded|nvme.StatusDNR) {
					t.Fatalf("round %d: AER beyond the limit: %v", round, err)
				}
				if err := setCC(ctx, adm, tt.cc); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < aerLimit; i++ {
					select {
					case err := <-errs:
						if !errors.Is(err, nvme.StatusInternal|nvme.StatusDNR) {
							t.Errorf("round %d: parked AER ended with %v, want Internal Error, DNR", round, err)
						}
					case <-time.After(5 * time.Second):
						t.Fatalf("round %d: a parked AER was never answered", round)
					}
				}
				if err := setCC(ctx, adm, nvme.CCEnable|nvme.CCIOSQES6IOCQ4); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// parkedAERs counts the AERs the target's controllers hold.
func parkedAERs(t *Target) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.ctrls {
		c.mu.Lock()
		n += len(c.aers)
		c.mu.Unlock()
	}
	return n
}
