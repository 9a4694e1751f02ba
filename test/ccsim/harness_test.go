package ccsim

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// trackClock is a transport.Clock over a ManualClock that also knows its
// earliest pending deadline, so the harness can advance straight to the
// next timer (ManualClock does not expose it).
type trackClock struct {
	mc      *transport.ManualClock
	mu      sync.Mutex
	pending map[*trackTimer]struct{}
}

type trackTimer struct {
	c     *trackClock
	when  time.Time
	inner transport.Timer
}

func newTrackClock(start time.Time) *trackClock {
	return &trackClock{mc: transport.NewManualClock(start), pending: make(map[*trackTimer]struct{})}
}

func (c *trackClock) Now() time.Time { return c.mc.Now() }

func (c *trackClock) AfterFunc(d time.Duration, f func()) transport.Timer {
	t := &trackTimer{c: c}
	c.mu.Lock()
	t.when = c.mc.Now().Add(d)
	c.pending[t] = struct{}{}
	c.mu.Unlock()
	t.inner = c.mc.AfterFunc(d, func() {
		c.mu.Lock()
		delete(c.pending, t)
		c.mu.Unlock()
		f()
	})
	return t
}

func (t *trackTimer) Stop() bool {
	t.c.mu.Lock()
	delete(t.c.pending, t)
	t.c.mu.Unlock()
	return t.inner.Stop()
}

func (t *trackTimer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	t.when = c.mc.Now().Add(d)
	c.pending[t] = struct{}{}
	c.mu.Unlock()
	return t.inner.Reset(d)
}

// next returns the earliest pending deadline.
func (c *trackClock) next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best time.Time
	ok := false
	for t := range c.pending {
		if !ok || t.when.Before(best) {
			best, ok = t.when, true
		}
	}
	return best, ok
}

// scenario is one simulated run: N flows into one bottleneck.
type scenario struct {
	N        int
	DCQCN    bool // false: Congestion.DCQCN.Disable
	Seed     int64
	Duration time.Duration // virtual time
	Sample   time.Duration // goodput and queue sampling interval

	Switch   memnet.Bottleneck // the port toward the receiver
	LineRate float64           // each sender NIC's line rate (its link is shaped to it; DCQCN's LineRate)
	Delay    time.Duration     // one-way propagation delay of every hop
	RP       dcqcn.Config      // the reaction point's knobs (LineRate is set from LineRate)
	CNP      time.Duration     // NP's CNP interval; 0 = the default 50 µs

	MsgSize int // bytes per WRITE
	Depth   int // WRITEs outstanding per QP
}

// result is what a run measured.
type result struct {
	sc       scenario
	flow     [][]int64          // bytes completed per flow per sample interval
	depth    []int              // queue depth at the end of each interval
	port     []memnet.PortStats // switch port snapshots at each interval end (index i = end of interval i)
	start    memnet.PortStats   // ... and at the start
	cc       [][]float64        // RP rate per flow at each interval end
	counters []transport.Counters
	senders  []transport.Counters
	steps    int
	hash     uint64  // of the full per-flow byte timeline with completion times
	dead     []error // per flow: the first failed completion (the QP is in ERR and sends no more)
}

// flowPair is one flow: a sender device and its QP, the receiver's QP.
type flowPair struct {
	dev  *transport.Device
	link *memnet.MemLink
	qp   *transport.QP
	cq   *transport.CQ
	mr   *memreg.MR
	rmr  *memreg.MR
	out  int // WRITEs outstanding
	err  error
}

var simStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// run simulates sc and returns what it measured.
func run(tb testing.TB, sc scenario) *result {
	tb.Helper()
	clk := newTrackClock(simStart)
	net := memnet.NewVirtualMemNetwork(memnet.Faults{Seed: sc.Seed, Delay: sc.Delay}, clk.Now)
	rcvAddr := netip.MustParseAddr("192.0.2.1")
	port, err := net.Bottleneck(rcvAddr, sc.Switch)
	if err != nil {
		tb.Fatal(err)
	}
	cc := transport.CongestionConfig{CNPInterval: sc.CNP, DCQCN: sc.RP}
	cc.DCQCN.LineRate = sc.LineRate
	cc.DCQCN.Disable = !sc.DCQCN
	devCfg := transport.DeviceConfig{Clock: clk, Congestion: cc}

	rlink, err := net.Link(rcvAddr)
	if err != nil {
		tb.Fatal(err)
	}
	rdev, err := transport.NewDevice(rlink, devCfg)
	if err != nil {
		tb.Fatal(err)
	}
	defer rdev.Close()
	rpd, err := rdev.AllocPD()
	if err != nil {
		tb.Fatal(err)
	}
	rcq, err := rdev.CreateCQ(4 * sc.N)
	if err != nil {
		tb.Fatal(err)
	}
	retry := transport.Retry{Timeout: 12, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}
	all := memreg.AccessRemoteWrite | memreg.AccessLocalWrite
	flows := make([]*flowPair, sc.N)
	for i := range flows {
		addr := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
		l, err := net.Link(addr)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := l.Shape(memnet.Bottleneck{Rate: sc.LineRate}); err != nil {
			tb.Fatal(err)
		}
		dev, err := transport.NewDevice(l, devCfg)
		if err != nil {
			tb.Fatal(err)
		}
		defer dev.Close()
		pd, err := dev.AllocPD()
		if err != nil {
			tb.Fatal(err)
		}
		cq, err := dev.CreateCQ(2 * sc.Depth)
		if err != nil {
			tb.Fatal(err)
		}
		qp, err := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq,
			MaxSendWR: sc.Depth, MaxRecvWR: 1})
		if err != nil {
			tb.Fatal(err)
		}
		rqp, err := rdev.CreateQP(rpd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: rcq, RecvCQ: rcq,
			MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			tb.Fatal(err)
		}
		src := make([]byte, sc.MsgSize)
		for j := range src {
			src[j] = byte(i + j)
		}
		mr, err := pd.RegisterMR(src, 0)
		if err != nil {
			tb.Fatal(err)
		}
		rmr, err := rpd.RegisterMR(make([]byte, sc.MsgSize), all)
		if err != nil {
			tb.Fatal(err)
		}
		psn := uint32(1000 * (i + 1))
		if err := qp.Connect(transport.ConnParams{Peer: rcvAddr, DestQPN: rqp.QPN(), SQPSN: psn, RQPSN: psn + 500,
			PathMTU: transport.MTU4096, Retry: &retry}); err != nil {
			tb.Fatal(err)
		}
		if err := rqp.Connect(transport.ConnParams{Peer: addr, DestQPN: qp.QPN(), SQPSN: psn + 500, RQPSN: psn,
			PathMTU: transport.MTU4096, Retry: &retry, Access: all}); err != nil {
			tb.Fatal(err)
		}
		flows[i] = &flowPair{dev: dev, link: l, qp: qp, cq: cq, mr: mr, rmr: rmr}
	}

	samples := int(sc.Duration / sc.Sample)
	res := &result{sc: sc, flow: make([][]int64, sc.N), cc: make([][]float64, sc.N), dead: make([]error, sc.N)}
	for i := range res.flow {
		res.flow[i] = make([]int64, samples)
		res.cc[i] = make([]float64, samples)
	}
	res.start = port.Stats()
	h := fnv.New64a()
	end := simStart.Add(time.Duration(samples) * sc.Sample)
	nextSample := simStart.Add(sc.Sample)
	wcs := make([]transport.WC, 2*sc.Depth)
	var rwcs [16]transport.WC
	wr := transport.SendWR{Opcode: transport.WRWrite, Flags: transport.SendSignaled}
	for {
		if err := net.Step(); err != nil {
			tb.Fatal(err)
		}
		res.steps++
		now := clk.Now()
		slot := int(now.Sub(simStart) / sc.Sample)
		for i, f := range flows {
			for {
				k := f.cq.Poll(wcs)
				for _, wc := range wcs[:k] {
					if err := wc.Err(); err != nil && f.err == nil {
						f.err = fmt.Errorf("flow %d at %v: %w", i, now.Sub(simStart), err)
						res.dead[i] = f.err
					}
					f.out--
					if wc.Status == transport.WCSuccess && slot < samples {
						res.flow[i][slot] += int64(sc.MsgSize)
						fmt.Fprintf(h, "%d %d\n", i, now.Sub(simStart))
					}
				}
				if k < len(wcs) {
					break
				}
			}
			for f.out < sc.Depth && f.err == nil {
				wr.SGEs = []memreg.SGE{f.mr.SGE(0, uint32(sc.MsgSize))}
				wr.RemoteAddr, wr.RKey = f.rmr.IOVA(), f.rmr.RKey()
				if err := f.qp.PostSend(wr); err != nil {
					tb.Fatalf("flow %d: PostSend: %v", i, err)
				}
				f.out++
			}
		}
		for rcq.Poll(rwcs[:]) > 0 {
		}
		if !now.Before(nextSample) {
			st := port.Stats()
			res.port = append(res.port, st)
			res.depth = append(res.depth, st.Depth)
			s := len(res.port) - 1
			for i, f := range flows {
				res.cc[i][s] = f.qp.Congestion().Rate
			}
			nextSample = nextSample.Add(sc.Sample)
		}
		if !now.Before(end) {
			break
		}
		next := nextSample
		if t, ok := net.NextEvent(); ok && t.Before(next) {
			next = t
		}
		if t, ok := clk.next(); ok && t.Before(next) {
			next = t
		}
		if next.Before(now) {
			next = now
		}
		clk.mc.Advance(next.Sub(now))
	}
	res.hash = h.Sum64()
	res.counters = []transport.Counters{rdev.Counters()}
	for _, f := range flows {
		res.senders = append(res.senders, f.dev.Counters())
	}
	return res
}

// lastHalf returns the index of the first sample interval of the run's
// last half.
func (r *result) lastHalf() int { return len(r.port) / 2 }

// goodput returns the aggregate goodput of the last half as a fraction
// of the bottleneck rate, counting IP datagram bytes the way the port
// does: message bytes plus the headers of its packets.
func (r *result) goodput() float64 {
	var bytes int64
	from := r.lastHalf()
	for _, f := range r.flow {
		for _, b := range f[from:len(r.port)] {
			bytes += b
		}
	}
	secs := float64(len(r.port)-from) * r.sc.Sample.Seconds()
	return float64(bytes) * 8 / secs / r.sc.Switch.Rate
}

// wireFactor is how many IP datagram bytes carry one byte of a WRITE of
// the scenario's message size at MTU 4096: BTH (12), RETH (16) on the
// first packet, ICRC (4), UDP (8) and IPv4 (20) per packet.
func (r *result) wireFactor() float64 {
	pkts := (r.sc.MsgSize + 4095) / 4096
	return float64(r.sc.MsgSize+pkts*(12+4+8+20)+16) / float64(r.sc.MsgSize)
}

// jain returns Jain's fairness index of the flows' goodput over the last half.
func (r *result) jain() float64 {
	from := r.lastHalf()
	var sum, sq float64
	for _, f := range r.flow {
		var x float64
		for _, b := range f[from:len(r.port)] {
			x += float64(b)
		}
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(r.flow)) * sq)
}

// drops returns the tail drops over the whole run and over the last half.
func (r *result) drops() (all, late uint64) {
	last := r.port[len(r.port)-1]
	return last.Dropped - r.start.Dropped, last.Dropped - r.port[r.lastHalf()-1].Dropped
}

// lastDrop returns the end of the last sample interval with a tail drop
// (0 if none): after it the run kept every packet.
func (r *result) lastDrop() time.Duration {
	prev := r.start
	var last time.Duration
	for k, st := range r.port {
		if st.Dropped != prev.Dropped {
			last = time.Duration(k+1) * r.sc.Sample
		}
		prev = st
	}
	return last
}

// meanQueue returns the time-averaged queue depth over the last half, bytes.
func (r *result) meanQueue() float64 {
	return memnet.MeanDepth(r.port[r.lastHalf()-1], r.port[len(r.port)-1])
}

// marks returns the CE marks over the whole run.
func (r *result) marks() uint64 { return r.port[len(r.port)-1].Marked - r.start.Marked }

func (r *result) String() string {
	all, late := r.drops()
	mode := "DCQCN"
	if !r.sc.DCQCN {
		mode = "no CC"
	}
	return fmt.Sprintf("N=%d %s seed %d: goodput %.3f of bottleneck (×%.3f on the wire), Jain %.4f, drops %d (last half %d, last at %v), marks %d, mean queue %.0f B (Kmax %d), max %d, cnp_sent %d, flows failed %d, steps %d",
		r.sc.N, mode, r.sc.Seed, r.goodput(), r.wireFactor(), r.jain(), all, late, r.lastDrop(), r.marks(), r.meanQueue(), r.sc.Switch.Kmax,
		r.port[len(r.port)-1].MaxDepth, r.counters[0].NPCNPSent, r.failed(), r.steps)
}

// failed returns how many flows' QPs failed (retry counter exceeded).
func (r *result) failed() int {
	k := 0
	for _, e := range r.dead {
		if e != nil {
			k++
		}
	}
	return k
}

// csv returns the run's timeline as CSV: per sample interval its end
// (ms), the queue depth at its end (bytes), the marks and drops in it, and
// per flow the goodput (Gb/s) and the reaction point's rate at its end
// (Gb/s).
func (r *result) csv() string {
	var sb strings.Builder
	sb.WriteString("ms,queue_bytes,marks,drops")
	for i := range r.flow {
		fmt.Fprintf(&sb, ",flow%d_goodput_gbps,flow%d_rate_gbps", i, i)
	}
	sb.WriteString("\n")
	prev := r.start
	for k, st := range r.port {
		fmt.Fprintf(&sb, "%d,%d,%d,%d", (k+1)*int(r.sc.Sample/time.Millisecond), st.Depth, st.Marked-prev.Marked, st.Dropped-prev.Dropped)
		for i := range r.flow {
			fmt.Fprintf(&sb, ",%.4f,%.4f", float64(r.flow[i][k])*8/r.sc.Sample.Seconds()/1e9, r.cc[i][k]/1e9)
		}
		sb.WriteString("\n")
		prev = st
	}
	return sb.String()
}

// timeline formats the per-flow goodput (Gb/s) and queue per interval.
func (r *result) timeline(every int) string {
	s := ""
	for k := 0; k < len(r.port); k += every {
		s += fmt.Sprintf("%4d ms q %7d:", k*int(r.sc.Sample/time.Millisecond), r.depth[k])
		for i := range r.flow {
			s += fmt.Sprintf(" %5.2f/%5.2f", float64(r.flow[i][k])*8/r.sc.Sample.Seconds()/1e9, r.cc[i][k]/1e9)
		}
		s += "\n"
	}
	return s
}
