package nvmf

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// aer parks an Asynchronous Event Request on adm; its completion (result
// or error) comes on the channel.
type aerResult struct {
	res uint64
	err error
}

func parkAER(ctx context.Context, adm *hqueue) chan aerResult {
	ch := make(chan aerResult, 1)
	go func() {
		res, err := adm.do(ctx, &request{build: func(s nvme.SQE) { s.SetOpcode(nvme.AdminAsyncEvent) }})
		ch <- aerResult{res, err}
	}()
	return ch
}

// wantNSNotice waits for ch's AER to complete with the Namespace
// Attribute Changed notice: type 2h, info 00h, log page 04h.
func wantNSNotice(t *testing.T, ch chan aerResult) {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("AER: %v", r.err)
		}
		if ev := nvme.ParseAsyncEvent(r.res); ev != (nvme.AsyncEvent{Type: nvme.AENotice, Info: 0, LID: nvme.LogChangedNS}) || r.res != 0x040002 {
			t.Fatalf("AER completed with %#x (%+v), want 0x040002: notice, namespace attribute changed, log 04h", r.res, ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the AER was not completed by the namespace change")
	}
}

// wantParked checks that ch's AER has not completed (n AERs parked in
// all). A command on adm first: the admin queue answers the events
// queued before it in the batch that executes it, so an event that
// would complete the AER has by then.
func wantParked(t *testing.T, p *pair, adm *hqueue, ch chan aerResult, n int) {
	t.Helper()
	if _, err := features(ctxT(t, 10*time.Second), adm, false, nvme.FeatAsyncEvent, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return parkedAERs(p.t) == n }, "AERs parked")
	select {
	case r := <-ch:
		t.Fatalf("AER completed (%#x, %v); want it parked", r.res, r.err)
	default:
	}
}

// changedNSLog reads log page 04h (with RAE as given) and returns its
// NSIDs up to the first zero.
func changedNSLog(t *testing.T, ctx context.Context, adm *hqueue, rae bool) []uint32 {
	t.Helper()
	b := make([]byte, 4096)
	g := nvme.GetLogPage{LID: nvme.LogChangedNS, NumD: 1024, RAE: rae}
	if _, err := adm.do(ctx, &request{in: b, build: g.Put}); err != nil {
		t.Fatalf("Get Log Page 04h: %v", err)
	}
	var ids []uint32
	for i := 0; i < len(b); i += 4 {
		v := binary.LittleEndian.Uint32(b[i:])
		if v == 0 {
			break
		}
		ids = append(ids, v)
	}
	return ids
}

func features(ctx context.Context, adm *hqueue, set bool, fid uint8, v uint32) (uint64, error) {
	op := nvme.AdminGetFeatures
	if set {
		op = nvme.AdminSetFeatures
	}
	f := nvme.Features{FID: fid, Value: v}
	return adm.do(ctx, &request{build: func(s nvme.SQE) { f.Put(s, op) }})
}

func identifyNSBlocks(t *testing.T, ctx context.Context, adm *hqueue, nsid uint32) (uint64, error) {
	t.Helper()
	b := make([]byte, nvme.IdentifySize)
	id := nvme.Identify{CNS: nvme.CNSNamespace, NSID: nsid}
	if _, err := adm.do(ctx, &request{in: b, build: id.Put}); err != nil {
		return 0, err
	}
	return nvme.IdentifyNamespace(b).Fields().NSZE, nil
}

// fileTarget starts a target whose namespace 1 is a 1 MiB file; it
// returns the pair and the file's path.
func fileTarget(t *testing.T) (*pair, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ns1")
	fb, err := OpenFile(path, 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fb.Close() })
	return newPair(t, memnet.Faults{}, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN,
		Namespaces: []*Namespace{{Backend: fb}}}}}), path
}

// TestAENResizeCompletesParkedAER: a backing file that grew, once
// revalidated, completes the parked AER with the namespace attribute
// notice; Identify Namespace reports the new size, log page 04h names the
// namespace (and is empty when read again).
func TestAENResizeCompletesParkedAER(t *testing.T) {
	p, path := fileTarget(t)
	ctx := ctxT(t, 30*time.Second)
	adm, _ := tgtAdmin(t, p, testNQN, 0)
	ch := parkAER(ctx, adm)
	wantParked(t, p, adm, ch, 1)
	if changed, err := p.t.RevalidateNamespace(testNQN, 1); changed || err != nil {
		t.Fatalf("RevalidateNamespace of an unchanged file: %v, %v", changed, err)
	}
	wantParked(t, p, adm, ch, 1)
	if err := os.Truncate(path, 3<<20); err != nil {
		t.Fatal(err)
	}
	if changed, err := p.t.RevalidateNamespace(testNQN, 1); !changed || err != nil {
		t.Fatalf("RevalidateNamespace of a grown file: %v, %v", changed, err)
	}
	wantNSNotice(t, ch)
	if n, err := identifyNSBlocks(t, ctx, adm, 1); err != nil || n != 3<<20/512 {
		t.Fatalf("Identify Namespace: NSZE %d, %v; want %d", n, err, 3<<20/512)
	}
	if ids := changedNSLog(t, ctx, adm, false); len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("Changed Namespace List %v, want [1]", ids)
	}
	if ids := changedNSLog(t, ctx, adm, false); len(ids) != 0 {
		t.Fatalf("Changed Namespace List read again: %v, want empty", ids)
	}
	// Reads beyond the old end now succeed.
	io := tgtIO(t, p, 1, 1, 8)
	b := make([]byte, 512)
	rw := nvme.RW{NSID: 1, SLBA: 3<<20/512 - 1}
	if _, err := io.do(ctx, &request{in: b, build: func(s nvme.SQE) { rw.Put(s, nvme.IORead) }}); err != nil {
		t.Fatalf("read of the last block of the grown namespace: %v", err)
	}
}

// TestAENQueuedWithoutAER: a change while no AER is parked waits for the
// next AER, which completes at once.
func TestAENQueuedWithoutAER(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	adm, _ := tgtAdmin(t, p, testNQN, 0)
	b, _ := NewMemBackend(1 << 20)
	if id, err := p.t.AddNamespace(testNQN, &Namespace{Backend: b}); err != nil || id != 2 {
		t.Fatalf("AddNamespace: %d, %v", id, err)
	}
	wantNSNotice(t, parkAER(ctx, adm))
	// Only one notice: the next AER stays parked.
	wantParked(t, p, adm, parkAER(ctx, adm), 1)
}

// TestAENMaskedUntilLogRead: after a notice, further changes send none
// until the host reads log page 04h with RAE clear (nvmet's aen_masked);
// a read with RAE set keeps the notice masked. The list gathers every
// change meanwhile.
func TestAENMaskedUntilLogRead(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	adm, _ := tgtAdmin(t, p, testNQN, 0)
	ch := parkAER(ctx, adm)
	wantParked(t, p, adm, ch, 1)
	b2, _ := NewMemBackend(1 << 20)
	if _, err := p.t.AddNamespace(testNQN, &Namespace{ID: 7, Backend: b2}); err != nil {
		t.Fatal(err)
	}
	wantNSNotice(t, ch)
	ch = parkAER(ctx, adm)
	if _, err := p.t.RemoveNamespace(testNQN, 1); err != nil {
		t.Fatal(err)
	}
	wantParked(t, p, adm, ch, 1)
	if ids := changedNSLog(t, ctx, adm, true); len(ids) != 2 || ids[0] != 7 || ids[1] != 1 {
		t.Fatalf("Changed Namespace List %v, want [7 1]", ids)
	}
	b3, _ := NewMemBackend(1 << 20)
	if _, err := p.t.AddNamespace(testNQN, &Namespace{ID: 3, Backend: b3}); err != nil {
		t.Fatal(err)
	}
	wantParked(t, p, adm, ch, 1) // RAE set: still masked
	if ids := changedNSLog(t, ctx, adm, false); len(ids) != 1 || ids[0] != 3 {
		t.Fatalf("Changed Namespace List %v, want [3]", ids)
	}
	if _, err := p.t.RemoveNamespace(testNQN, 3); err != nil {
		t.Fatal(err)
	}
	wantNSNotice(t, ch)
}

// TestAENConfiguration: Identify Controller reports OAES bit 8; the
// Asynchronous Event Configuration reads 100h until set, takes the bits
// nvmet takes and refuses others; with bit 8 clear a change completes
// no AER but still enters log page 04h.
func TestAENConfiguration(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	adm, _ := tgtAdmin(t, p, testNQN, 0)
	b := make([]byte, nvme.IdentifySize)
	id := nvme.Identify{CNS: nvme.CNSController}
	if _, err := adm.do(ctx, &request{in: b, build: id.Put}); err != nil {
		t.Fatal(err)
	}
	if oaes := nvme.IdentifyController(b).Fields().OAES; oaes != 1<<8 {
		t.Fatalf("OAES %#x, want 0x100 (namespace attribute notices)", oaes)
	}
	if v, err := features(ctx, adm, false, nvme.FeatAsyncEvent, 0); err != nil || v != 0x100 {
		t.Fatalf("Get Features 0Bh: %#x, %v; want 0x100", v, err)
	}
	if _, err := features(ctx, adm, true, nvme.FeatAsyncEvent, 1<<9); !errors.Is(err, nvme.StatusInvalidField|nvme.StatusDNR) {
		t.Fatalf("Set Features 0Bh with bit 9 (firmware activation, not in OAES): %v, want Invalid Field", err)
	}
	if v, err := features(ctx, adm, true, nvme.FeatAsyncEvent, 0x1f); err != nil || v != 0x1f {
		t.Fatalf("Set Features 0Bh 0x1f: %#x, %v", v, err)
	}
	if v, err := features(ctx, adm, false, nvme.FeatAsyncEvent, 0); err != nil || v != 0x1f {
		t.Fatalf("Get Features 0Bh after setting 0x1f: %#x, %v", v, err)
	}
	ch := parkAER(ctx, adm)
	wantParked(t, p, adm, ch, 1)
	if _, err := p.t.RemoveNamespace(testNQN, 1); err != nil {
		t.Fatal(err)
	}
	wantParked(t, p, adm, ch, 1)
	if ids := changedNSLog(t, ctx, adm, false); len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("Changed Namespace List %v, want [1]", ids)
	}
	// A discovery controller reports no notices: 0 only.
	disc, _ := tgtAdmin(t, p, nvme.DiscoveryNQN, 0)
	if _, err := features(ctx, disc, true, nvme.FeatAsyncEvent, 0); err != nil {
		t.Errorf("discovery controller: Set Features 0Bh 0: %v", err)
	}
	if _, err := features(ctx, disc, true, nvme.FeatAsyncEvent, 1<<8); !errors.Is(err, nvme.StatusInvalidField|nvme.StatusDNR) {
		t.Errorf("discovery controller: Set Features 0Bh 0x100: %v, want Invalid Field", err)
	}
}

// TestChangedNSLogOverflow: more than 1024 changed namespaces make the
// list FFFFFFFFh alone, until it is read.
func TestChangedNSLogOverflow(t *testing.T) {
	c := &tctrl{}
	fill := func() {
		for id := uint32(1); id <= maxChangedNS; id++ {
			c.addChangedNS(id)
			c.addChangedNS(id) // once only
		}
	}
	fill()
	page := c.takeChangedNSLog(false)
	if v := binary.LittleEndian.Uint32(page[4*(maxChangedNS-1):]); v != maxChangedNS || binary.LittleEndian.Uint32(page) != 1 {
		t.Fatalf("full list: first %d, last %d", binary.LittleEndian.Uint32(page), v)
	}
	fill()
	c.addChangedNS(5000)
	page = c.takeChangedNSLog(false)
	if binary.LittleEndian.Uint32(page) != 0xffffffff || binary.LittleEndian.Uint32(page[4:]) != 0 {
		t.Fatalf("overflowed list starts %x %x, want ffffffff 0", page[:4], page[4:8])
	}
	c.addChangedNS(9)
	if page = c.takeChangedNSLog(false); binary.LittleEndian.Uint32(page) != 9 || binary.LittleEndian.Uint32(page[4:]) != 0 {
		t.Fatalf("after the read: %x %x, want 9 0", page[:4], page[4:8])
	}
}

// TestNamespaceAddRemove: namespaces added and removed while the target
// runs show in the active namespace list and Identify; a removed one's
// commands fail with Invalid Namespace; bad calls name what is wrong.
func TestNamespaceAddRemove(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	adm, cntlid := tgtAdmin(t, p, testNQN, 0)
	io := tgtIO(t, p, cntlid, 1, 8)
	b2, _ := NewMemBackend(2 << 20)
	if _, err := p.t.AddNamespace(testNQN, &Namespace{ID: 5, Backend: b2, BlockSize: 4096}); err != nil {
		t.Fatal(err)
	}
	list := func() []uint32 {
		b := make([]byte, nvme.IdentifySize)
		id := nvme.Identify{CNS: nvme.CNSActiveNSList}
		if _, err := adm.do(ctx, &request{in: b, build: id.Put}); err != nil {
			t.Fatal(err)
		}
		return nvme.ActiveNSList(b)
	}
	if l := list(); len(l) != 2 || l[0] != 1 || l[1] != 5 {
		t.Fatalf("active namespaces %v, want [1 5]", l)
	}
	if n, err := identifyNSBlocks(t, ctx, adm, 5); err != nil || n != 512 {
		t.Fatalf("namespace 5: %d blocks, %v", n, err)
	}
	if _, err := p.t.RemoveNamespace(testNQN, 1); err != nil {
		t.Fatal(err)
	}
	if l := list(); len(l) != 1 || l[0] != 5 {
		t.Fatalf("active namespaces %v, want [5]", l)
	}
	buf := make([]byte, 512)
	rw := nvme.RW{NSID: 1}
	if _, err := io.do(ctx, &request{in: buf, build: func(s nvme.SQE) { rw.Put(s, nvme.IORead) }}); !errors.Is(err, nvme.StatusInvalidNamespace|nvme.StatusDNR) {
		t.Fatalf("read of the removed namespace: %v", err)
	}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{func() error { _, err := p.t.AddNamespace("nqn.nope", &Namespace{Backend: b2}); return err }(), `nqn "nqn.nope"`},
		{func() error { _, err := p.t.AddNamespace(testNQN, &Namespace{ID: 5, Backend: b2}); return err }(), "ns.ID 5"},
		{func() error { _, err := p.t.AddNamespace(testNQN, &Namespace{}); return err }(), "ns.Backend"},
		{func() error { _, err := p.t.AddNamespace(testNQN, nil); return err }(), "ns is nil"},
		{func() error { _, err := p.t.RemoveNamespace(testNQN, 1); return err }(), "nsid 1"},
		{func() error { _, err := p.t.RevalidateNamespace(testNQN, 9); return err }(), "nsid 9"},
	} {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("error %v, want one naming %s", tt.err, tt.want)
		}
	}
}

// TestHostNamespaceChangeEvents: a host with OnNamespaceChange keeps an
// AER outstanding and hands over the Changed Namespace List of each
// notice: a namespace added, then the file namespace grown (whose new
// size Namespace then reports). Without OnNamespaceChange the host
// sends no AER.
func TestHostNamespaceChangeEvents(t *testing.T) {
	p, path := fileTarget(t)
	ctx := ctxT(t, 30*time.Second)
	plain, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Identify(ctx); err != nil {
		t.Fatal(err)
	}
	if n := parkedAERs(p.t); n != 0 {
		t.Fatalf("%d AERs parked by a host without OnNamespaceChange", n)
	}
	plain.Close()
	changes := make(chan []uint32, 4)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1,
		OnNamespaceChange: func(ids []uint32) { changes <- ids }})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	waitFor(t, func() bool { return parkedAERs(p.t) == 1 }, "the host's AER parked")
	// The AER has no timeout: an hour on, the admin queue's watchdog
	// finds nothing overdue.
	h.mu.Lock()
	adm := h.cur.admin
	h.mu.Unlock()
	if err := adm.expire(time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("the outstanding AER timed out: %v", err)
	}
	want := func(ids ...uint32) {
		t.Helper()
		select {
		case got := <-changes:
			if len(got) != len(ids) || (len(ids) > 0 && got[0] != ids[0]) {
				t.Fatalf("OnNamespaceChange(%v), want %v", got, ids)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no OnNamespaceChange(%v)", ids)
		}
	}
	b, _ := NewMemBackend(1 << 20)
	if _, err := p.t.AddNamespace(testNQN, &Namespace{ID: 4, Backend: b}); err != nil {
		t.Fatal(err)
	}
	want(4)
	if l, err := h.ActiveNamespaces(ctx); err != nil || len(l) != 2 || l[1] != 4 {
		t.Fatalf("active namespaces %v, %v", l, err)
	}
	if err := os.Truncate(path, 2<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := p.t.RevalidateNamespace(testNQN, 1); err != nil {
		t.Fatal(err)
	}
	want(1) // the second notice: the host acknowledged the first (RAE clear)
	ns, err := h.Namespace(ctx, 1)
	if err != nil || ns.Size() != 2<<20 {
		t.Fatalf("namespace 1 after the resize: %v", err)
	}
}

// TestChangedNSLogReadAtomic: a namespace change that lands while the
// host reads log page 04h is either in the page it gets or left in the
// list for the next read (nvmet copies and clears the list under one
// lock). The read used to build the page and clear the list in two
// steps, so a change between them was cleared unreported.
func TestChangedNSLogReadAtomic(t *testing.T) {
	c := &tctrl{aec: aenNSAttr, sub: &Subsystem{NQN: testNQN}}
	const n = 20000
	seen := make([]bool, n+1)
	read := func() bool {
		out := make([]byte, maxChangedNS*4)
		g := nvme.GetLogPage{LID: nvme.LogChangedNS, NumD: maxChangedNS}
		if st, _, _ := c.logPage(g, out); st != 0 {
			t.Errorf("Get Log Page 04h: %v", st)
			return false
		}
		for i := 0; i < len(out); i += 4 {
			v := binary.LittleEndian.Uint32(out[i:])
			if v == 0 {
				break
			}
			if v == 0xffffffff {
				return true // more than the list holds: all changed
			}
			seen[v] = true
		}
		return false
	}
	// The writer waits for a read every 16 changes, so that the list
	// never overflows and both run at once.
	var reads atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for id := uint32(1); id <= n; id++ {
			c.nsChanged(id)
			if id%16 == 0 {
				for r := reads.Load(); reads.Load() == r; {
					runtime.Gosched()
				}
			}
		}
	}()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		if read() {
			t.Fatal("the Changed Namespace List overflowed")
		}
		reads.Add(1)
	}
	if read() {
		t.Fatal("the Changed Namespace List overflowed")
	}
	lost := 0
	for id := 1; id <= n; id++ {
		if !seen[id] {
			lost++
		}
	}
	if lost != 0 {
		t.Fatalf("%d of %d namespace changes never showed in log page 04h", lost, n)
	}
}

// TestHostNamespaceChangeAfterReconnect: a reconnect reports "changed,
// which not known" (OnNamespaceChange(nil)), as Linux's host rescans at
// every controller start (nvme_start_ctrl queues a scan): the new
// controller's Changed Namespace List starts empty, so a change made
// while the host was away would otherwise never be reported.
func TestHostNamespaceChangeAfterReconnect(t *testing.T) {
	p, _ := fileTarget(t)
	ctx := ctxT(t, 30*time.Second)
	changes := make(chan []uint32, 4)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1,
		OnNamespaceChange: func(ids []uint32) { changes <- ids }})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	waitFor(t, func() bool { return parkedAERs(p.t) == 1 }, "the host's AER parked")
	h.mu.Lock()
	a := h.cur
	h.mu.Unlock()
	a.fail()
	waitFor(t, func() bool { return h.Stats().Reconnects == 1 }, "host reconnected")
	select {
	case got := <-changes:
		if got != nil {
			t.Fatalf("OnNamespaceChange(%v) after the reconnect, want nil (rescan all)", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OnNamespaceChange after the reconnect: changes made while away are never reported")
	}
	// Events still arrive on the new association.
	waitFor(t, func() bool { return parkedAERs(p.t) == 1 }, "the host's AER parked again")
	b, _ := NewMemBackend(1 << 20)
	if _, err := p.t.AddNamespace(testNQN, &Namespace{ID: 6, Backend: b}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-changes:
		if len(got) != 1 || got[0] != 6 {
			t.Fatalf("OnNamespaceChange(%v), want [6]", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OnNamespaceChange([6])")
	}
}

// heldBackend is a MemBackend whose ReadAt, once armed, says it started
// and waits for release.
type heldBackend struct {
	*MemBackend
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (b *heldBackend) ReadAt(p []byte, off int64) (int, error) {
	if b.armed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.release
	}
	return b.MemBackend.ReadAt(p, off)
}

// TestRemoveNamespaceWaitsForRunningIO: RemoveNamespace returns only once
// the commands already running on the namespace's Backend have finished,
// as nvmet_ns_disable waits for its requests, so that the caller may
// close the Backend then (rocev2d nvmf-target closes the file at once).
// It used to return at once: the running Read then hit a closed file.
func TestRemoveNamespaceWaitsForRunningIO(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	mb, _ := NewMemBackend(1 << 20)
	b := &heldBackend{MemBackend: mb, entered: make(chan struct{}), release: make(chan struct{})}
	if _, err := p.t.AddNamespace(testNQN, &Namespace{ID: 2, Backend: b}); err != nil {
		t.Fatal(err)
	}
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.Namespace(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	b.armed.Store(true)
	readErr := make(chan error, 1)
	go func() {
		_, err := ns.ReadAtContext(ctx, make([]byte, 4096), 0)
		readErr <- err
	}()
	<-b.entered
	removed := make(chan error, 1)
	go func() {
		_, err := p.t.RemoveNamespace(testNQN, 2)
		removed <- err
	}()
	// Give RemoveNamespace the chance to return early (it must not).
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-removed:
		close(b.release)
		t.Fatalf("RemoveNamespace returned (%v) while a Read was running on the namespace", err)
	default:
	}
	close(b.release)
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if err := <-readErr; err != nil {
		t.Fatalf("the Read running when the namespace went: %v", err)
	}
}
