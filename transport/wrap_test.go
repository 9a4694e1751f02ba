package transport

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// skipPSNs moves a connected, idle pair (a requests, b responds) on by n
// PSNs, as if n single-packet SENDs had been sent and acknowledged: the
// requester's next PSN, its highest PSN and the completer's oldest PSN,
// the responder's expected PSN and its MSN. It stands in for the weeks of
// traffic it takes to go round the 24-bit PSN space.
func skipPSNs(t *testing.T, a, b *side, n int) {
	t.Helper()
	a.qp.mu.Lock()
	if a.qp.sqEnd != a.qp.sqHead {
		a.qp.mu.Unlock()
		t.Fatal("skipPSNs: the requester has WRs outstanding")
	}
	a.qp.req.psn = a.qp.req.psn.Add(n)
	a.qp.req.maxPSN = a.qp.req.maxPSN.Add(n)
	a.qp.comp.psn = a.qp.comp.psn.Add(n)
	a.qp.srResetReq(a.qp.req.psn) // selective repeat's bitmaps start at the new PSN, as at RTS
	a.qp.mu.Unlock()
	b.qp.mu.Lock()
	b.qp.resp.psn = b.qp.resp.psn.Add(n)
	b.qp.resp.msn = (b.qp.resp.msn + uint32(n)) & 0xffffff
	b.qp.mu.Unlock()
}

// TestAtomicReplayAfterPSNWrap: a FetchAdd at PSN X, then 2^24-1 PSNs of
// other traffic (skipPSNs), then a second FetchAdd at the same PSN X whose
// atomic ACK is lost. The retry is a duplicate and must be answered with
// the second FetchAdd's original value (1), not the first's (0), which
// was still saved in another responder resource: findRes returned the
// first resource covering the PSN, so the requester completed with the
// stale value, silently.
func TestAtomicReplayAfterPSNWrap(t *testing.T) {
	for _, sr := range []bool{false, true} {
		t.Run(map[bool]string{false: "gbn", true: "sr"}[sr], func(t *testing.T) { testAtomicReplayAfterWrap(t, sr) })
	}
}

func testAtomicReplayAfterWrap(t *testing.T, sr bool) {
	const x = 0xfffffe
	a, b, _, lb := linkPair(t, pairOpts{retry: 7, sr: sr}, x, 0x10)
	res, smr := a.buffer(t, 16, 0)
	target, tmr := b.buffer(t, 8, memreg.AccessRemoteAtomic)
	fetchAdd := func(id uint64) {
		t.Helper()
		if err := a.qp.PostSend(SendWR{WRID: id, Opcode: WRFetchAdd, Flags: SendSignaled, SGEs: sge(smr, int(8*id), 8),
			RemoteAddr: tmr.IOVA(), RKey: tmr.RKey(), CompareAdd: 1}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.scq, 1, 10*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != id {
			t.Fatalf("fetch-add %d: %+v", id, wc)
		}
	}
	fetchAdd(0)
	skipPSNs(t, a, b, 1<<24-1)
	if got := a.qp.req.nextPSN(); got != x {
		t.Fatalf("next PSN %v after the skip, want %#x", got, x)
	}
	lost := false
	lb.mu.Lock()
	lb.drop = func(p *packet.Packet) bool {
		if !lost && p.BTH.Opcode() == bth.RCAtomicAck && p.BTH.PSN() == x {
			lost = true
			return true
		}
		return false
	}
	lb.mu.Unlock()
	fetchAdd(1)
	if !lost {
		t.Fatal("the second atomic ACK was not seen")
	}
	if got := nativeGet(target); got != 2 {
		t.Fatalf("target %d after two fetch-adds, want 2 (executed once each)", got)
	}
	if got0, got1 := nativeGet(res[0:8]), nativeGet(res[8:16]); got0 != 0 || got1 != 1 {
		t.Fatalf("fetch-add results %d, %d; want 0, 1 (the retry was answered from the resource of the atomic 2^24 PSNs before)", got0, got1)
	}
	if c := b.dev.Counters(); c.DuplicateRequest == 0 {
		t.Fatal("the retried atomic was not a duplicate at the responder")
	}
}

// TestReadReplayAfterPSNWrap: as TestAtomicReplayAfterPSNWrap with READs
// of different regions: the retried second READ found the first READ's
// resource (same PSN, other address) first, was dropped as not matching
// it, and the QP failed with retry exhaustion.
func TestReadReplayAfterPSNWrap(t *testing.T) {
	for _, sr := range []bool{false, true} {
		t.Run(map[bool]string{false: "gbn", true: "sr"}[sr], func(t *testing.T) { testReadReplayAfterWrap(t, sr) })
	}
}

func testReadReplayAfterWrap(t *testing.T, sr bool) {
	const x = 0xfffffe
	a, b, _, lb := linkPair(t, pairOpts{retry: 7, sr: sr}, x, 0x10)
	dst, smr := a.buffer(t, 128, 0)
	src, rmr := b.buffer(t, 128, memreg.AccessRemoteRead)
	fill(src, 3)
	read := func(id uint64) {
		t.Helper()
		if err := a.qp.PostSend(SendWR{WRID: id, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, int(64*id), 64),
			RemoteAddr: rmr.IOVA() + 64*id, RKey: rmr.RKey()}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.scq, 1, 10*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != id {
			t.Fatalf("READ %d: %+v", id, wc)
		}
	}
	read(0)
	skipPSNs(t, a, b, 1<<24-1)
	lost := false
	lb.mu.Lock()
	lb.drop = func(p *packet.Packet) bool {
		if !lost && p.BTH.Opcode() == bth.RCReadResponseOnly && p.BTH.PSN() == x {
			lost = true
			return true
		}
		return false
	}
	lb.mu.Unlock()
	read(1)
	if !lost {
		t.Fatal("the second READ's response was not seen")
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("READ data differ")
	}
}

// TestQPNNeverMulticast: QPN 0xffffff is the multicast QPN (IBTA; Linux's
// IB_MULTICAST_QPN) and is never handed out: the default allocator goes
// from 0xfffffe to 0x11, FirstQPN 0xffffff is refused, and a range of a
// QPNSource or a shared link's lease ending at the top of the space stops
// at 0xfffffe. 0 and 1 are never handed out either.
func TestQPNNeverMulticast(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	newDev := func(t *testing.T, link udp.Link, cfg DeviceConfig) (*Device, func() (*QP, error)) {
		t.Helper()
		dev, err := NewDevice(link, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(16)
		return dev, func() (*QP, error) {
			return dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
		}
	}
	qpns := func(t *testing.T, create func() (*QP, error), k int) []uint32 {
		t.Helper()
		var out []uint32
		for range k {
			qp, err := create()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, qp.QPN())
		}
		return out
	}
	t.Run("default", func(t *testing.T) {
		l, err := n.Link(netip.MustParseAddr("192.0.2.31"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewDevice(l, DeviceConfig{FirstQPN: 0xffffff}); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("FirstQPN 0xffffff: %v, want ErrInvalidConfig", err)
		}
		_, create := newDev(t, l, DeviceConfig{FirstQPN: 0xfffffd})
		if got, want := qpns(t, create, 3), []uint32{0xfffffd, 0xfffffe, 0x11}; !slices.Equal(got, want) {
			t.Fatalf("QPNs %#x, want %#x", got, want)
		}
	})
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "QPNSource", true: "shared link"}[shared], func(t *testing.T) {
			addr := map[bool]string{false: "192.0.2.32", true: "192.0.2.33"}[shared]
			l, err := n.Link(netip.MustParseAddr(addr))
			if err != nil {
				t.Fatal(err)
			}
			src := rangeSource{ranges: [][2]uint32{{0xfffffd, 3}, {0x5000, 1}}}
			cfg := DeviceConfig{}
			var link udp.Link = l
			if shared {
				link = &sharedMem{Link: l, src: src, tag: 0x85000000, svcs: map[uint64]bool{}}
			} else {
				cfg.QPNs = &src
			}
			dev, create := newDev(t, link, cfg)
			got := qpns(t, create, 3)
			slices.Sort(got)
			if want := []uint32{0x5000, 0xfffffd, 0xfffffe}; !slices.Equal(got, want) {
				t.Fatalf("QPNs %#x, want %#x", got, want)
			}
			if r := dev.QPNRanges(); len(r) != 2 || r[0] != [2]uint32{0xfffffd, 0xfffffe} {
				t.Fatalf("QPNRanges = %#x", r)
			}
		})
	}
}
