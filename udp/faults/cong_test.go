//go:build linux

package faults

import (
	"errors"
	"math"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ipLen is the IP length of frame(frameOpts{payload: n}) over IPv4.
func ipLen(payload int) int { return 20 + 8 + 12 + payload + 4 }

// TestCongestionFillMarkDrop fills a slow phantom queue (1 byte/ms: the
// time the test takes drains a few hundred bytes at most) packet by packet
// and checks each verdict against the depth the packet found: unmarked up
// to Kmin, always CE from Kmax, dropped when it would pass the limit.
func TestCongestionFillMarkDrop(t *testing.T) {
	q := &Congestion{Rate: 8000, Limit: 20000, Kmin: 5000, Kmax: 12000, Pmax: 0.3}
	for _, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			inj := load(t, Config{Congestion: q})
			n := ipLen(1000)
			if v6 {
				n += 20
			}
			const slack = 2 // packets' worth of drain the test may take on a loaded machine
			var passed, dropped, marked int
			start := time.Now()
			for i := range 40 {
				in := frame(frameOpts{v6: v6, tos: 0x02, payload: 1000})
				ret, out := run(t, inj, Egress, in, nil)
				depth := i * n // an upper bound: what was queued, undrained
				var ce bool
				if v6 {
					ce = out[15]&0x30 == 0x30
				} else {
					ce = out[15]&3 == 3
					if ipv4Checksum(out[14:34]) != 0 {
						t.Fatalf("packet %d: bad IPv4 checksum", i)
					}
				}
				switch {
				case ret == actShot:
					dropped++
					if passed*n+n <= int(q.Limit) {
						t.Fatalf("packet %d dropped with %d bytes queued, limit %d", i, passed*n, q.Limit)
					}
				case ret == actUnspec:
					passed++
					if ce {
						marked++
					}
					if ce && depth <= int(q.Kmin) {
						t.Fatalf("packet %d marked at depth <= %d (Kmin %d)", i, depth, q.Kmin)
					}
					if !ce && depth-slack*n >= int(q.Kmax) {
						t.Fatalf("packet %d not marked at depth >= %d (Kmax %d)", i, depth-slack*n, q.Kmax)
					}
				default:
					t.Fatalf("verdict %d", ret)
				}
			}
			elapsed := time.Since(start)
			// The queue holds Limit/n packets; drain during the test adds
			// a packet per n ms.
			extra := int(elapsed/time.Millisecond) / n
			if want := int(q.Limit) / n; passed < want || passed > want+extra+1 {
				t.Errorf("passed %d, want %d (+%d for %v of drain)", passed, want, extra, elapsed)
			}
			c := counters(t, inj, Egress)
			if c.CongPassed != uint64(passed) || c.CongDropped != uint64(dropped) || c.CongMarked != uint64(marked) ||
				c.CEMarked != uint64(marked) || c.Seen != 40 || c.Dropped() != uint64(dropped) || c.Errors != 0 {
				t.Errorf("counters %v; saw passed %d dropped %d marked %d", c, passed, dropped, marked)
			}
			if c.QueueMax > uint64(q.Limit) || c.QueueMax < uint64(q.Limit)-uint64(n)*(slack+1) {
				t.Errorf("QueueMax %d, want just under the limit %d", c.QueueMax, q.Limit)
			}
			d, err := inj.QueueDepth(Egress)
			if err != nil || d > uint64(q.Limit) || d+uint64(extra+slack)*uint64(n) < c.QueueMax {
				t.Errorf("QueueDepth %d %v, max %d", d, err, c.QueueMax)
			}
			// The other hook has its own queue.
			if d, _ := inj.QueueDepth(Ingress); d != 0 {
				t.Errorf("ingress queue %d, want 0", d)
			}
		})
	}
}

// TestCongestionDrains: a queue of 100 bytes/ms filled to its limit (16
// KiB; a test run takes ~100 µs, a packet adds 2044 bytes) is empty after
// a sleep far longer than its 164 ms drain time; the next packet then
// passes unmarked.
func TestCongestionDrains(t *testing.T) {
	q := &Congestion{Rate: 800_000, Limit: 16 << 10, Kmin: 0, Kmax: 1, Pmax: 1}
	inj := load(t, Config{Congestion: q})
	for range 200 {
		if ret, _ := run(t, inj, Egress, frame(frameOpts{tos: 1, payload: 2000}), nil); ret == actShot {
			break
		}
	}
	c := counters(t, inj, Egress)
	if c.CongMarked == 0 || c.CongDropped == 0 {
		t.Fatalf("the queue did not fill (the machine stalled for long?): %v", c)
	}
	time.Sleep(time.Second)
	if d, err := inj.QueueDepth(Egress); err != nil || d != 0 {
		t.Fatalf("depth after drain: %d %v", d, err)
	}
	ret, out := run(t, inj, Egress, frame(frameOpts{tos: 1, payload: 2000}), nil)
	if ret != actUnspec || out[15] != 1 {
		t.Fatalf("after drain: verdict %d TOS %#x, want pass with ECT(1)", ret, out[15])
	}
}

// TestCongestionMarkingSlope checks the marking probability between Kmin
// and Kmax: queues filled from empty by 20 packets (reset between rounds)
// with Kmin 0, Kmax 40000 and Pmax 0.5 mark packet i with probability
// 0.5·i·n/40000; the total over 400 rounds is within 5σ of its mean.
func TestCongestionMarkingSlope(t *testing.T) {
	q := &Congestion{Rate: 8000, Limit: 40000, Kmin: 0, Kmax: 40000, Pmax: 0.5}
	inj := load(t, Config{Congestion: q})
	n := ipLen(1000)
	const rounds, per = 400, 20
	var mean, variance float64
	for i := range per {
		p := q.Pmax * float64(i*n) / float64(q.Kmax)
		mean += p
		variance += p * (1 - p)
	}
	mean *= rounds
	variance *= rounds
	marked := 0
	for range rounds {
		if err := inj.ResetCounters(); err != nil {
			t.Fatal(err)
		}
		for range per {
			if _, out := run(t, inj, Egress, frame(frameOpts{tos: 2, payload: 1000}), nil); out[15]&3 == 3 {
				marked++
			}
		}
	}
	// The drain during a round (1 byte/ms) lowers the depth a little:
	// allow it below the mean.
	if sd := math.Sqrt(variance); math.Abs(float64(marked)-mean) > 5*sd+0.02*mean {
		t.Fatalf("marked %d of %d, want %.0f ± %.0f", marked, rounds*per, mean, 5*sd)
	}
	t.Logf("marked %d of %d (expected %.0f)", marked, rounds*per, mean)
}

// TestCongestionNotECT: over Kmax a Not-ECT packet passes unmarked (and is
// counted in CENotECT) unless CEAll is set; the DestQP filter keeps other
// QPs' packets out of the queue.
func TestCongestionNotECT(t *testing.T) {
	q := &Congestion{Rate: 8000, Limit: 100000, Kmin: 0, Kmax: 1, Pmax: 1}
	inj := load(t, Config{Congestion: q})
	run(t, inj, Egress, frame(frameOpts{tos: 0, payload: 100}), nil) // depth 0: not marked
	in := frame(frameOpts{tos: 0, payload: 100})
	if ret, out := run(t, inj, Egress, in, nil); ret != actUnspec || out[15] != 0 {
		t.Fatalf("Not-ECT: verdict %d TOS %#x", ret, out[15])
	}
	if c := counters(t, inj, Egress); c.CENotECT != 1 || c.CongMarked != 0 || c.CongPassed != 2 {
		t.Fatalf("counters %v", c)
	}
	if err := inj.Set(Config{Congestion: q, CEAll: true, FilterDestQP: true, DestQP: 7}); err != nil {
		t.Fatal(err)
	}
	if _, out := run(t, inj, Egress, frame(frameOpts{tos: 0, destQP: 7}), nil); out[15] != 3 {
		t.Fatalf("CEAll: TOS %#x", out[15])
	}
	if _, out := run(t, inj, Egress, frame(frameOpts{tos: 2, destQP: 8}), nil); out[15] != 2 {
		t.Fatalf("filtered QP marked: TOS %#x", out[15])
	}
	if c := counters(t, inj, Egress); c.CongMarked != 1 || c.CongPassed != 3 || c.Filtered != 1 {
		t.Fatalf("counters %v", c)
	}
}

func TestCongestionValidate(t *testing.T) {
	bad := []Congestion{
		{Rate: 999, Limit: 1000},
		{Rate: 401e9, Limit: 1000},
		{Rate: 1e9, Limit: 0},
		{Rate: 1e9, Limit: 1<<30 + 1},
		{Rate: 1000, Limit: 200000}, // 1600 s to drain
		{Rate: 1e9, Limit: 1000, Kmin: 600, Kmax: 500},
		{Rate: 1e9, Limit: 1000, Kmax: 1001},
		{Rate: 1e9, Limit: 1000, Kmax: 500, Pmax: 1.5},
		{Rate: 1e9, Limit: 1000, Kmax: 500, Pmax: math.NaN()},
	}
	for _, q := range bad {
		if err := (&Config{Congestion: &q}).Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", q, err)
		}
	}
	good := []Congestion{{Rate: 1000, Limit: 1}, {Rate: 400e9, Limit: 1 << 30, Kmin: 1, Kmax: 1 << 30, Pmax: 1}, {Rate: 4e8, Limit: 1 << 20, Kmin: 5 << 10, Kmax: 200 << 10, Pmax: 0.01}}
	for _, q := range good {
		if err := (&Config{Congestion: &q}).Validate(); err != nil {
			t.Errorf("%+v: %v", q, err)
		}
	}
	// The fixed-point rates are accurate to 0.1 % over the whole range.
	for _, r := range []uint64{1000, 8000, 1e6, 4e8, 1e9, 25e9, 100e9, 400e9} {
		q := Congestion{Rate: r, Limit: 1}
		nspb := float64(q.nsPerByte()) / (1 << qTimeShift)
		bpns := float64(q.bytesPerNs()) / (1 << 32)
		if e := math.Abs(nspb*float64(r)/8e9 - 1); e > 1e-3 {
			t.Errorf("rate %d: ns per byte off by %.4f", r, e)
		}
		if e := math.Abs(bpns*8e9/float64(r) - 1); e > 1e-3 {
			t.Errorf("rate %d: bytes per ns off by %.4f", r, e)
		}
	}
}

// tosConn enables IP_RECVTOS (receive) or sets IP_TOS (send) on c.
func tosConn(t *testing.T, c *net.UDPConn, opt, v int) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, opt, v) }); err != nil || serr != nil {
		t.Fatalf("setsockopt %d: %v %v", opt, err, serr)
	}
}

// recvTOS reads datagrams until a quiet period and returns each one's PSN
// and received TOS.
func recvTOS(t *testing.T, b *net.UDPConn) (psns []uint32, tos []uint8) {
	t.Helper()
	buf := make([]byte, 2048)
	oob := make([]byte, 128)
	wait := 3 * time.Second
	for {
		b.SetReadDeadline(time.Now().Add(wait))
		wait = 300 * time.Millisecond
		k, ok, _, _, err := b.ReadMsgUDP(buf, oob)
		if err != nil {
			return
		}
		if k < 12 {
			continue
		}
		v := uint8(0xff)
		msgs, _ := unix.ParseSocketControlMessage(oob[:ok])
		for _, m := range msgs {
			if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TOS && len(m.Data) >= 1 {
				v = m.Data[0]
			}
		}
		psns = append(psns, uint32(buf[9])<<16|uint32(buf[10])<<8|uint32(buf[11]))
		tos = append(tos, v)
	}
}

// TestCongestionVeth sends ECT(0) RoCE datagrams through a congestion
// point on a veth: paced below its rate nothing is marked or dropped; a
// burst far above it is marked once the queue passes Kmin and dropped at
// the limit, and what b receives matches the counters.
func TestCongestionVeth(t *testing.T) {
	nsA, nsB, ifA, _ := netnsPair(t, "q")
	a := udpIn(t, nsA, "203.0.113.1:4791")
	b := udpIn(t, nsB, "203.0.113.2:4791")
	tosConn(t, a, unix.IP_TOS, 0x02)
	tosConn(t, b, unix.IP_RECVTOS, 1)
	// 800 kb/s = 100 bytes/ms; datagrams of 1044 IP bytes.
	q := &Congestion{Rate: 800_000, Limit: 32 << 10, Kmin: 8 << 10, Kmax: 24 << 10, Pmax: 0.2}
	inj, err := AttachWith(ifA, Config{Congestion: q}, &Options{Netns: nsA})
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close()
	dst := &net.UDPAddr{IP: net.IPv4(203, 0, 113, 2), Port: 4791}
	payload := func(psn uint32) []byte {
		p := make([]byte, 1044-28)
		copy(p, bthPayload(psn))
		return p
	}
	n := 1044

	// Below the rate: one datagram per 15 ms (≥ 1500 bytes drained
	// between two), so every one finds the queue empty.
	for i := range 30 {
		if _, err := a.WriteToUDP(payload(uint32(i)), dst); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Millisecond)
	}
	psns, tos := recvTOS(t, b)
	c, _ := inj.Counters()
	if len(psns) != 30 || c.CongPassed != 30 || c.CongMarked != 0 || c.CongDropped != 0 || c.QueueMax > uint64(n) {
		t.Fatalf("below the rate: received %d of 30, counters %v", len(psns), c)
	}
	for i, v := range tos {
		if v != 0x02 {
			t.Fatalf("below the rate: packet %d TOS %#x, want ECT(0)", psns[i], v)
		}
	}

	// A burst of 200 as fast as the socket goes.
	time.Sleep(400 * time.Millisecond) // the queue is empty again
	if err := inj.ResetCounters(); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := a.WriteToUDP(payload(uint32(i)), dst); err != nil {
			t.Fatal(err)
		}
	}
	psns, tos = recvTOS(t, b)
	c, _ = inj.Counters()
	t.Logf("burst: received %d of 200, counters %v", len(psns), c)
	ce := 0
	for i, v := range tos {
		switch v {
		case 0x03:
			ce++
			// Depth at arrival is at most psn·n: no mark at or below Kmin.
			if int(psns[i])*n <= int(q.Kmin) {
				t.Errorf("packet %d marked at depth <= %d", psns[i], int(psns[i])*n)
			}
		case 0x02:
		default:
			t.Errorf("packet %d TOS %#x", psns[i], v)
		}
	}
	lost := 200 - len(psns)
	if c.CongDropped != uint64(lost) || c.CongMarked != uint64(ce) || c.CongPassed != uint64(len(psns)) {
		t.Errorf("counters %v disagree with what b received: %d, %d CE", c, len(psns), ce)
	}
	// The queue holds 31 datagrams; the burst drains 100 bytes per ms it
	// takes. Generous bounds: at least 100 of 200 dropped unless the burst
	// took over 6 s; every datagram past Kmax (24 KiB = 23 datagrams
	// undrained) marked, so at least a few.
	if lost < 100 || ce < 5 || c.QueueMax > uint64(q.Limit) || c.QueueMax < uint64(q.Limit)/2 {
		t.Errorf("burst: lost %d, CE %d, queue max %d", lost, ce, c.QueueMax)
	}
}

// TestCongestionConcurrent enqueues from several goroutines (CPUs) at once
// into a queue that drains 1 byte/ms: no enqueue is lost (the depth is
// what passed, less the little drained), every packet is either passed or
// dropped, and the limit is overshot by at most a packet per goroutine.
func TestCongestionConcurrent(t *testing.T) {
	q := &Congestion{Rate: 8000, Limit: 400 << 10}
	inj := load(t, Config{Congestion: q})
	const workers, per = 4, 150
	n := ipLen(1000)
	start := time.Now()
	errs := make(chan error, workers)
	for range workers {
		go func() {
			in := frame(frameOpts{tos: 2, payload: 1000})
			for range per {
				out := make([]byte, len(in)+256)
				if _, err := inj.Program(Egress).Run(ebpfRun(in, out, nil)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	c := counters(t, inj, Egress)
	d, err := inj.QueueDepth(Egress)
	if err != nil {
		t.Fatal(err)
	}
	queued := c.CongPassed * uint64(n)
	drained := uint64(time.Since(start)/time.Millisecond) + 1
	if c.CongPassed+c.CongDropped != workers*per || c.Seen != workers*per {
		t.Fatalf("counters %v: passed + dropped != %d", c, workers*per)
	}
	if d > queued || d+drained+uint64(n) < queued {
		t.Fatalf("depth %d after %d packets of %d bytes passed (%d bytes) in %v: enqueues lost", d, c.CongPassed, n, queued, elapsed)
	}
	if c.QueueMax > uint64(q.Limit)+workers*uint64(n) {
		t.Fatalf("QueueMax %d: the limit %d overshot by more than a packet per goroutine", c.QueueMax, q.Limit)
	}
	t.Logf("%d passed, %d dropped, depth %d, max %d, %v", c.CongPassed, c.CongDropped, d, c.QueueMax, elapsed)
}
