package memnet

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
)

// Test helpers: the part of package udp's shared link test helpers that
// the tests of the in-memory network use (a package's test files cannot be
// imported, and a helper package that imports udp cannot serve udp's own
// tests).

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

func recvBufs(n int) []udp.Packet {
	p := make([]udp.Packet, n)
	for i := range p {
		p[i].Buf = make([]byte, udp.MaxPacketSize)
	}
	return p
}

// testPackets returns n packets of size bytes to dst from srcPort, with
// sequence numbers 0, 1, ...
func testPackets(n, size int, dst netip.Addr, srcPort uint16) []udp.Packet {
	p := make([]udp.Packet, n)
	for i := range p {
		p[i] = udp.Packet{Buf: testPayload(make([]byte, size), uint32(i), size), Addr: dst, SrcPort: srcPort}
	}
	return p
}

// closeUnblocksRecv starts a Recv into bufs on l, waits until it is
// blocked, closes l and checks that the Recv returns net.ErrClosed within
// 5 s.
func closeUnblocksRecv(t *testing.T, l udp.Link, bufs []udp.Packet) {
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
	waitRecvBlocked(t)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if !errors.Is(r.err, net.ErrClosed) {
			t.Fatalf("Recv after Close = %d, %v; want net.ErrClosed", r.n, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked 5 s after Close")
	}
}

// waitRecvBlocked waits (at most 10 s) until the goroutine closeUnblocksRecv
// started is parked in MemLink.Recv, so that a Close after it tests
// unblocking a Recv, not a Recv that starts after Close.
func waitRecvBlocked(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<16)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.Stack(buf, true)
		if n == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		for g := range strings.SplitSeq(string(buf[:n]), "\n\n") {
			state, _, _ := strings.Cut(g, "]")
			if strings.Contains(g, "created by github.com/gorocev2/rocev2/udp/memnet.closeUnblocksRecv") &&
				strings.Contains(g, "MemLink).Recv(") && (strings.Contains(state, "[select") || strings.Contains(state, "[chan receive")) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Recv goroutine did not block within 10 s:\n%s", buf[:n])
		}
		time.Sleep(time.Millisecond)
	}
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
func linkExchange(s, r udp.Link, out []udp.Packet) (send func() error, recv func(max int) (int, error)) {
	in := recvBufs(len(out))
	return func() error { return s.Send(out) }, func(max int) (int, error) { return r.Recv(in[:max]) }
}

// benchLinks runs one exchange of the packets out, sent on s and received
// on r, per iteration and reports allocations and pkts/s.
func benchLinks(b *testing.B, s, r udp.Link, out []udp.Packet) {
	send, recv := linkExchange(s, r, out)
	b.SetBytes(int64(len(out[0].Buf) * len(out)))
	b.ReportAllocs()
	for b.Loop() {
		exchange(b, len(out), send, recv)
	}
	b.ReportMetric(float64(b.N*len(out))/b.Elapsed().Seconds(), "pkts/s")
}
