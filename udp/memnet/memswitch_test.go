package memnet

import (
	"errors"
	"fmt"
	"github.com/gorocev2/rocev2/udp"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMarkProbability(t *testing.T) {
	b := Bottleneck{Rate: 1e9, Kmin: 1000, Kmax: 3000, Pmax: 0.2}
	tests := []struct {
		depth int
		want  float64
	}{
		{0, 0}, {999, 0}, {1000, 0}, {1500, 0.05}, {2000, 0.1}, {3000, 0.2}, {3001, 1}, {1 << 30, 1},
	}
	for _, tc := range tests {
		if got := b.MarkProbability(tc.depth); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("MarkProbability(%d) = %v, want %v", tc.depth, got, tc.want)
		}
	}
	if got := (Bottleneck{Rate: 1e9}).MarkProbability(1 << 20); got != 0 {
		t.Errorf("marking off: MarkProbability = %v, want 0", got)
	}
	if got := (Bottleneck{Rate: 1e9, Kmin: 10, Kmax: 10, Pmax: 0.5}).MarkProbability(10); got != 0 {
		t.Errorf("Kmin == Kmax, at Kmin: %v, want 0", got)
	}
}

func TestBottleneckConfigErrors(t *testing.T) {
	n := NewMemNetwork(Faults{})
	bad := []Bottleneck{
		{},
		{Rate: math.Inf(1)},
		{Rate: 1e9, Buffer: -1},
		{Rate: 1e9, Kmin: 10, Kmax: 5},
		{Rate: 1e9, Kmax: 5, Pmax: 1.5},
		{Rate: 1e9, Kmax: 5, Pmax: math.NaN()},
	}
	for _, b := range bad {
		if _, err := n.Bottleneck(addrB, b); err == nil {
			t.Errorf("Bottleneck(%+v) accepted", b)
		}
	}
	if _, err := n.Bottleneck(netip.Addr{}, Bottleneck{Rate: 1e9}); !errors.Is(err, udp.ErrAddress) {
		t.Errorf("zero address: %v", err)
	}
	if _, err := n.Bottleneck(addrB, Bottleneck{Rate: 1e9}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Bottleneck(addrB, Bottleneck{Rate: 1e9}); err == nil {
		t.Error("second bottleneck toward one address accepted")
	}
	if err := NewMemNetwork(Faults{}).Step(); !errors.Is(err, ErrNotVirtual) {
		t.Errorf("Step in real time: %v", err)
	}
}

// vclock is a settable clock for virtual-time tests.
type vclock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *vclock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *vclock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

var vstart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// arrival is a packet a sink received, at the network time it came.
type arrival struct {
	at   time.Duration
	src  netip.Addr
	seq  byte
	tos  uint8
	port uint16
}

// sink receives on l until it closes, recording every packet with the
// clock's time.
func sink(l *MemLink, clk func() time.Time, mu *sync.Mutex, got *[]arrival) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		pkts := make([]udp.Packet, 16)
		for i := range pkts {
			pkts[i].Buf = make([]byte, udp.MaxPacketSize)
		}
		for {
			for i := range pkts {
				pkts[i].Buf = pkts[i].Buf[:cap(pkts[i].Buf)]
			}
			k, err := l.Recv(pkts)
			if err != nil {
				return
			}
			mu.Lock()
			for _, p := range pkts[:k] {
				*got = append(*got, arrival{at: clk().Sub(vstart), src: p.Addr, seq: p.Buf[12], tos: p.TOS, port: p.SrcPort})
			}
			mu.Unlock()
		}
	}()
	return done
}

// pktIPLen is the IP datagram size of the 100-byte test payloads over IPv4.
const pktIPLen = 100 + 8 + 20

func TestSwitchDrainRateAndTailDrop(t *testing.T) {
	clk := &vclock{t: vstart}
	n := NewVirtualMemNetwork(Faults{Seed: 1}, clk.Now)
	la, _ := n.Link(addrA)
	lb, _ := n.Link(addrB)
	// 1 Mb/s: one 128-byte datagram every 1.024 ms; room for 5 of them.
	port, err := n.Bottleneck(addrB, Bottleneck{Rate: 1e6, Buffer: 5*pktIPLen + pktIPLen/2})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []arrival
	done := sink(lb, clk.Now, &mu, &got)
	buf := make([]byte, udp.MaxPacketSize)
	var pkts []udp.Packet
	for i := range 8 {
		b := testPayload(slices.Clone(buf), 7, 100)
		b[12] = byte(i)
		pkts = append(pkts, udp.Packet{Buf: b, Addr: addrB, SrcPort: 0xc000})
	}
	if err := la.Send(pkts); err != nil {
		t.Fatal(err)
	}
	if ev, ok := n.NextEvent(); !ok || !ev.Equal(vstart) {
		t.Fatalf("NextEvent = %v %v, want the staged packets at the start", ev, ok)
	}
	// Step at every event until nothing is left.
	for range 20 {
		ev, ok := n.NextEvent()
		if !ok {
			break
		}
		clk.Set(ev)
		if err := n.Step(); err != nil {
			t.Fatal(err)
		}
	}
	la.Close()
	lb.Close()
	<-done
	st := port.Stats()
	if st.Enqueued != 5 || st.Dropped != 3 || st.Departed != 5 || st.Depth != 0 || st.MaxDepth != 5*pktIPLen {
		t.Errorf("stats %+v: want 5 enqueued, 3 tail-dropped, 5 departed, max depth %d", st, 5*pktIPLen)
	}
	per := time.Duration(pktIPLen * 8 * 1000) // ns per packet at 1 Mb/s
	for i, a := range got {
		if a.seq != byte(i) || a.at != time.Duration(i+1)*per {
			t.Errorf("arrival %d: seq %d at %v, want seq %d at %v", i, a.seq, a.at, i, time.Duration(i+1)*per)
		}
	}
	if len(got) != 5 {
		t.Fatalf("%d arrivals, want 5", len(got))
	}
	// Mean depth: 5 packets leave one per period: (5+4+3+2+1)/5 packets
	// on average over the five periods.
	if m, want := MeanDepth(PortStats{At: st.Since}, PortStats{At: vstart.Add(5 * per), DepthArea: st.DepthArea}), 3.0*pktIPLen; math.Abs(m-want) > 0.01 {
		t.Errorf("mean depth %v, want %v", m, want)
	}
}

// markRun sends count ECN-capable packets (every fourth Not-ECT) from a
// into a marking port toward b, all at once, and returns which arrived
// marked CE, and the port's stats.
func markRun(t *testing.T, seed int64, count int) ([]bool, PortStats) {
	t.Helper()
	clk := &vclock{t: vstart}
	n := NewVirtualMemNetwork(Faults{Seed: seed}, clk.Now)
	la, _ := n.Link(addrA)
	lb, _ := n.Link(addrB)
	port, err := n.Bottleneck(addrB, Bottleneck{Rate: 1e9, Kmin: 10 * pktIPLen, Kmax: 50 * pktIPLen, Pmax: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []arrival
	done := sink(lb, clk.Now, &mu, &got)
	buf := make([]byte, udp.MaxPacketSize)
	for i := range count {
		b := testPayload(buf, 7, 100)
		b[12] = byte(i)
		tos := uint8(udp.ECNECT0)
		if i%4 == 3 {
			tos = udp.ECNNotECT
		}
		if err := la.Send([]udp.Packet{{Buf: b, Addr: addrB, SrcPort: 0xc000, TOS: tos}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 * count {
		ev, ok := n.NextEvent()
		if !ok {
			break
		}
		clk.Set(ev)
		if err := n.Step(); err != nil {
			t.Fatal(err)
		}
	}
	la.Close()
	lb.Close()
	<-done
	if len(got) != count {
		t.Fatalf("%d of %d packets arrived", len(got), count)
	}
	marks := make([]bool, count)
	for i, a := range got {
		if int(a.seq) != i%256 {
			t.Fatalf("arrival %d has seq %d: reordered", i, a.seq)
		}
		marks[i] = a.tos&udp.ECNMask == udp.ECNCE
		if i%4 == 3 && a.tos != udp.ECNNotECT {
			t.Errorf("Not-ECT packet %d arrived with TOS %#x", i, a.tos)
		}
	}
	return marks, port.Stats()
}

func TestSwitchMarking(t *testing.T) {
	const count = 80
	m1, st := markRun(t, 1, count)
	marked := 0
	for i, m := range m1 {
		depth := i * pktIPLen // all arrive at once: packet i sees i before it
		if m {
			marked++
		}
		if depth <= 10*pktIPLen && m {
			t.Errorf("packet %d marked at depth %d <= Kmin", i, depth)
		}
		if depth > 50*pktIPLen && i%4 != 3 && !m {
			t.Errorf("ECN-capable packet %d not marked at depth %d > Kmax", i, depth)
		}
	}
	if uint64(marked) != st.Marked {
		t.Errorf("%d packets arrived marked, port counted %d", marked, st.Marked)
	}
	// Between Kmin and Kmax the probability rises linearly to 0.5: some,
	// not all, of the ECN-capable packets there are marked.
	mid := 0
	for i := 11; i <= 50; i++ {
		if m1[i] {
			mid++
		}
	}
	if mid == 0 || mid >= 30 {
		t.Errorf("%d of 30 ECN-capable packets between Kmin and Kmax marked; want some, about 7", mid)
	}
	m2, _ := markRun(t, 1, count)
	if !slices.Equal(m1, m2) {
		t.Errorf("same seed, different marks:\n%v\n%v", m1, m2)
	}
	m3, _ := markRun(t, 2, count)
	if slices.Equal(m1, m3) {
		t.Errorf("seeds 1 and 2 marked the same packets")
	}
}

// TestVirtualDeterminism runs a ping-pong of echoing links with
// concurrent senders through a marking, dropping port twice per seed and
// compares everything that arrived, with its time.
func TestVirtualDeterminism(t *testing.T) {
	run := func(seed int64) string {
		clk := &vclock{t: vstart}
		n := NewVirtualMemNetwork(Faults{Seed: seed, Delay: 3 * time.Microsecond, Loss: 0.01}, clk.Now)
		srv, _ := n.Link(addrB)
		if _, err := n.Bottleneck(addrB, Bottleneck{Rate: 1e8, Buffer: 20 * pktIPLen, Kmin: 2 * pktIPLen, Kmax: 10 * pktIPLen, Pmax: 0.3}); err != nil {
			t.Fatal(err)
		}
		var clients []*MemLink
		for i := range 4 {
			l, _ := n.Link(netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}))
			if _, err := l.Shape(Bottleneck{Rate: 5e7}); err != nil {
				t.Fatal(err)
			}
			clients = append(clients, l)
		}
		// The server echoes every packet back to its sender.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			pkts := make([]udp.Packet, 8)
			for i := range pkts {
				pkts[i].Buf = make([]byte, udp.MaxPacketSize)
			}
			for {
				for i := range pkts {
					pkts[i].Buf = pkts[i].Buf[:cap(pkts[i].Buf)]
				}
				k, err := srv.Recv(pkts)
				if err != nil {
					return
				}
				for i := range pkts[:k] {
					pkts[i].TOS = udp.ECNECT0
				}
				if err := srv.Send(pkts[:k]); err != nil && !errors.Is(err, net.ErrClosed) {
					t.Error(err)
				}
			}
		}()
		var mu sync.Mutex
		var got []arrival
		var dones []chan struct{}
		for _, c := range clients {
			dones = append(dones, sink(c, clk.Now, &mu, &got))
		}
		// Every client sends a burst from its own goroutine, at once.
		var sw sync.WaitGroup
		for ci, c := range clients {
			sw.Add(1)
			go func() {
				defer sw.Done()
				buf := make([]byte, udp.MaxPacketSize)
				for i := range 30 {
					b := testPayload(buf, 7, 100)
					b[12] = byte(i)
					if err := c.Send([]udp.Packet{{Buf: b, Addr: addrB, SrcPort: uint16(0xc000 + ci), TOS: udp.ECNECT0}}); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		sw.Wait()
		for range 10000 {
			ev, ok := n.NextEvent()
			if !ok {
				break
			}
			clk.Set(ev)
			if err := n.Step(); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range clients {
			c.Close()
		}
		srv.Close()
		wg.Wait()
		for _, d := range dones {
			<-d
		}
		slices.SortStableFunc(got, func(a, b arrival) int { return a.src.Compare(b.src) }) // sinks run concurrently; each one's order is its own
		return fmt.Sprint(len(got), got, n.Counters())
	}
	a, b, c := run(1), run(1), run(2)
	if a != b {
		t.Errorf("seed 1 twice differs:\n%s\n%s", a, b)
	}
	if a == c {
		t.Errorf("seeds 1 and 2 gave the same run: %s", a)
	}
}

// TestRealTimeBottleneck sends through a real-time port (timer-driven
// departures) and checks everything arrives, in order, and the counters.
func TestRealTimeBottleneck(t *testing.T) {
	n, la, lb := newPair(t, Faults{}, addrA, addrB)
	port, err := n.Bottleneck(addrB, Bottleneck{Rate: 1e8, Buffer: 30 * pktIPLen, Kmin: 2 * pktIPLen, Kmax: 5 * pktIPLen, Pmax: 1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := la.Shape(Bottleneck{Rate: 2e8})
	if err != nil {
		t.Fatal(err)
	}
	const count = 20
	var out []udp.Packet
	for i := range count {
		b := testPayload(make([]byte, udp.MaxPacketSize), 7, 100)
		b[12] = byte(i)
		out = append(out, udp.Packet{Buf: b, Addr: addrB, SrcPort: 0xc000, TOS: udp.ECNECT1})
	}
	// One batch: all enter the transmit line at once, whatever the
	// scheduling, and leave it at 2e8 b/s into a port draining at 1e8.
	if err := la.Send(out); err != nil {
		t.Fatal(err)
	}
	pkts := make([]udp.Packet, 4)
	for i := range pkts {
		pkts[i].Buf = make([]byte, udp.MaxPacketSize)
	}
	next := 0
	for next < count {
		k, err := lb.Recv(pkts)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkts[:k] {
			if int(p.Buf[12]) != next {
				t.Fatalf("got seq %d, want %d", p.Buf[12], next)
			}
			next++
		}
		for i := range pkts {
			pkts[i].Buf = pkts[i].Buf[:cap(pkts[i].Buf)]
		}
	}
	st, ts := port.Stats(), tx.Stats()
	if st.Enqueued != count || st.Departed != count || st.Dropped != 0 || st.Depth != 0 {
		t.Errorf("port stats %+v", st)
	}
	if ts.Enqueued != count || ts.Departed != count || ts.Marked != 0 {
		t.Errorf("transmit line stats %+v", ts)
	}
	// The port drains at half the line's rate, so its queue grows past
	// Kmax (marked with probability 1 above it).
	if st.Marked == 0 || st.MaxDepth <= 5*pktIPLen {
		t.Errorf("port stats %+v: want a queue above Kmax and marks", st)
	}
	if _, err := la.Shape(Bottleneck{Rate: 1e9}); err == nil {
		t.Error("second Shape accepted")
	}
}

// TestVirtualNoReceiver: a packet delivered to a link nobody receives
// from keeps the network busy; Step gives up after QuiesceTimeout naming
// the link, and closing the link frees it.
func TestVirtualNoReceiver(t *testing.T) {
	old := QuiesceTimeout
	QuiesceTimeout = 50 * time.Millisecond
	defer func() { QuiesceTimeout = old }()
	clk := &vclock{t: vstart}
	n := NewVirtualMemNetwork(Faults{}, clk.Now)
	la, _ := n.Link(addrA)
	lb, _ := n.Link(addrB)
	defer la.Close()
	buf := make([]byte, udp.MaxPacketSize)
	if err := la.Send([]udp.Packet{{Buf: testPayload(buf, 1, 100), Addr: addrB, SrcPort: 0xc000}}); err != nil {
		t.Fatal(err)
	}
	err := n.Step()
	if err == nil || !strings.Contains(err.Error(), addrB.String()) {
		t.Fatalf("Step with no receiver on %v: %v", addrB, err)
	}
	lb.Close()
	if err := n.Step(); err != nil {
		t.Fatalf("Step after closing the busy link: %v", err)
	}
	if _, ok := n.NextEvent(); ok {
		t.Error("events left after everything was delivered")
	}
}
