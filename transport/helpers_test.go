package transport

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

var (
	addrA = netip.MustParseAddr("192.0.2.1")
	addrB = netip.MustParseAddr("192.0.2.2")
)

// side is one end of a test connection.
type side struct {
	dev *Device
	pd  *memreg.PD
	scq *CQ
	rcq *CQ
	qp  *QP
}

type pairOpts struct {
	faults   memnet.Faults
	mtu      MTU
	timeout  uint8
	retry    uint8
	rnrRetry uint8
	minRNR   uint8
	clock    Clock
	sqDepth  int
	rqDepth  int
	cqDepth  int
	maxRd    uint8
	access   memreg.Access
	window   int
	small    int // DeviceConfig.MaxUnackedSmallPSNs
	perAck   int // DeviceConfig.MaxPktsPerAck
	cc       CongestionConfig
	sr       bool     // selective repeat on both QPs
	srCfg    SRConfig // DeviceConfig.SelectiveRepeat
}

func (o *pairOpts) defaults() {
	if o.mtu == 0 {
		o.mtu = MTU1024
	}
	if o.timeout == 0 {
		o.timeout = 14
	}
	if o.sqDepth == 0 {
		o.sqDepth = 256
	}
	if o.rqDepth == 0 {
		o.rqDepth = 256
	}
	if o.cqDepth == 0 {
		o.cqDepth = 4096
	}
	if o.maxRd == 0 {
		o.maxRd = 16
	}
	if o.access == 0 {
		o.access = memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic
	}
}

func newSide(t testing.TB, n *memnet.MemNetwork, addr netip.Addr, o *pairOpts) *side {
	t.Helper()
	l, err := n.Link(addr)
	if err != nil {
		t.Fatal(err)
	}
	return newSideOn(t, l, o)
}

// newSideOn is a device on link l with one RC QP (not connected) and its
// two CQs, as o says; the device is closed when the test ends.
func newSideOn(t testing.TB, l udp.Link, o *pairOpts) *side {
	t.Helper()
	dev, err := NewDevice(l, DeviceConfig{Clock: o.clock, MaxUnackedPSNs: o.window, MaxUnackedSmallPSNs: o.small, MaxPktsPerAck: o.perAck, Congestion: o.cc, SelectiveRepeat: o.srCfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := dev.CreateCQ(o.cqDepth)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := dev.CreateCQ(o.cqDepth)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: rcq,
		MaxSendWR: o.sqDepth, MaxRecvWR: o.rqDepth, MaxSGE: 4})
	if err != nil {
		t.Fatal(err)
	}
	return &side{dev: dev, pd: pd, scq: scq, rcq: rcq, qp: qp}
}

// connect takes qp through RESET -> INIT -> RTR -> RTS towards the peer.
func connect(t testing.TB, s *side, peer *side, peerAddr netip.Addr, sq, rq uint32, o *pairOpts) {
	t.Helper()
	err := s.qp.Connect(ConnParams{Peer: peerAddr, DestQPN: peer.qp.QPN(), RQPSN: rq, SQPSN: sq, PathMTU: o.mtu,
		Access: o.access, MaxRdAtomic: o.maxRd, MaxDestRdAtomic: o.maxRd,
		Retry: &Retry{Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnrRetry, MinRNRTimer: o.minRNR}, SelectiveRepeat: o.sr})
	if err != nil {
		t.Fatal(err)
	}
}

// newPair returns two connected sides on a fresh MemNetwork. PSNs start
// near the 24-bit wrap to exercise modular arithmetic.
func newPair(t testing.TB, o pairOpts) (a, b *side, n *memnet.MemNetwork) {
	t.Helper()
	o.defaults()
	n = memnet.NewMemNetwork(o.faults)
	a = newSide(t, n, addrA, &o)
	b = newSide(t, n, addrB, &o)
	psnA, psnB := uint32(0xfffff0), uint32(0x123456)
	connect(t, a, b, addrB, psnA, psnB, &o)
	connect(t, b, a, addrA, psnB, psnA, &o)
	return a, b, n
}

// buffer registers a fresh buffer of n bytes (at least 1) with access acc.
func (s *side) buffer(t testing.TB, n int, acc memreg.Access) ([]byte, *memreg.MR) {
	t.Helper()
	buf := make([]byte, max(n, 1))
	mr, err := s.pd.RegisterMR(buf, acc|memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return buf, mr
}

func sge(mr *memreg.MR, off, n int) []memreg.SGE {
	if n == 0 {
		return nil
	}
	return []memreg.SGE{{Addr: mr.IOVA() + uint64(off), Length: uint32(n), LKey: mr.LKey()}}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// waitWC waits for n completions on cq.
func waitWC(t testing.TB, cq *CQ, n int, d time.Duration) []WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out := make([]WC, 0, n)
	buf := make([]WC, 64)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("waiting for %d completions, got %d (%+v): %v", n, len(out), out, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// noWC asserts cq holds no completion.
func noWC(t testing.TB, cq *CQ) {
	t.Helper()
	var wc [1]WC
	if cq.Poll(wc[:]) != 0 {
		t.Fatalf("unexpected completion %+v", wc[0])
	}
}

// memLinks returns the links of addrA and addrB on a new in-memory
// network with faults f.
func memLinks(t testing.TB, f memnet.Faults) (la, lb udp.Link) {
	t.Helper()
	n := memnet.NewMemNetwork(f)
	la, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	if lb, err = n.Link(addrB); err != nil {
		t.Fatal(err)
	}
	return la, lb
}
