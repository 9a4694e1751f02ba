package transport

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// rangeSource is a QPNSource that gives fixed ranges, then fails.
type rangeSource struct {
	ranges [][2]uint32
	calls  int
}

var errNoMore = errors.New("no more ranges")

func (s *rangeSource) NextRange() (uint32, uint32, error) {
	if s.calls >= len(s.ranges) {
		return 0, 0, errNoMore
	}
	r := s.ranges[s.calls]
	s.calls++
	return r[0], r[1], nil
}

// sharedMem is an in-memory link that claims to be shared: its QPNs come
// from leases.
type sharedMem struct {
	udp.Link
	src  rangeSource
	tag  uint32
	svcs map[uint64]bool
}

func (s *sharedMem) Shared() bool                       { return true }
func (s *sharedMem) LeaseQPNs() (uint32, uint32, error) { return s.src.NextRange() }
func (s *sharedMem) CommIDTag() (uint32, uint32)        { return s.tag, 0xff000000 }
func (s *sharedMem) ClaimService(sid uint64) error      { s.svcs[sid] = true; return nil }
func (s *sharedMem) ReleaseService(sid uint64)          { delete(s.svcs, sid) }
func (s *sharedMem) VolunteerRejector() error           { return nil }

// TestQPNSource: a device hands out QPNs only from its source's ranges,
// asks for the next range when one is used up, and fails CreateQP with
// the source's error when there is none; QPNs of destroyed QPs are reused
// within the ranges. On a shared link the ranges are the link's leases.
func TestQPNSource(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared bool
	}{{"DeviceConfig.QPNs", false}, {"shared link", true}} {
		t.Run(tc.name, func(t *testing.T) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			l, err := n.Link(netip.MustParseAddr("192.0.2.1"))
			if err != nil {
				t.Fatal(err)
			}
			src := rangeSource{ranges: [][2]uint32{{0x5000, 3}, {0x9000, 2}}}
			cfg := DeviceConfig{}
			var link udp.Link = l
			if tc.shared {
				link = &sharedMem{Link: l, src: src, tag: 0x85000000, svcs: map[uint64]bool{}}
			} else {
				cfg.QPNs = &src
			}
			dev, err := NewDevice(link, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			if dev.Shared() != tc.shared {
				t.Errorf("Shared() = %v", dev.Shared())
			}
			if tag, _ := dev.CommIDTag(); tc.shared && tag != 0x85000000 {
				t.Errorf("CommIDTag = %#x", tag)
			}
			pd, _ := dev.AllocPD()
			cq, _ := dev.CreateCQ(16)
			create := func() (*QP, error) {
				return dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
			}
			var qps []*QP
			for range 5 {
				qp, err := create()
				if err != nil {
					t.Fatal(err)
				}
				qps = append(qps, qp)
			}
			want := []uint32{0x5000, 0x5001, 0x5002, 0x9000, 0x9001}
			if tc.shared {
				// A shared link's range starts at a random QPN of
				// it and wraps: the same QPNs, rotated in each range.
				want = []uint32{qps[0].QPN(), 0x5000 + (qps[0].QPN()-0x5000+1)%3, 0x5000 + (qps[0].QPN()-0x5000+2)%3,
					qps[3].QPN(), 0x9000 + (qps[3].QPN()-0x9000+1)%2}
				if qps[0].QPN()-0x5000 >= 3 || qps[3].QPN()-0x9000 >= 2 {
					t.Errorf("first QPNs %#x and %#x outside their ranges", qps[0].QPN(), qps[3].QPN())
				}
			}
			for i, qp := range qps {
				if qp.QPN() != want[i] {
					t.Errorf("QP %d: QPN %#x, want %#x", i, qp.QPN(), want[i])
				}
			}
			if _, err := create(); !errors.Is(err, errNoMore) {
				t.Errorf("sixth QP: %v, want the source's error", err)
			}
			freed := qps[1].QPN()
			if err := qps[1].Destroy(); err != nil {
				t.Fatal(err)
			}
			qp, err := create()
			if err != nil {
				t.Fatal(err)
			}
			if qp.QPN() != freed {
				t.Errorf("after a Destroy: QPN %#x, want the freed %#x", qp.QPN(), freed)
			}
			if r := dev.QPNRanges(); len(r) != 2 || r[0] != [2]uint32{0x5000, 0x5002} || r[1] != [2]uint32{0x9000, 0x9001} {
				t.Errorf("QPNRanges = %#x", r)
			}
		})
	}
}

// wrapper hides a link's methods but udp.Link's, as a tap does.
type wrapper struct{ udp.Link }

func (w wrapper) Unwrap() udp.Link { return w.Link }

// TestQPNSourceThroughWrapper: a device on a wrapper of a shared link
// takes its QPNs from the link's leases (Unwrap).
func TestQPNSourceThroughWrapper(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	l, err := n.Link(netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	sl := &sharedMem{Link: l, src: rangeSource{ranges: [][2]uint32{{0x7000, 8}}}, svcs: map[uint64]bool{}}
	dev, err := NewDevice(wrapper{sl}, DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(4)
	qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !dev.Shared() || qp.QPN() < 0x7000 || qp.QPN() >= 0x7008 {
		t.Errorf("Shared %v, QPN %#x; want true, in [0x7000, 0x7008)", dev.Shared(), qp.QPN())
	}
	// FirstQPN cannot number a shared link's QPs: an error, not ignored.
	if _, err := NewDevice(wrapper{sl}, DeviceConfig{FirstQPN: 0x11}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "FirstQPN 0x11") {
		t.Errorf("FirstQPN on a shared link: %v", err)
	}
}

// TestSharedQPNsRandom: devices on a shared link given the same range
// (a process restarted after its TimeWait) do not number their first QP
// alike every time.
func TestSharedQPNsRandom(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	l, err := n.Link(netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for range 16 {
		sl := &sharedMem{Link: l, src: rangeSource{ranges: [][2]uint32{{0x7000, 4096}}}, svcs: map[uint64]bool{}}
		dev, err := NewDevice(sl, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(4)
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		seen[qp.QPN()] = true
		dev.Close()
	}
	if len(seen) < 8 {
		t.Fatalf("16 devices numbered their first QP with %d QPNs: %v", len(seen), seen)
	}
}

// TestQPNNotReusedSoon: on a shared link (4096-QPN leases) a device went
// round its lease again at once, so a QPN came back every 4096 QPs created
// while a dead connection's late packets could still reach it (longev25
// F3). A round through the ranges that ends within qpnReuseMin takes
// another range first (up to qpnMaxRanges); after qpnReuseMin, or with no
// range left to take, the QPNs of the ranges held are used again.
func TestQPNNotReusedSoon(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	l, err := n.Link(netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 16
	var ranges [][2]uint32
	for i := range 2 * qpnMaxRanges {
		ranges = append(ranges, [2]uint32{uint32(0x10000 + 0x1000*i), size})
	}
	link := &sharedMem{Link: l, src: rangeSource{ranges: ranges}, svcs: map[uint64]bool{}}
	clk := NewManualClock(time.Unix(1e9, 0))
	dev, err := NewDevice(link, DeviceConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	churn := func(k int) []uint32 {
		var out []uint32
		for range k {
			qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, qp.QPN())
			qp.Destroy()
		}
		return out
	}
	seen := map[uint32]int{}
	for i, q := range churn(qpnMaxRanges * size) {
		if j, dup := seen[q]; dup {
			t.Fatalf("QP %d got QPN %#x again (QP %d had it) within %v, with ranges left to take", i, q, j, qpnReuseMin)
		}
		seen[q] = i
	}
	if r := dev.QPNRanges(); len(r) != qpnMaxRanges {
		t.Fatalf("%d ranges taken, want %d", len(r), qpnMaxRanges)
	}
	// At qpnMaxRanges: the held ranges go round again.
	for _, q := range churn(size) {
		if _, ok := seen[q]; !ok {
			t.Fatalf("QPN %#x outside the held ranges after %d were taken", q, qpnMaxRanges)
		}
	}
	if r := dev.QPNRanges(); len(r) != qpnMaxRanges {
		t.Fatalf("%d ranges after the limit, want %d", len(r), qpnMaxRanges)
	}
}

// TestQPNReusedAfterMinimum: a device whose round through its range took
// longer than qpnReuseMin goes round it again rather than taking another.
func TestQPNReusedAfterMinimum(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	l, err := n.Link(netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	link := &sharedMem{Link: l, src: rangeSource{ranges: [][2]uint32{{0x10000, 4}, {0x20000, 4}}}, svcs: map[uint64]bool{}}
	clk := NewManualClock(time.Unix(1e9, 0))
	dev, err := NewDevice(link, DeviceConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	for i := range 12 {
		if i%2 == 1 {
			clk.Advance(qpnReuseMin / 2)
		}
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		if qp.QPN()>>16 != 1 {
			t.Fatalf("QP %d: QPN %#x outside the first range", i, qp.QPN())
		}
		qp.Destroy()
	}
	if r := dev.QPNRanges(); len(r) != 1 {
		t.Fatalf("%d ranges taken, want 1", len(r))
	}
}
