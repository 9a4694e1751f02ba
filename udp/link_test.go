package udp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Test helpers shared by the tests of every Link implementation.

// testPayload builds a RoCEv2-looking UDP payload (RC SEND_ONLY BTH, PSN =
// seq, payload, zero ICRC placeholder) of total length size.
func testPayload(buf []byte, seq uint32, size int) []byte {
	b := buf[:size]
	clear(b)
	b[0] = 0x04 // RC_SEND_ONLY
	binary.BigEndian.PutUint16(b[2:4], 0xffff)
	binary.BigEndian.PutUint32(b[4:8], 0x12)
	binary.BigEndian.PutUint32(b[8:12], seq&0xffffff)
	for i := 12; i < size-4; i++ {
		b[i] = byte(seq) + byte(i)
	}
	return b
}

func seqOf(b []byte) uint32 { return binary.BigEndian.Uint32(b[8:12]) & 0xffffff }

func recvBufs(n int) []Packet {
	p := make([]Packet, n)
	for i := range p {
		p[i].Buf = make([]byte, MaxPacketSize)
	}
	return p
}

// recvN receives until want packets arrived or the deadline passes.
func recvN(t testing.TB, l Link, want int, d time.Duration) []Packet {
	t.Helper()
	type res struct {
		pkts []Packet
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		var out []Packet
		r := recvBufs(64)
		for len(out) < want {
			n, err := l.Recv(r)
			if err != nil {
				ch <- res{out, err}
				return
			}
			for i := range n {
				p := r[i]
				p.Buf = bytes.Clone(p.Buf)
				out = append(out, p)
			}
		}
		ch <- res{out, nil}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Recv after %d packets: %v", len(r.pkts), r.err)
		}
		return r.pkts
	case <-time.After(d):
		l.Close()
		t.Fatalf("timed out waiting for %d packets (stats %+v)", want, l.Stats())
	}
	return nil
}

// closeUnblocksRecv starts a Recv into bufs on l, waits until it is
// blocked, closes l and checks that the Recv returns net.ErrClosed within
// 5 s.
func closeUnblocksRecv(t *testing.T, l Link, bufs []Packet) {
	t.Helper()
	type res struct {
		n   int
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := l.Recv(bufs)
		done <- res{n, err}
	}()
	waitRecvBlocked(t, "closeUnblocksRecv")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err == nil && r.n > 0 {
			p := &bufs[0]
			t.Fatalf("Recv after Close = %d packets (first from %v:%d, %d bytes), nil; want net.ErrClosed",
				r.n, p.Addr, p.SrcPort, len(p.Buf))
		}
		if !errors.Is(r.err, net.ErrClosed) {
			t.Fatalf("Recv after Close = %d, %v; want net.ErrClosed", r.n, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked 5 s after Close")
	}
}

// waitRecvBlocked waits (at most 10 s) until the goroutine that the
// function creator started is parked in a Link's Recv — waiting in the
// netpoller, in a blocking system call or on a channel — so that a Close
// after it tests unblocking a Recv, not a Recv that starts after Close. (A
// fixed sleep is not enough on a loaded machine.)
func waitRecvBlocked(t *testing.T, creator string) {
	t.Helper()
	waitGoroutine(t, "the Recv goroutine did not block", creator, "Link).Recv(",
		[]string{"[IO wait", "[select", "[chan receive", "[syscall"}, func() bool { return true })
}

// waitGoroutine waits (at most 10 s) until ready reports true and a
// goroutine started by the udp function creator has frame in its stack and
// one of states in its header line; it fails the test with msg and the
// stacks otherwise.
func waitGoroutine(t *testing.T, msg, creator, frame string, states []string, ready func() bool) {
	t.Helper()
	buf := make([]byte, 1<<16)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.Stack(buf, true)
		if n == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if ready() {
			for g := range strings.SplitSeq(string(buf[:n]), "\n\n") {
				state, _, _ := strings.Cut(g, "]")
				if !strings.Contains(g, "created by github.com/gorocev2/rocev2/udp."+creator) || !strings.Contains(g, frame) {
					continue
				}
				for _, st := range states {
					if strings.Contains(state, st) {
						return
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s within 10 s:\n%s", msg, buf[:n])
		}
		time.Sleep(time.Millisecond)
	}
}

// testPackets returns n packets of size bytes to dst from srcPort, with
// sequence numbers 0, 1, ...
func testPackets(n, size int, dst netip.Addr, srcPort uint16) []Packet {
	p := make([]Packet, n)
	for i := range p {
		p[i] = Packet{Buf: testPayload(make([]byte, size), uint32(i), size), Addr: dst, SrcPort: srcPort}
	}
	return p
}

// exchange calls send once, then recv (with how many packets are still
// missing) until batch packets arrived.
func exchange(tb testing.TB, batch int, send func() error, recv func(max int) (int, error)) {
	if err := send(); err != nil {
		tb.Fatal(err)
	}
	for got := 0; got < batch; {
		n, err := recv(batch - got)
		if err != nil {
			tb.Fatal(err)
		}
		got += n
	}
}

// linkExchange returns exchange's send and recv for out sent on s and
// received on r.
func linkExchange(s, r Link, out []Packet) (send func() error, recv func(max int) (int, error)) {
	in := recvBufs(len(out))
	return func() error { return s.Send(out) }, func(max int) (int, error) { return r.Recv(in[:max]) }
}

// benchExchange runs one exchange of batch packets of size bytes per
// iteration and reports allocations and pkts/s.
func benchExchange(b *testing.B, size, batch int, send func() error, recv func(max int) (int, error)) {
	b.SetBytes(int64(size * batch))
	b.ReportAllocs()
	for b.Loop() {
		exchange(b, batch, send, recv)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "pkts/s")
}

// benchLinks is benchExchange for the packets out, sent on s and received
// on r.
func benchLinks(b *testing.B, s, r Link, out []Packet) {
	send, recv := linkExchange(s, r, out)
	benchExchange(b, len(out[0].Buf), len(out), send, recv)
}
