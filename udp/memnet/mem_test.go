package memnet

import (
	"bytes"
	"errors"
	"github.com/gorocev2/rocev2/udp"
	"hash/crc32"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/icrc"
)

var (
	addrA  = netip.MustParseAddr("192.0.2.1")
	addrB  = netip.MustParseAddr("192.0.2.2")
	addr6A = netip.MustParseAddr("2001:db8::1")
	addr6B = netip.MustParseAddr("2001:db8::2")
)

func newPair(t testing.TB, f Faults, a, b netip.Addr) (*MemNetwork, *MemLink, *MemLink) {
	t.Helper()
	n := NewMemNetwork(f)
	la, err := n.Link(a)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := n.Link(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { la.Close(); lb.Close() })
	return n, la, lb
}

func TestMemLinkDelivers(t *testing.T) {
	tests := []struct {
		name   string
		a, b   netip.Addr
		sendTo netip.Addr
	}{
		{"ipv4", addrA, addrB, addrB},
		{"ipv4-mapped GID", netip.AddrFrom16(addrA.As16()), addrB, netip.AddrFrom16(addrB.As16())},
		{"ipv6", addr6A, addr6B, addr6B},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, la, lb := newPair(t, Faults{}, tc.a, tc.b)
			buf := make([]byte, udp.MaxPacketSize)
			p := []udp.Packet{{Buf: testPayload(buf, 7, 100), Addr: tc.sendTo, SrcPort: 0xc144, TOS: udp.ECNCE}}
			if err := la.Send(p); err != nil {
				t.Fatal(err)
			}
			// The ICRC the link filled in must be what a kernel would put on
			// the wire: ID 0, DF, ports SrcPort -> 4791.
			var want uint32
			if tc.b.Is4() {
				want = icrc.ComputeIPv4(&icrc.IPv4Pseudo{Src: tc.a.Unmap().As4(), Dst: tc.b.As4(), ID: 0, FlagsFrag: 0x4000, SrcPort: 0xc144, DstPort: 4791}, p[0].Buf)
			} else {
				want = icrc.ComputeIPv6(&icrc.IPv6Pseudo{Src: tc.a.As16(), Dst: tc.b.As16(), SrcPort: 0xc144, DstPort: 4791}, p[0].Buf)
			}
			if got := icrc.Load(p[0].Buf); got != want {
				t.Fatalf("ICRC filled by Send = %#08x, want %#08x", got, want)
			}
			sent := slices.Clone(p[0].Buf)
			clear(buf) // the sender may reuse its buffer as soon as Send returns

			r := recvBufs(4)
			n, err := lb.Recv(r)
			if err != nil || n != 1 {
				t.Fatalf("Recv = %d, %v; want 1, nil", n, err)
			}
			if !bytes.Equal(r[0].Buf, sent) {
				t.Errorf("received payload differs from sent")
			}
			if r[0].Addr != tc.a.Unmap() || r[0].SrcPort != 0xc144 || r[0].TOS != udp.ECNCE {
				t.Errorf("Recv meta = %v:%d tos %d, want %v:%d tos 3", r[0].Addr, r[0].SrcPort, r[0].TOS, tc.a.Unmap(), 0xc144)
			}
			if s := la.Stats(); s.SentPkts != 1 {
				t.Errorf("sender stats %+v", s)
			}
			if s := lb.Stats(); s != (udp.Stats{RcvdPkts: 1}) {
				t.Errorf("receiver stats %+v", s)
			}
		})
	}
}

func TestMemLinkLoopback(t *testing.T) {
	_, la, _ := newPair(t, Faults{}, addrA, addrB)
	buf := make([]byte, 64)
	if err := la.Send([]udp.Packet{{Buf: testPayload(buf, 1, 64), Addr: addrA, SrcPort: 1}}); err != nil {
		t.Fatal(err)
	}
	r := recvBufs(1)
	if n, err := la.Recv(r); n != 1 || err != nil || r[0].Addr != addrA {
		t.Fatalf("loopback Recv = %d, %v, addr %v", n, err, r[0].Addr)
	}
}

func TestMemLinkErrors(t *testing.T) {
	n, la, _ := newPair(t, Faults{}, addrA, addrB)
	buf := make([]byte, udp.MaxPacketSize+1)
	tests := []struct {
		name string
		pkts []udp.Packet
		want error
	}{
		{"short", []udp.Packet{{Buf: buf[:15], Addr: addrB}}, udp.ErrPacketSize},
		{"long", []udp.Packet{{Buf: buf[:udp.MaxPacketSize+1], Addr: addrB}}, udp.ErrPacketSize},
		{"family", []udp.Packet{{Buf: buf[:64], Addr: addr6B}}, udp.ErrAddress},
		{"zero addr", []udp.Packet{{Buf: buf[:64]}}, udp.ErrAddress},
		{"second bad", []udp.Packet{{Buf: buf[:64], Addr: addrB}, {Buf: buf[:3], Addr: addrB}}, udp.ErrPacketSize},
	}
	for _, tc := range tests {
		if err := la.Send(tc.pkts); !errors.Is(err, tc.want) {
			t.Errorf("%s: Send err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if c := n.Counters(); c.Packets != 0 {
		t.Errorf("invalid batches must send nothing, network saw %d", c.Packets)
	}
	if _, err := n.Link(addrA); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("duplicate Link err = %v, want EADDRINUSE", err)
	}
	if _, err := n.Link(netip.Addr{}); !errors.Is(err, udp.ErrAddress) {
		t.Errorf("zero Link err = %v, want udp.ErrAddress", err)
	}
	if _, err := la.Recv([]udp.Packet{{Buf: make([]byte, 100)}}); !errors.Is(err, udp.ErrShortBuffer) {
		t.Errorf("Recv small buffer err = %v, want udp.ErrShortBuffer", err)
	}
}

func TestMemLinkNoRoute(t *testing.T) {
	n, la, _ := newPair(t, Faults{}, addrA, addrB)
	buf := make([]byte, 64)
	if err := la.Send([]udp.Packet{{Buf: testPayload(buf, 1, 64), Addr: netip.MustParseAddr("192.0.2.99")}}); err != nil {
		t.Fatalf("send to unknown address must not fail: %v", err)
	}
	if c := n.Counters(); c.NoRoute != 1 {
		t.Errorf("NoRoute = %d, want 1", c.NoRoute)
	}
}

func TestMemLinkDropsMalformedAndGarbage(t *testing.T) {
	_, la, lb := newPair(t, Faults{}, addrA, addrB)
	garbage := make([]byte, 200)
	for i := range garbage {
		garbage[i] = byte(i*7 + 3)
	}
	good := testPayload(make([]byte, 64), 5, 64)
	if err := la.SendRaw([]udp.Packet{
		{Buf: garbage[:0], Addr: addrB},
		{Buf: garbage[:15], Addr: addrB},
		{Buf: garbage, Addr: addrB},
	}); err != nil {
		t.Fatal(err)
	}
	if err := la.Send([]udp.Packet{{Buf: good, Addr: addrB, SrcPort: 9}}); err != nil {
		t.Fatal(err)
	}
	r := recvBufs(8)
	n, err := lb.Recv(r)
	if err != nil || n != 1 || seqOf(r[0].Buf) != 5 {
		t.Fatalf("Recv = %d, %v; want only the good packet", n, err)
	}
	if s := lb.Stats(); s.DropMalformed != 2 || s.DropBadICRC != 1 || s.RcvdPkts != 1 {
		t.Errorf("stats %+v, want 2 malformed, 1 bad ICRC, 1 received", s)
	}
}

func TestMemLinkCloseUnblocksRecv(t *testing.T) {
	n, la, lb := newPair(t, Faults{}, addrA, addrB)
	closeUnblocksRecv(t, lb, recvBufs(1))
	if _, err := lb.Recv(recvBufs(1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Recv = %v", err)
	}
	if err := lb.Send([]udp.Packet{{Buf: make([]byte, 64), Addr: addrA}}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close = %v", err)
	}
	if err := lb.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	// Sending to the closed address is a silent drop; the address is free again.
	if err := la.Send([]udp.Packet{{Buf: make([]byte, 64), Addr: addrB}}); err != nil {
		t.Fatal(err)
	}
	l2, err := n.Link(addrB)
	if err != nil {
		t.Fatalf("address not reusable after Close: %v", err)
	}
	l2.Close()
}

func TestMemLinkQueueOverflow(t *testing.T) {
	_, la, lb := newPair(t, Faults{}, addrA, addrB)
	buf := make([]byte, 64)
	const total = memQueueLen + 100
	for i := range total {
		if err := la.Send([]udp.Packet{{Buf: testPayload(buf, uint32(i), 64), Addr: addrB}}); err != nil {
			t.Fatal(err)
		}
	}
	if s := lb.Stats(); s.DropOther != total-memQueueLen {
		t.Fatalf("DropOther = %d, want %d", s.DropOther, total-memQueueLen)
	}
	r := recvBufs(memBatchSize)
	got := 0
	for got < memQueueLen {
		n, err := lb.Recv(r)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if seqOf(r[i].Buf) != uint32(got+i) {
				t.Fatalf("packet %d has seq %d: queue must keep the first packets in order", got+i, seqOf(r[i].Buf))
			}
		}
		got += n
	}
}

// runFaults sends count packets A->B in batches and collects what B receives,
// in order, until every packet the network forwarded is accounted for.
type faultRun struct {
	seqs     []uint32
	ctr      MemCounters
	rx       udp.Stats
	intactOK bool
}

func runFaults(t *testing.T, f Faults, count, size int) faultRun {
	t.Helper()
	n, la, lb := newPair(t, f, addrA, addrB)
	var (
		mu     sync.Mutex
		seqs   []uint32
		intact = true
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := recvBufs(64)
		want := make([]byte, udp.MaxPacketSize)
		for {
			k, err := lb.Recv(r)
			if err != nil {
				return
			}
			mu.Lock()
			for i := range k {
				s := seqOf(r[i].Buf)
				w := testPayload(want, s, size)
				if !bytes.Equal(r[i].Buf[:size-4], w[:size-4]) {
					intact = false
				}
				seqs = append(seqs, s)
			}
			mu.Unlock()
		}
	}()
	batch := make([]udp.Packet, 32)
	bufs := make([][]byte, len(batch))
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	for sent := 0; sent < count; {
		k := min(len(batch), count-sent)
		for i := range k {
			batch[i] = udp.Packet{Buf: testPayload(bufs[i], uint32(sent+i), size), Addr: addrB, SrcPort: 0xc000}
		}
		if err := la.Send(batch[:k]); err != nil {
			t.Fatal(err)
		}
		sent += k
		for i := 0; len(lb.q) > memQueueLen/2 && i < 10000; i++ {
			time.Sleep(100 * time.Microsecond) // let the receiver keep the queue short
		}
	}
	// Wait until every forwarded copy has been received or dropped.
	deadline := time.Now().Add(20 * time.Second)
	for {
		n.mu.Lock()
		c := n.ctr
		held := 0
		if lb.held != nil {
			held = 1
		}
		inFlight := n.delayLen
		n.mu.Unlock()
		s := lb.Stats()
		forwarded := c.Packets - c.Lost - c.NoRoute + c.Duplicated - uint64(held) - uint64(inFlight)
		mu.Lock()
		got := uint64(len(seqs))
		mu.Unlock()
		if (held == 0 || f.ReorderHold >= time.Minute) && inFlight == 0 && got+s.DropBadICRC+s.DropMalformed+s.DropOther == forwarded && got == s.RcvdPkts {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("packets unaccounted for: counters %+v, rx %+v, collected %d", c, s, got)
		}
		time.Sleep(time.Millisecond)
	}
	lb.Close()
	wg.Wait()
	return faultRun{seqs: seqs, ctr: n.Counters(), rx: lb.Stats(), intactOK: intact}
}

// within reports whether got is within 5 standard deviations of a binomial
// count with n trials and probability p.
func within(got uint64, n int, p float64) bool {
	mean := float64(n) * p
	sd := math.Sqrt(float64(n) * p * (1 - p))
	return math.Abs(float64(got)-mean) <= 5*sd+1
}

func TestMemFaultStatistics(t *testing.T) {
	count := 20000
	if testing.Short() {
		count = 5000
	}
	tests := []struct {
		name  string
		f     Faults
		check func(t *testing.T, r faultRun)
	}{
		{"loss 10%", Faults{Loss: 0.1, Seed: 1}, func(t *testing.T, r faultRun) {
			if !within(r.ctr.Lost, count, 0.1) {
				t.Errorf("Lost = %d of %d, want ~10%%", r.ctr.Lost, count)
			}
			if uint64(len(r.seqs)) != uint64(count)-r.ctr.Lost {
				t.Errorf("received %d, want %d", len(r.seqs), uint64(count)-r.ctr.Lost)
			}
			if !slices.IsSorted(r.seqs) {
				t.Errorf("loss alone must not reorder")
			}
		}},
		{"dup 5%", Faults{Dup: 0.05, Seed: 2}, func(t *testing.T, r faultRun) {
			if !within(r.ctr.Duplicated, count, 0.05) {
				t.Errorf("Duplicated = %d of %d, want ~5%%", r.ctr.Duplicated, count)
			}
			if uint64(len(r.seqs)) != uint64(count)+r.ctr.Duplicated {
				t.Errorf("received %d, want %d", len(r.seqs), uint64(count)+r.ctr.Duplicated)
			}
		}},
		{"reorder 10%", Faults{Reorder: 0.1, Seed: 3}, func(t *testing.T, r faultRun) {
			// A packet following a held one is never held itself, so the
			// effective rate is p/(1+p).
			if !within(r.ctr.Reordered, count, 0.1/1.1) {
				t.Errorf("Reordered = %d of %d, want ~%.1f%%", r.ctr.Reordered, count, 100*0.1/1.1)
			}
			if len(r.seqs) != count {
				t.Fatalf("received %d, want all %d", len(r.seqs), count)
			}
			inv := 0
			for i := 1; i < len(r.seqs); i++ {
				if r.seqs[i] < r.seqs[i-1] {
					inv++
				}
			}
			if inv == 0 || uint64(inv) > r.ctr.Reordered {
				t.Errorf("inversions = %d, held packets = %d", inv, r.ctr.Reordered)
			}
			s := slices.Clone(r.seqs)
			slices.Sort(s)
			for i, v := range s {
				if v != uint32(i) {
					t.Fatalf("reordering lost or duplicated packet %d", i)
				}
			}
		}},
		{"corrupt 5%", Faults{Corrupt: 0.05, Seed: 4}, func(t *testing.T, r faultRun) {
			if !within(r.ctr.Corrupted, count, 0.05) {
				t.Errorf("Corrupted = %d of %d, want ~5%%", r.ctr.Corrupted, count)
			}
			if r.rx.DropBadICRC != r.ctr.Corrupted {
				t.Errorf("DropBadICRC = %d, corrupted = %d: every corrupted packet must fail the ICRC", r.rx.DropBadICRC, r.ctr.Corrupted)
			}
			if uint64(len(r.seqs)) != uint64(count)-r.ctr.Corrupted {
				t.Errorf("received %d, want %d", len(r.seqs), uint64(count)-r.ctr.Corrupted)
			}
		}},
		{"all + delay", Faults{Loss: 0.02, Dup: 0.02, Reorder: 0.02, Corrupt: 0.02, Delay: 200 * time.Microsecond, Seed: 5}, func(t *testing.T, r faultRun) {
			for name, v := range map[string]uint64{"lost": r.ctr.Lost, "dup": r.ctr.Duplicated, "corrupt": r.ctr.Corrupted} {
				if v == 0 || v > uint64(count/20) {
					t.Errorf("%s = %d of %d, want ~2%%", name, v, count)
				}
			}
			if r.ctr.Delayed == 0 {
				t.Errorf("no packet went through the delay line")
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runFaults(t, tc.f, count, 96)
			if !r.intactOK {
				t.Errorf("a delivered packet's content differs from what was sent")
			}
			tc.check(t, r)
		})
	}
}

func TestMemFaultsReproducible(t *testing.T) {
	f := Faults{Loss: 0.05, Dup: 0.05, Reorder: 0.05, Corrupt: 0.05, Seed: 42, ReorderHold: time.Hour}
	a := runFaults(t, f, 5000, 64)
	b := runFaults(t, f, 5000, 64)
	if !slices.Equal(a.seqs, b.seqs) || a.ctr != b.ctr || a.rx != b.rx {
		t.Fatalf("same seed, different runs: counters %+v vs %+v, rx %+v vs %+v", a.ctr, b.ctr, a.rx, b.rx)
	}
	f.Seed = 43
	c := runFaults(t, f, 5000, 64)
	if slices.Equal(a.seqs, c.seqs) {
		t.Fatalf("different seeds gave identical runs")
	}
}

func TestMemSetFaults(t *testing.T) {
	n, la, lb := newPair(t, Faults{Loss: 1}, addrA, addrB)
	buf := testPayload(make([]byte, 64), 1, 64)
	if err := la.Send([]udp.Packet{{Buf: buf, Addr: addrB}}); err != nil {
		t.Fatal(err)
	}
	if c := n.Counters(); c.Lost != 1 {
		t.Fatalf("Loss=1 must drop: %+v", c)
	}
	n.SetFaults(Faults{Delay: 30 * time.Millisecond})
	start := time.Now()
	if err := la.Send([]udp.Packet{{Buf: buf, Addr: addrB}}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Millisecond {
		t.Errorf("Send blocked %v with Delay set", d)
	}
	r := recvBufs(1)
	if k, err := lb.Recv(r); k != 1 || err != nil {
		t.Fatalf("Recv = %d, %v", k, err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("delayed packet arrived after %v, want >= 30ms", d)
	}
}

func TestMemReorderHoldTimer(t *testing.T) {
	_, la, lb := newPair(t, Faults{Reorder: 1, ReorderHold: 5 * time.Millisecond}, addrA, addrB)
	buf := testPayload(make([]byte, 64), 1, 64)
	start := time.Now()
	if err := la.Send([]udp.Packet{{Buf: buf, Addr: addrB}}); err != nil {
		t.Fatal(err)
	}
	r := recvBufs(1)
	if k, err := lb.Recv(r); k != 1 || err != nil {
		t.Fatalf("Recv = %d, %v", k, err)
	}
	if d := time.Since(start); d < 5*time.Millisecond {
		t.Errorf("held packet released after %v, want >= 5ms", d)
	}
}

func TestMemLinkZeroAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	_, la, lb := newPair(t, Faults{}, addrA, addrB)
	pkts := testPackets(32, 1024, addrB, 0xc000)
	send, recv := linkExchange(la, lb, pkts)
	step := func() { exchange(t, len(pkts), send, recv) }
	step()
	if a := testing.AllocsPerRun(100, step); a != 0 {
		t.Errorf("steady-state Send+Recv of 32 packets allocates %v times", a)
	}
}

func benchMem(b *testing.B, size int) {
	_, la, lb := newPair(b, Faults{}, addrA, addrB)
	benchLinks(b, la, lb, testPackets(64, size, addrB, 0xc000))
}

// BenchmarkMemLink measures Send+Recv through a fault-free MemNetwork.
func BenchmarkMemLink(b *testing.B) {
	b.Run("1KiB", func(b *testing.B) { benchMem(b, 1024) })
	b.Run("4KiB", func(b *testing.B) { benchMem(b, 4096) })
}

// BenchmarkMemBaseline is the irreducible work of the same traffic: two
// copies and two CRC-32 passes per packet, no queueing.
func BenchmarkMemBaseline(b *testing.B) {
	for _, size := range []int{1024, 4096} {
		b.Run(map[int]string{1024: "1KiB", 4096: "4KiB"}[size], func(b *testing.B) {
			src := testPayload(make([]byte, size), 1, size)
			mid := make([]byte, udp.MaxPacketSize)
			dst := make([]byte, udp.MaxPacketSize)
			const batch = 64
			b.SetBytes(int64(size * batch))
			b.ReportAllocs()
			var sink uint32
			for b.Loop() {
				for range batch {
					sink += crc32.ChecksumIEEE(src)
					copy(mid, src)
					sink += crc32.ChecksumIEEE(mid[:size])
					copy(dst, mid[:size])
				}
			}
			_ = sink
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "pkts/s")
		})
	}
}

// FuzzMemRecv feeds arbitrary datagrams to a MemLink receiver: Recv must never
// panic and may only return a datagram whose ICRC verifies.
func FuzzMemRecv(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 15))
	f.Add(testPayload(make([]byte, 64), 1, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > udp.MaxPacketSize {
			data = data[:udp.MaxPacketSize]
		}
		n := NewMemNetwork(Faults{})
		la, _ := n.Link(addrA)
		lb, _ := n.Link(addrB)
		defer la.Close()
		defer lb.Close()
		sentinel := testPayload(make([]byte, 64), 0xabcdef, 64)
		if err := la.SendRaw([]udp.Packet{{Buf: data, Addr: addrB, SrcPort: 0xc001}}); err != nil {
			t.Fatal(err)
		}
		if err := la.Send([]udp.Packet{{Buf: sentinel, Addr: addrB, SrcPort: 0xc001}}); err != nil {
			t.Fatal(err)
		}
		r := recvBufs(2)
		for done := false; !done; {
			k, err := lb.Recv(r)
			if err != nil {
				t.Fatal(err)
			}
			for i := range k {
				b := r[i].Buf
				if udp.ComputeICRC(addrA, addrB, 0xc001, 0, b) != icrc.Load(b) {
					t.Fatalf("Recv returned a datagram with a bad ICRC")
				}
				if bytes.Equal(b, sentinel) {
					done = true
				}
			}
		}
		s := lb.Stats()
		if s.RcvdPkts+s.DropBadICRC+s.DropMalformed != 2 {
			t.Fatalf("datagrams unaccounted for: %+v", s)
		}
	})
}

func TestMemTap(t *testing.T) {
	n, la, lb := newPair(t, Faults{Loss: 1}, addrA, addrB)
	type seen struct {
		src, dst netip.Addr
		port     uint16
		tos      uint8
		payload  []byte
	}
	var got []seen
	n.SetTap(func(src, dst netip.Addr, port uint16, tos uint8, payload []byte) {
		got = append(got, seen{src, dst, port, tos, bytes.Clone(payload)})
	})
	p := []udp.Packet{{Buf: testPayload(make([]byte, 64), 1, 64), Addr: addrB, SrcPort: 0xc001, TOS: udp.ECNECT0}}
	if err := la.Send(p); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].src != addrA || got[0].dst != addrB || got[0].port != 0xc001 || got[0].tos != udp.ECNECT0 || !bytes.Equal(got[0].payload, p[0].Buf) {
		t.Fatalf("tap saw %+v", got)
	}
	n.SetTap(nil)
	if err := lb.Send(p); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Errorf("tap still called after SetTap(nil)")
	}
}

func TestMemCEMark(t *testing.T) {
	n, la, lb := newPair(t, Faults{CEMark: 0.2, Seed: 9}, addrA, addrB)
	const count = 2000
	r := recvBufs(64)
	var ce, notECTMarked int
	buf := make([]byte, 64)
	for i := range count {
		tos := uint8(udp.ECNECT0)
		if i%2 == 1 {
			tos = 0xb8 // DSCP EF, Not-ECT
		}
		if err := la.Send([]udp.Packet{{Buf: testPayload(buf, uint32(i), 64), Addr: addrB, TOS: tos}}); err != nil {
			t.Fatal(err)
		}
		k, err := lb.Recv(r)
		if err != nil || k != 1 {
			t.Fatalf("Recv = %d, %v", k, err)
		}
		switch {
		case tos == udp.ECNECT0 && r[0].TOS == udp.ECNCE:
			ce++
		case tos == 0xb8 && r[0].TOS != 0xb8:
			notECTMarked++
		case tos == udp.ECNECT0 && r[0].TOS != udp.ECNECT0:
			t.Fatalf("TOS %#x became %#x", tos, r[0].TOS)
		}
	}
	if notECTMarked != 0 {
		t.Errorf("%d Not-ECT packets were marked", notECTMarked)
	}
	if !within(uint64(ce), count/2, 0.2) || uint64(ce) != n.Counters().CEMarked {
		t.Errorf("CE marked %d of %d ECT packets (counter %d), want ~20%%", ce, count/2, n.Counters().CEMarked)
	}
}

// RecvBacklog tells whether delivered packets wait for Recv.
func TestMemLinkRecvBacklog(t *testing.T) {
	_, la, lb := newPair(t, Faults{}, addrA, addrB)
	if lb.RecvBacklog() {
		t.Fatal("backlog on a fresh link")
	}
	buf := make([]byte, udp.MaxPacketSize)
	if err := la.Send([]udp.Packet{{Buf: testPayload(buf, 1, 100), Addr: addrB, SrcPort: 0xc000}}); err != nil {
		t.Fatal(err)
	}
	if !lb.RecvBacklog() {
		t.Fatal("no backlog with a packet delivered and not received")
	}
	r := []udp.Packet{{Buf: make([]byte, udp.MaxPacketSize)}}
	if n, err := lb.Recv(r); n != 1 || err != nil {
		t.Fatalf("Recv = %d, %v", n, err)
	}
	if lb.RecvBacklog() {
		t.Fatal("backlog after the packet was received")
	}
}
