package nvmf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

func TestDiscovery(t *testing.T) {
	b2, _ := NewMemBackend(1 << 20)
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	p.t.Close()
	var err error
	p.t, err = Listen(p.tdev, TargetConfig{Subsystems: []*Subsystem{
		{NQN: testNQN, Namespaces: []*Namespace{{Backend: p.backend}}},
		{NQN: testNQN + "2", Namespaces: []*Namespace{{Backend: b2, BlockSize: 4096}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	es, err := Discover(ctx, p.hdev, p.targetAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("%d entries", len(es))
	}
	for i, e := range es {
		want := nvme.DiscoveryEntry{TrType: nvme.TrtypeRDMA, AdrFam: nvme.AdrfamIPv4, SubType: nvme.SubtypeNVMe, PortID: 1,
			CNTLID: 0xffff, ASQSZ: 32, TrSvcID: "4420", SubNQN: []string{testNQN, testNQN + "2"}[i], TrAddr: "192.0.2.1",
			RDMAQPType: 1, RDMAPrType: 1, RDMACMS: 1}
		if e != want {
			t.Errorf("entry %d\n got %+v\nwant %+v", i, e, want)
		}
	}
	waitFor(t, func() bool { return p.t.Queues() == 0 && p.t.Stats().LiveCtrls == 0 }, "discovery controller gone")
	// The second subsystem's 4096-byte blocks.
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN+"2", &HostConfig{IOQueues: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.Namespace(ctx, 1)
	if err != nil || ns.BlockSize() != 4096 || ns.Size() != 1<<20 {
		t.Fatalf("namespace %+v %v", ns, err)
	}
	if _, err := ns.WriteAt(make([]byte, 512), 0); !errors.Is(err, ErrAlignment) {
		t.Errorf("512-byte write on 4 KiB blocks: %v", err)
	}
}

// TestLossyNetwork: 1 % loss each way, eight goroutines writing and
// reading back their own regions, every byte checked.
func TestLossyNetwork(t *testing.T) {
	var logMu sync.Mutex
	var logs []string
	logf := func(f string, a ...any) {
		logMu.Lock()
		logs = append(logs, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(f, a...))
		logMu.Unlock()
	}
	defer func() {
		if t.Failed() {
			logMu.Lock()
			for _, l := range logs {
				t.Log(l)
			}
			logMu.Unlock()
		}
	}()
	p := newPair(t, memnet.Faults{Loss: 0.01, Seed: 7}, TargetConfig{Log: logf})
	ctx := ctxT(t, 120*time.Second)
	h, ns := connectNS(t, ctx, p.hdev, p.targetAddr, &HostConfig{IOQueues: 2, QueueSize: 16, Log: logf})
	defer h.Close()
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	var wg sync.WaitGroup
	var fails atomic.Int32
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			base := int64(g) << 20
			for i := 0; i < rounds; i++ {
				size := []int{4096, 8192, 64 << 10, 256 << 10}[i%4]
				off := base + int64(rng.Intn((1<<20-size)/512))*512
				w := make([]byte, size)
				rng.Read(w)
				if _, err := ns.WriteAtContext(ctx, w, off); err != nil {
					t.Errorf("goroutine %d write: %v", g, err)
					fails.Add(1)
					return
				}
				r := make([]byte, size)
				if _, err := ns.ReadAtContext(ctx, r, off); err != nil || !bytes.Equal(r, w) {
					t.Errorf("goroutine %d read %d at %d: %v (equal %v)", g, size, off, err, bytes.Equal(r, w))
					fails.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p.net.Counters().Lost == 0 {
		t.Error("the network lost nothing")
	}
	t.Logf("net %+v; target %+v; host %+v", p.net.Counters(), p.t.Stats(), h.Stats())
}

// TestTargetKilledMidIO: the target's device disappears while writes are
// in flight: every write fails or was stored; none acknowledged is missing.
func TestTargetKilledMidIO(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 60*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 16, KATO: time.Second,
		CtrlLossTimeout: -1, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	type ack struct {
		off  int64
		data []byte
	}
	var mu sync.Mutex
	var acked []ack
	// The write each writer had in flight when it failed: not
	// acknowledged, so it may or may not be stored (a target stores a
	// write before it answers; the answer can be lost as it dies).
	var unacked []ack
	var errs atomic.Int32
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Each goroutine writes fresh, non-overlapping 16 KiB slots.
				off := int64(g)<<20 + int64(i%64)*16<<10
				w := make([]byte, 16<<10)
				rng.Read(w)
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := ns.WriteAtContext(wctx, w, off)
				cancel()
				if err != nil {
					errs.Add(1)
					mu.Lock()
					unacked = append(unacked, ack{off, w})
					mu.Unlock()
					return
				}
				mu.Lock()
				acked = append(acked, ack{off, w})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	// Snapshot what the backend holds as the target dies: the device goes
	// away first (no more packets), then the target object.
	p.tdev.Close()
	snapshot := func() []byte {
		p.backend.mu.RLock()
		defer p.backend.mu.RUnlock()
		return bytes.Clone(p.backend.buf)
	}
	time.Sleep(50 * time.Millisecond)
	stored := snapshot()
	p.t.Close()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		close(stop)
		t.Fatal("writers hung after the target died")
	}
	if errs.Load() == 0 {
		t.Error("no write failed after the target died")
	}
	// The last acknowledged write of each slot must be what the backend
	// holds — or the later write to the same slot that was in flight
	// when its writer failed (each writer has one write in flight).
	last := map[int64][]byte{}
	for _, a := range acked {
		last[a.off] = a.data
	}
	later := map[int64][]byte{}
	for _, a := range unacked {
		later[a.off] = a.data
	}
	for off, d := range last {
		if l, ok := later[off]; ok && bytes.Equal(stored[off:off+int64(len(l))], l) {
			continue
		}
		if !bytes.Equal(stored[off:off+int64(len(d))], d) {
			t.Fatalf("acknowledged write at %d not stored", off)
		}
	}
	t.Logf("%d writes acknowledged before the target died, %d writers saw errors", len(acked), errs.Load())
	if _, err := ns.ReadAtContext(ctx, make([]byte, 512), 0); err == nil {
		t.Error("read succeeded on a dead controller")
	}
}

// rawQueue is a host queue for sending hand-made capsules.
func rawQueue(t *testing.T, p *pair, qid uint16, size int) *hqueue {
	t.Helper()
	q, err := dialQueue(ctxT(t, 10*time.Second), p.hdev, p.targetAddr, qid, size, 4096, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.close)
	return q
}

// raw sends capsule (its CID bytes are set to the slot's) and returns the completion.
func (q *hqueue) raw(ctx context.Context, capsule []byte) (nvme.CQEFields, error) {
	s, err := q.acquire(ctx)
	if err != nil {
		return nvme.CQEFields{}, err
	}
	s.gen++
	cid := uint16(s.gen)<<cidIdxBits | uint16(s.idx)
	if len(capsule) >= 4 {
		capsule[2], capsule[3] = byte(cid), byte(cid>>8)
	}
	copy(s.cmd, capsule)
	s.rkey = 0
	if len(capsule) >= nvme.SQESize {
		// A key the capsule asks to invalidate is what the response
		// may invalidate.
		if g := nvme.SQE(capsule).SGL().Fields(); g.Type == nvme.SGLTypeKeyedDataBlock && g.Subtype == nvme.SGLSubInvalidate {
			s.rkey = g.Key
		}
	}
	q.mu.Lock()
	s.busy, s.sendDone, s.resp, s.orphan, s.callerDone = true, false, nil, false, false
	q.mu.Unlock()
	defer q.finish(s)
	if err := q.qp.PostSend(transport.SendWR{WRID: uint64(s.idx), Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{q.cmdMR.SGE(uint64(s.idx*len(s.cmd)), uint32(len(capsule)))}}); err != nil {
		return nvme.CQEFields{}, err
	}
	select {
	case c := <-s.done:
		q.lastInv, q.lastMore = c.inv, c.more
		return nvme.CQEFields{Status: c.status, Result: c.result, CID: cid}, c.err
	case <-ctx.Done():
		return nvme.CQEFields{}, ctx.Err()
	}
}

func TestBadConnectionRequests(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{MaxQueueSize: 64, MaxIOQueues: 2})
	req := func(f nvme.CMReqFields) []byte {
		b := make([]byte, nvme.CMReqSize)
		nvme.CMReq(b).Encode(&f)
		return b
	}
	tests := []struct {
		name string
		pd   []byte
		want nvme.CMStatus
	}{
		{"short", make([]byte, 8), nvme.CMInvalidLen},
		{"recfmt", req(nvme.CMReqFields{RecFmt: 1, HRQSize: 32, HSQSize: 31}), nvme.CMInvalidRecFmt},
		{"qid", req(nvme.CMReqFields{QID: 3, HRQSize: 32, HSQSize: 31}), nvme.CMInvalidQID},
		{"admin-hsqsize", req(nvme.CMReqFields{HRQSize: 64, HSQSize: 63}), nvme.CMInvalidHSQSize},
		{"io-hsqsize", req(nvme.CMReqFields{QID: 1, HRQSize: 128, HSQSize: 127}), nvme.CMInvalidHSQSize},
		{"zero-hsqsize", req(nvme.CMReqFields{QID: 1, HRQSize: 2, HSQSize: 0}), nvme.CMInvalidHSQSize},
		{"zero-hrqsize", req(nvme.CMReqFields{QID: 1, HRQSize: 0, HSQSize: 15}), nvme.CMInvalidHRQSize},
	}
	for _, tt := range tests {
		ctx := ctxT(t, 10*time.Second)
		pd := tt.pd
		if len(pd) < 56 {
			pd = append(append([]byte(nil), pd...), make([]byte, 0)...)
		}
		_, err := rdmacm.Dial(ctx, p.hdev, p.targetAddr, &rdmacm.Options{PrivateData: pd})
		var rej *rdmacm.RejectError
		if !errors.As(err, &rej) {
			t.Errorf("%s: %v, want a REJ", tt.name, err)
			continue
		}
		// The short request: rdma_cm pads private data with zeros, so
		// 8 bytes arrive as 56 — a request of hsqsize 0 then.
		want := tt.want
		if tt.name == "short" {
			want = nvme.CMInvalidHSQSize
		}
		if r, err := nvme.ParseCMRej(rej.PrivateData); err != nil || r.Fields().Status != want || r.Fields().RecFmt != 0 {
			t.Errorf("%s: REJ private data %x, want status %v", tt.name, rej.PrivateData[:4], want)
		}
	}
	if got := p.t.Stats().Rejected; got != uint64(len(tests)) {
		t.Errorf("%d rejects counted, want %d", got, len(tests))
	}
	if p.t.Queues() != 0 {
		t.Errorf("%d queues left", p.t.Queues())
	}
	// Through the host API: the error names the NVMe-RDMA status.
	_, err := dialQueue(ctxT(t, 5*time.Second), p.hdev, p.targetAddr, 5, 32, 0, 0, false)
	var re *RejectedError
	if !errors.As(err, &re) || re.Status != nvme.CMInvalidQID {
		t.Errorf("dialQueue qid 5: %v", err)
	}
}

func sqeWith(build func(s nvme.SQE)) []byte {
	b := make([]byte, nvme.SQESize)
	build(b)
	nvme.SQE(b).SetFlags(nvme.FlagSGLMetabuf)
	return b
}

func TestBadCommands(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	adm := rawQueue(t, p, 0, 32)
	// Before Connect.
	c, err := adm.raw(ctx, sqeWith((&nvme.Identify{CNS: nvme.CNSController}).Put))
	if err != nil || c.Status != nvme.StatusCmdSeqError|nvme.StatusDNR {
		t.Errorf("Identify before Connect: %v %v", c.Status, err)
	}
	// A capsule too short to be a command (but with a CID).
	c, err = adm.raw(ctx, []byte{0x06, 0x40, 0, 0, 1, 0, 0, 0})
	if err != nil || c.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Errorf("8-byte capsule: %v %v", c.Status, err)
	}
	if p.t.Stats().Malformed != 1 {
		t.Errorf("malformed %d", p.t.Stats().Malformed)
	}
	h := &Controller{cfg: HostConfig{}.withDefaults(), subNQN: "nqn.unknown"}
	if _, err := h.connectQueue(ctx, adm, nvme.DynamicCNTLID, 0); !errors.Is(err, nvme.StatusConnectInvalidParam|nvme.StatusDNR) {
		t.Errorf("Connect to an unknown NQN: %v", err)
	}
	h.subNQN = testNQN
	cid, err := h.connectQueue(ctx, adm, 7, 0)
	if !errors.Is(err, nvme.StatusConnectInvalidParam|nvme.StatusDNR) || cid != 1<<16|16 {
		t.Errorf("admin Connect with cntlid 7: %v (dw0 %#x)", err, cid)
	}
	res, err := h.connectQueue(ctx, adm, nvme.DynamicCNTLID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.connectQueue(ctx, adm, nvme.DynamicCNTLID, 0); !errors.Is(err, nvme.StatusCmdSeqError|nvme.StatusDNR) {
		t.Errorf("second Connect: %v", err)
	}
	// Not enabled yet: admin commands other than Fabrics are refused.
	if err := identify(ctx, adm, nvme.Identify{CNS: nvme.CNSController}, make([]byte, 4096)); !errors.Is(err, nvme.StatusCmdSeqError|nvme.StatusDNR) {
		t.Errorf("Identify before CC.EN: %v", err)
	}
	// An I/O queue before the controller is ready.
	ioq := rawQueue(t, p, 1, 16)
	if _, err := h.connectQueue(ctx, ioq, uint16(res), 0); !errors.Is(err, nvme.StatusCmdSeqError|nvme.StatusDNR) {
		t.Errorf("I/O Connect before CC.EN: %v", err)
	}
	// Enable with a bad queue entry size: fatal status.
	if _, err := adm.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC, Value: nvme.CCEnable}).Put}); err != nil {
		t.Fatal(err)
	}
	if v, err := propGet(ctx, adm, nvme.PropCSTS, false); err != nil || v != nvme.CSTSFatal {
		t.Errorf("CSTS %#x %v after a bad CC", v, err)
	}
	adm.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC, Value: 0}).Put})
	adm.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC, Value: nvme.CCEnable | nvme.CCIOSQES6IOCQ4}).Put})
	if v, err := propGet(ctx, adm, nvme.PropCSTS, false); err != nil || v != nvme.CSTSReady {
		t.Fatalf("CSTS %#x %v", v, err)
	}
	if _, err := adm.do(ctx, &request{build: func(s nvme.SQE) { s.SetOpcode(0x55) }}); !errors.Is(err, nvme.StatusInvalidOpcode|nvme.StatusDNR) {
		t.Errorf("unknown admin opcode: %v", err)
	}
	if err := identify(ctx, adm, nvme.Identify{CNS: 0x55}, make([]byte, 4096)); !errors.Is(err, nvme.StatusInvalidField|nvme.StatusDNR) {
		t.Errorf("Identify CNS 0x55: %v", err)
	}
	if err := identify(ctx, adm, nvme.Identify{CNS: nvme.CNSCSController}, make([]byte, 4096)); err != nil {
		t.Errorf("Identify CNS 6 (NVM command set): %v", err)
	}
	if err := identify(ctx, adm, nvme.Identify{CNS: nvme.CNSCSController, CSI: 2}, make([]byte, 4096)); !errors.Is(err, nvme.StatusInvalidField|nvme.StatusDNR) {
		t.Errorf("Identify CNS 6 CSI 2: %v", err)
	}
	if err := identify(ctx, adm, nvme.Identify{CNS: nvme.CNSNamespace, NSID: 9}, make([]byte, 4096)); !errors.Is(err, nvme.StatusInvalidNamespace|nvme.StatusDNR) {
		t.Errorf("Identify NSID 9: %v", err)
	}
	// I/O queue: wrong controller ID, then the right one.
	if _, err := h.connectQueue(ctx, ioq, uint16(res)+1, 0); !errors.Is(err, nvme.StatusConnectInvalidParam|nvme.StatusDNR) {
		t.Errorf("I/O Connect with a wrong cntlid: %v", err)
	}
	if _, err := h.connectQueue(ctx, ioq, uint16(res), 0); err != nil {
		t.Fatal(err)
	}
	rw := func(op nvme.Opcode, slba uint64, nlb uint16, data []byte) error {
		r := &request{build: func(s nvme.SQE) { (&nvme.RW{NSID: 1, SLBA: slba, NLB: nlb}).Put(s, op) }}
		if op == nvme.IOWrite {
			r.out = data
		} else {
			r.in = data
		}
		_, err := ioq.do(ctx, r)
		return err
	}
	blocks := uint64(8<<20) / 512
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"read past the end", rw(nvme.IORead, blocks-1, 1, make([]byte, 1024))},
		{"write past the end", rw(nvme.IOWrite, blocks, 0, make([]byte, 512))},
		{"huge LBA", rw(nvme.IORead, 1<<63, 0, make([]byte, 512))},
		{"length mismatch", rw(nvme.IORead, 0, 7, make([]byte, 512))},
		{"in-capsule mismatch", rw(nvme.IOWrite, 0, 7, make([]byte, 1024))},
	} {
		want := nvme.StatusLBARange | nvme.StatusDNR
		if tt.name == "length mismatch" || tt.name == "in-capsule mismatch" {
			want = nvme.StatusSGLInvalidData | nvme.StatusDNR
		}
		if !errors.Is(tt.err, want) {
			t.Errorf("%s: %v, want %v", tt.name, tt.err, want)
		}
	}
	// In-capsule SGL past the capsule's data.
	bad := sqeWith(func(s nvme.SQE) { (&nvme.RW{NSID: 1, NLB: 0}).Put(s, nvme.IOWrite) })
	g := nvme.InCapsule(100, 512)
	nvme.SQE(bad).SGL().Encode(&g)
	if c, err := ioq.raw(ctx, append(bad, make([]byte, 512)...)); err != nil || c.Status != nvme.StatusSGLInvalidOffset|nvme.StatusDNR {
		t.Errorf("in-capsule offset past the data: %v %v", c.Status, err)
	}
	// An SGL type the target does not take.
	g = nvme.SGLFields{Type: nvme.SGLTypeSegment, Length: 16}
	nvme.SQE(bad).SGL().Encode(&g)
	if c, err := ioq.raw(ctx, bad); err != nil || c.Status != nvme.StatusSGLInvalidType|nvme.StatusDNR {
		t.Errorf("segment SGL: %v %v", c.Status, err)
	}
	if c, err := ioq.raw(ctx, sqeWith(func(s nvme.SQE) {
		s.SetOpcode(nvme.IORead)
		s.SetNSID(2)
		g := nvme.Keyed(0, 0, 0, false)
		s.SGL().Encode(&g)
	})); err != nil || c.Status != nvme.StatusInvalidNamespace|nvme.StatusDNR {
		t.Errorf("NSID 2: %v %v", c.Status, err)
	}
	// Reset: CC.EN 1 -> 0 makes the controller not ready; I/O is refused.
	adm.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC, Value: 0}).Put})
	if err := rw(nvme.IORead, 0, 0, make([]byte, 512)); !errors.Is(err, nvme.StatusCmdSeqError|nvme.StatusDNR) {
		t.Errorf("read after reset: %v", err)
	}
	if p.t.Stats().Errors < 15 {
		t.Errorf("errors counted: %d", p.t.Stats().Errors)
	}
	// SGL keys the host never registered: the target's RDMA READ/WRITE
	// fails on the host's side, the target tears the queue down and counts it.
	adm.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC, Value: nvme.CCEnable | nvme.CCIOSQES6IOCQ4}).Put})
	bad = sqeWith(func(s nvme.SQE) { (&nvme.RW{NSID: 1, NLB: 7}).Put(s, nvme.IORead) })
	g = nvme.Keyed(0x1000, 4096, 0xdead00, false)
	nvme.SQE(bad).SGL().Encode(&g)
	_, err = ioq.raw(ctx, bad)
	if err == nil {
		t.Error("a read into memory the host never registered completed")
	}
	waitFor(t, func() bool { return p.t.Stats().TransportErrs > 0 }, "target counts the failed RDMA WRITE")
}

// TestVanishingHost: a host that disappears without a word loses its
// controller when keep-alive expires; nothing of it stays on the target.
func TestVanishingHost(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 8, KATO: 400 * time.Millisecond, CtrlLossTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ns.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	// Keep-alives keep it alive past KATO.
	time.Sleep(time.Second)
	if p.t.Stats().KATOExpired != 0 || p.t.Stats().LiveCtrls != 1 {
		t.Fatalf("controller died with keep-alives flowing: %+v", p.t.Stats())
	}
	// Gone, as a killed process or a crashed host: no keep-alive and no
	// DREQ (the farewell Device.Close sends is lost with the rest).
	p.net.SetFaults(memnet.Faults{Loss: 1})
	p.hdev.Close()
	waitFor(t, func() bool { return p.t.Stats().KATOExpired == 1 && p.t.Stats().LiveCtrls == 0 }, "keep-alive expiry")
	waitFor(t, func() bool { return p.t.Queues() == 0 }, "the vanished host's queues torn down")
	h.Close()
}

// TestHostDeviceCloseTellsTarget: a host program that exits closing its
// device without closing the host (a deferred Device.Close) has the
// target told at once — every queue's connection gets its DREQ — rather
// than holding the controller until its keep-alive timeout.
func TestHostDeviceCloseTellsTarget(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 8, KATO: time.Minute, CtrlLossTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	if p.t.Queues() != 3 {
		t.Fatalf("target has %d queues, want 3 (admin and 2 I/O)", p.t.Queues())
	}
	start := time.Now()
	p.hdev.Close()
	end := time.Now().Add(5 * time.Second)
	for p.t.Queues() != 0 || p.t.Stats().LiveCtrls != 0 {
		if time.Now().After(end) {
			t.Fatalf("target still has %d queues and %d controllers 5 s after the host's device closed", p.t.Queues(), p.t.Stats().LiveCtrls)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if p.t.Stats().KATOExpired != 0 {
		t.Errorf("the controller ended by keep-alive expiry, not by the host's DREQs")
	}
	t.Logf("target released the controller %v after the host's device closed", time.Since(start))
	h.Close()
}

// TestReconnect: the controller goes away (its admin queue is torn down by
// the target) and the host connects again by itself.
func TestReconnect(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 60*time.Second)
	h, ns := connectNS(t, ctx, p.hdev, p.targetAddr, &HostConfig{IOQueues: 2, QueueSize: 8, ReconnectDelay: 100 * time.Millisecond})
	defer h.Close()
	w := bytes.Repeat([]byte{0xa5}, 8192)
	if _, err := ns.WriteAt(w, 4096); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		p.t.mu.Lock()
		var c *tctrl
		for _, x := range p.t.ctrls {
			c = x
		}
		p.t.mu.Unlock()
		if c == nil {
			t.Fatal("no controller")
		}
		c.delete()
		waitFor(t, func() bool { return h.Stats().Reconnects == uint64(i+1) }, "host reconnected")
		r := make([]byte, 8192)
		if _, err := ns.ReadAtContext(ctx, r, 4096); err != nil || !bytes.Equal(r, w) {
			t.Fatalf("read after reconnect %d: %v", i, err)
		}
	}
	if p.t.Stats().Controllers != 4 {
		t.Errorf("%d controllers created, want 4", p.t.Stats().Controllers)
	}
	// I/O running while the controller goes away completes: the host
	// sends what was lost again after reconnecting.
	var wg sync.WaitGroup
	var bad atomic.Int32
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := bytes.Repeat([]byte{byte(g + 1)}, 64<<10)
			for i := 0; i < 40; i++ {
				off := int64(g)<<20 + int64(i%8)*64<<10
				if _, err := ns.WriteAtContext(ctx, w, off); err != nil {
					t.Errorf("write during reconnect: %v", err)
					bad.Add(1)
					return
				}
				r := make([]byte, len(w))
				if _, err := ns.ReadAtContext(ctx, r, off); err != nil || !bytes.Equal(r, w) {
					t.Errorf("read during reconnect: %v", err)
					bad.Add(1)
					return
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	p.t.mu.Lock()
	for _, c := range p.t.ctrls {
		go c.delete()
	}
	p.t.mu.Unlock()
	wg.Wait()
	// The writers may be done before the delete lands (a fast run):
	// the reconnect then follows it, after them.
	waitFor(t, func() bool { return h.Stats().Reconnects >= 4 }, "host reconnected after the delete during I/O")
	st := h.Stats()
	t.Logf("host %+v", st)
	if st.Reconnects != 4 {
		t.Errorf("%d reconnects, want 4", st.Reconnects)
	}
	// Every command ended well, and a lost one was sent again once (four
	// writers, one command each in flight): the looks at the dead queue
	// before the loss was noticed are neither errors nor resends.
	if st.Errors != 0 || st.Requeued > 4 {
		t.Errorf("errors %d (want 0), requeued %d (want at most 4)", st.Errors, st.Requeued)
	}
}

func TestReadOnlyAndFileBackend(t *testing.T) {
	path := t.TempDir() + "/ns.img"
	fb, err := OpenFile(path, 2<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ro, _ := NewMemBackend(1 << 20)
	p := newPair(t, memnet.Faults{}, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN,
		Namespaces: []*Namespace{{Backend: fb}, {Backend: ro, ReadOnly: true}}}}})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ids, _ := h.ActiveNamespaces(ctx)
	if len(ids) != 2 {
		t.Fatalf("namespaces %v", ids)
	}
	n1, _ := h.Namespace(ctx, 1)
	n2, err := h.Namespace(ctx, 2)
	if err != nil || !n2.ReadOnly() {
		t.Fatalf("namespace 2 %v %v", n2, err)
	}
	if _, err := n2.WriteAt(make([]byte, 512), 0); !errors.Is(err, nvme.StatusNSWriteProtected|nvme.StatusDNR) {
		t.Errorf("write to a read-only namespace: %v", err)
	}
	w := bytes.Repeat([]byte("rocev2!!"), 8192)
	if _, err := n1.WriteAt(w, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := n1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(w))
	if _, err := fb.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, w) {
		t.Errorf("file content after write: %v", err)
	}
}

// TestSendWithInvalidate: a Read whose keyed SGL has the invalidate subtype
// (0x4F, as Linux's host sends) is answered with RDMA WRITE + SEND with
// Invalidate of exactly its key; the host's type 2 window is invalid after.
func TestSendWithInvalidate(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	want := bytes.Repeat([]byte{0x5a, 0xc3}, 2048)
	copy(p.backend.buf[8192:], want)
	a, _ := h.assoc(ctx)
	q := a.io[0]
	buf := make([]byte, 4096)
	mr, err := q.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Deregister()
	mw, err := q.pd.AllocMW(memreg.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Dealloc()
	rkey := mw.RKey()&^0xff | 0x17
	if err := q.qp.PostSend(transport.SendWR{WRID: 1 << 40, Opcode: transport.WRBindMW, MW: mw, RKey: rkey,
		Bind: transport.MWBindInfo{MR: mr, Addr: mr.IOVA(), Length: 4096, Access: memreg.AccessRemoteWrite}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, mw.Bound, "window bound")
	cmd := sqeWith(func(s nvme.SQE) { (&nvme.RW{NSID: 1, SLBA: 16, NLB: 7}).Put(s, nvme.IORead) })
	g := nvme.Keyed(mr.IOVA(), 4096, rkey, true)
	nvme.SQE(cmd).SGL().Encode(&g)
	c, err := q.raw(ctx, cmd)
	if err != nil || !c.Status.OK() {
		t.Fatalf("read: %v %v", c.Status, err)
	}
	if q.lastInv != rkey {
		t.Errorf("response invalidated %#x, want %#x", q.lastInv, rkey)
	}
	if mw.Bound() {
		t.Error("the window is still bound after SEND with Invalidate")
	}
	if !bytes.Equal(buf, want) {
		t.Error("data written through the window differs")
	}
	// The same key again: invalid now, the target's RDMA WRITE fails.
	c, err = q.raw(ctx, cmd)
	if err == nil {
		t.Errorf("a read through an invalidated key completed: %v", c.Status)
	}
}

// TestSeveralHosts: three hosts, each its own device and controller, write
// and read back disjoint regions of one namespace at once.
func TestSeveralHosts(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		dev := p.hdev
		if i > 0 {
			dev = newDevice(t, p.net, netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}))
			defer dev.Close()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := Connect(ctx, dev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 16,
				HostNQN: fmt.Sprintf("nqn.2026-12.io.rocev2:host%d", i)})
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			ns, err := h.Namespace(ctx, 1)
			if err != nil {
				t.Error(err)
				return
			}
			w := bytes.Repeat([]byte{byte(0x10 + i)}, 256<<10)
			for k := 0; k < 8; k++ {
				off := int64(i)<<21 + int64(k)*(256<<10)
				if _, err := ns.WriteAtContext(ctx, w, off); err != nil {
					t.Errorf("host %d: %v", i, err)
					return
				}
				r := make([]byte, len(w))
				if _, err := ns.ReadAtContext(ctx, r, off); err != nil || !bytes.Equal(r, w) {
					t.Errorf("host %d read: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := p.t.Stats()
	if st.Controllers != 3 || st.Errors != 0 {
		t.Errorf("target %+v", st)
	}
	waitFor(t, func() bool { return p.t.Queues() == 0 && p.t.Stats().LiveCtrls == 0 }, "every host's queues gone")
}

// TestNoConnect: a queue that never sends its Fabrics Connect is closed by
// the target after ConnectTimeout.
func TestNoConnect(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{ConnectTimeout: 300 * time.Millisecond})
	q, err := dialQueue(ctxT(t, 10*time.Second), p.hdev, p.targetAddr, 0, 32, 0, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	waitFor(t, func() bool { return p.t.Stats().Disconnects == 1 && p.t.Queues() == 0 }, "idle queue closed")
	select {
	case <-q.dead:
	case <-time.After(5 * time.Second):
		t.Error("the host's queue did not see the disconnect")
	}
}

// TestBoundedBuffers: with a queue's data buffers capped at one maximal
// transfer, eight concurrent 512 KiB reads and writes wait for buffers
// (counted) and all complete with the right data.
func TestBoundedBuffers(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{QueueBufferBytes: 1})
	ctx := ctxT(t, 60*time.Second)
	h, ns := connectNS(t, ctx, p.hdev, p.targetAddr, &HostConfig{IOQueues: 1, QueueSize: 16, NoInline: true})
	defer h.Close()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := bytes.Repeat([]byte{byte(g + 1)}, 512<<10)
			off := int64(g) * (512 << 10)
			for i := 0; i < 4; i++ {
				if _, err := ns.WriteAtContext(ctx, w, off); err != nil {
					t.Error(err)
					return
				}
				r := make([]byte, len(w))
				if _, err := ns.ReadAtContext(ctx, r, off); err != nil || !bytes.Equal(r, w) {
					t.Errorf("read: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p.t.Stats().Waits == 0 {
		t.Error("no command waited for a buffer")
	}
	t.Logf("target %+v", p.t.Stats())
}

// A target whose I/O queues are smaller than the admin queue's 32 still
// takes the admin queue (its size is fixed) and caps the I/O queues: a
// MaxQueueSize below 32 refused every host.
func TestSmallMaxQueueSize(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{MaxQueueSize: 8})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 64})
	if err != nil {
		t.Fatalf("Connect to a target with MaxQueueSize 8: %v", err)
	}
	defer h.Close()
	if n := h.IOQueues(); n != 2 {
		t.Fatalf("%d I/O queues, want 2", n)
	}
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	w := bytes.Repeat([]byte{0x5a}, 64<<10)
	if n, err := ns.WriteAtContext(ctx, w, 4096); err != nil || n != len(w) {
		t.Fatalf("write: %d %v", n, err)
	}
	r := make([]byte, len(w))
	if n, err := ns.ReadAtContext(ctx, r, 4096); err != nil || n != len(r) || !bytes.Equal(r, w) {
		t.Fatalf("read back: %d %v", n, err)
	}
	// An I/O queue asking for more than 8 entries is still refused.
	req := make([]byte, nvme.CMReqSize)
	nvme.CMReq(req).Encode(&nvme.CMReqFields{QID: 1, HRQSize: 9, HSQSize: 8})
	_, err = rdmacm.Dial(ctx, p.hdev, p.targetAddr, &rdmacm.Options{PrivateData: req})
	var rej *rdmacm.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("I/O queue of 9 entries on a target of 8: %v, want a REJ", err)
	}
	if r, err := nvme.ParseCMRej(rej.PrivateData); err != nil || r.Fields().Status != nvme.CMInvalidHSQSize {
		t.Errorf("REJ private data %x, want invalid HSQSIZE", rej.PrivateData[:4])
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if n := h.IOQueues(); n != 0 {
		t.Errorf("IOQueues after Close = %d, want 0", n)
	}
}
