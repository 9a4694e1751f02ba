//go:build linux

package transport

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
)

// BenchmarkLatency8B measures the round-trip time of an 8-byte ping-pong
// over loopback UDP sockets — the stack (two devices on udp.SocketLinks, one
// RC QP each) against a raw UDP baseline (two plain UDP sockets bouncing one
// datagram the size of the stack's request packet) — in the same run: each
// b.N step is one round trip of each, run in alternating rounds of
// latRound round trips, so both see the same moments of a noisy machine.
// Both use one goroutine per side, and the echo side of the kind not
// measured is idle (it serves exactly one round at a time). Both use the
// same wait technique:
//
//   - blocking: the raw side blocks in Go's poller (net.UDPConn); the
//     stack's links never busy-poll and the application sleeps in CQ.Wait
//     (SEND, and WRITE with immediate).
//   - busypoll: the raw side polls its socket without blocking (recvfrom
//     MSG_DONTWAIT), the stack's application polls its CQ (SEND) or its
//     memory and Device.Progress (WRITE, as ib_write_lat polls memory) on
//     links with udp.SocketOptions.BusyPoll, so that the polling goroutine
//     drives the link itself; both yield the processor between tries
//     (runtime.Gosched) and never sleep.
//
// SEND: each side answers a received SEND with one SEND (ibv_rc_pingpong).
// WRITE: each side writes 8 bytes into the other's buffer, whose last byte
// counts, and waits for the peer's write; in blocking mode the WRITE
// carries an immediate and the peer sleeps in its CQ for the receive
// completion. Metrics: raw-µs/rtt, stack-µs/rtt and stack/raw.
func BenchmarkLatency8B(b *testing.B) {
	for _, op := range []string{"SEND", "WRITE"} {
		for _, mode := range []string{"blocking", "busypoll"} {
			b.Run(op+"/"+mode, func(b *testing.B) {
				spin := mode == "busypoll"
				raw := newRawPingPong(b, spin)
				stack := newStackPingPong(b, op, spin)
				benchLatencyPair(b, raw, stack)
			})
		}
	}
}

// latSpin is the busy-poll budget of the stack's links in the busypoll
// benchmarks (the default of rocev2d's latency commands); the application
// polls Poll, which never sleeps, so the budget only bounds the receive
// goroutine's own polling when it has the link.
const latSpin = 100 * time.Microsecond

// latRound is how many round trips of one kind run before the other's turn.
const latRound = 500

// pinger is one ping-pong: round(n) starts the echo side for n requests
// and runs n round trips; stop ends the echo.
type pinger interface {
	round(n int) error
	stop()
}

// benchLatencyPair runs raw and stack rounds alternately and reports their
// mean RTTs and the ratio.
func benchLatencyPair(b *testing.B, raw, stack pinger) {
	b.Helper()
	defer raw.stop()
	defer stack.stop()
	// Warm both up (connections, buffers, the poller).
	if err := raw.round(100); err != nil {
		b.Fatal("raw:", err)
	}
	if err := stack.round(100); err != nil {
		b.Fatal("stack:", err)
	}
	var tRaw, tStack time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		k := min(latRound, b.N-done)
		for i, p := range []pinger{raw, stack} {
			if done/latRound%2 == 1 {
				p = []pinger{stack, raw}[i]
			}
			t0 := time.Now()
			if err := p.round(k); err != nil {
				if sp, ok := p.(*stackPingPong); ok {
					b.Logf("A: %+v\nB: %+v", sp.a.dev.Counters(), sp.r.dev.Counters())
					for _, x := range []*side{sp.a, sp.r} {
						select {
						case ev := <-x.dev.Events():
							b.Logf("event %+v", ev)
						default:
						}
					}
				}
				b.Fatal(err)
			}
			if p == raw {
				tRaw += time.Since(t0)
			} else {
				tStack += time.Since(t0)
			}
		}
		done += k
	}
	r := float64(tRaw.Nanoseconds()) / 1e3 / float64(b.N)
	s := float64(tStack.Nanoseconds()) / 1e3 / float64(b.N)
	b.ReportMetric(r, "raw-µs/rtt")
	b.ReportMetric(s, "stack-µs/rtt")
	b.ReportMetric(s/r, "stack/raw")
}

// latTimeout bounds a busy-polling wait in the benchmarks (a lost
// datagram would make the raw baseline spin forever).
const latTimeout = 5 * time.Second

// rawPingPong bounces one datagram between two UDP sockets on the stack's
// addresses (ephemeral ports, 8 MiB buffers as the links have).
type rawPingPong struct {
	a, b    *net.UDPConn
	ra, rb  syscall.RawConn
	dst     netip.AddrPort
	spin    bool
	msg, in []byte
	serve   chan int
	done    chan error
}

// rawRequestSize is the size of the stack's 8-byte SEND request datagram:
// BTH (12) + payload (8) + ICRC (4).
const rawRequestSize = 12 + 8 + 4

func newRawPingPong(b *testing.B, spin bool) *rawPingPong {
	b.Helper()
	listen := func(a netip.Addr) *net.UDPConn {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
		if err != nil {
			b.Skipf("UDP on %v unavailable: %v", a, err)
		}
		c.SetReadBuffer(8 << 20)
		c.SetWriteBuffer(8 << 20)
		return c
	}
	r := &rawPingPong{a: listen(latAddrA), b: listen(latAddrB), spin: spin,
		msg: make([]byte, rawRequestSize), in: make([]byte, 2048), serve: make(chan int), done: make(chan error)}
	var err error
	if r.ra, err = r.a.SyscallConn(); err != nil {
		b.Fatal(err)
	}
	if r.rb, err = r.b.SyscallConn(); err != nil {
		b.Fatal(err)
	}
	r.dst = r.b.LocalAddr().(*net.UDPAddr).AddrPort()
	from := r.a.LocalAddr().(*net.UDPAddr).AddrPort()
	go func() {
		buf := make([]byte, 2048)
		for n := range r.serve {
			var err error
			for range n {
				var k int
				if k, err = rawRecv(r.b, r.rb, buf, r.spin); err != nil {
					break
				}
				if _, err = r.b.WriteToUDPAddrPort(buf[:k], from); err != nil {
					break
				}
			}
			r.done <- err
		}
	}()
	return r
}

func (r *rawPingPong) round(n int) error {
	r.serve <- n
	for range n {
		if _, err := r.a.WriteToUDPAddrPort(r.msg, r.dst); err != nil {
			return err
		}
		if _, err := rawRecv(r.a, r.ra, r.in, r.spin); err != nil {
			return err
		}
	}
	return <-r.done
}

func (r *rawPingPong) stop() {
	close(r.serve)
	r.a.Close()
	r.b.Close()
}

// rawRecv receives one datagram into buf: blocking in Go's poller, or
// with spin by polling the socket without blocking (recvfrom
// MSG_DONTWAIT), yielding the processor between tries.
func rawRecv(c *net.UDPConn, rc syscall.RawConn, buf []byte, spin bool) (int, error) {
	if !spin {
		n, _, err := c.ReadFromUDPAddrPort(buf)
		return n, err
	}
	var n int
	var e syscall.Errno
	try := func(fd uintptr) bool {
		r, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
			syscall.MSG_DONTWAIT, 0, 0)
		n, e = int(r), errno
		return true // never wait in the poller
	}
	var deadline time.Time
	for i := 0; ; i++ {
		if err := rc.Read(try); err != nil {
			return 0, err
		}
		if e == 0 {
			return n, nil
		}
		if e != syscall.EAGAIN && e != syscall.EINTR {
			return 0, e
		}
		if i&1023 == 1023 {
			if deadline.IsZero() {
				deadline = time.Now().Add(latTimeout)
			} else if time.Now().After(deadline) {
				return 0, errors.New("raw: no datagram")
			}
		}
		runtime.Gosched()
	}
}

// stackPingPong is the stack's side of the benchmark.
type stackPingPong struct {
	a, r       *side
	op         string
	spin       bool
	pollOnly   bool         // SEND: both sides poll their CQs (Poll, Gosched) even on links that do not busy-poll
	ctxPerWait bool         // each Wait with a context of its own (context.WithTimeout), cancelled after it
	asge, rsge []memreg.SGE // what each side sends: bytes 0..7
	arecv      []memreg.SGE // where each side receives: bytes 8..15
	rrecv      []memreg.SGE
	abuf, rbuf []byte
	amr, rmr   *memreg.MR
	acnt, rcnt byte // the last request count each side sent
	serve      chan int
	done       chan error
	wcs        []WC
}

func newStackPingPong(b testing.TB, op string, spin bool) *stackPingPong {
	b.Helper()
	// GSOAuto, as rocev2d opens its links: on over loopback.
	o := &udp.SocketOptions{GSOAuto: true}
	if spin {
		o.BusyPoll = latSpin
	}
	a, r := newLatSocketPair(b, o)
	abuf, amr := mmapBuffer(b, a)
	rbuf, rmr := mmapBuffer(b, r)
	// Each side sends from bytes 0..7 of its buffer and receives (SEND) or
	// is written (WRITE) into bytes 8..15.
	s := &stackPingPong{a: a, r: r, op: op, spin: spin, abuf: abuf, rbuf: rbuf, amr: amr, rmr: rmr,
		asge: sge(amr, 0, 8), rsge: sge(rmr, 0, 8), arecv: sge(amr, 8, 8), rrecv: sge(rmr, 8, 8),
		serve: make(chan int), done: make(chan error), wcs: make([]WC, 8)}
	for range 16 {
		if err := a.qp.PostRecv(RecvWR{SGEs: s.arecv}); err != nil {
			b.Fatal(err)
		}
		if err := r.qp.PostRecv(RecvWR{SGEs: s.rrecv}); err != nil {
			b.Fatal(err)
		}
	}
	go func() {
		wcs := make([]WC, 8)
		for n := range s.serve {
			var err error
			for range n {
				if err = s.pong(wcs); err != nil {
					break
				}
			}
			s.done <- err
		}
	}()
	return s
}

// mmapBuffer registers a page of anonymous mmap'd memory on side x for
// remote writes: the WRITE benchmarks poll it while the peer's WRITEs land
// in it, as a NIC's DMA would, which the race detector (it does not watch
// memory outside Go's heap) rightly leaves alone.
func mmapBuffer(tb testing.TB, x *side) ([]byte, *memreg.MR) {
	tb.Helper()
	buf, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		tb.Fatal(err)
	}
	mr, err := x.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		tb.Fatal(err)
	}
	// Deregistering waits for the device's writes in progress and fails
	// later ones, so the page can go.
	tb.Cleanup(func() {
		if mr.Deregister() == nil {
			syscall.Munmap(buf)
		}
	})
	return buf, mr
}

// request is the WR one side sends: a SEND, or an 8-byte WRITE into bytes
// 8..15 of the peer's buffer (with an immediate when the peer sleeps in its
// CQ).
func (s *stackPingPong) request(sges []memreg.SGE, peer *memreg.MR) SendWR {
	switch {
	case s.op == "SEND":
		return SendWR{Opcode: WRSend, SGEs: sges}
	case s.spin:
		return SendWR{Opcode: WRWrite, SGEs: sges, RemoteAddr: peer.IOVA() + 8, RKey: peer.RKey()}
	}
	return SendWR{Opcode: WRWriteImm, SGEs: sges, RemoteAddr: peer.IOVA() + 8, RKey: peer.RKey()}
}

// await waits on side x for the peer's request number cnt: a receive
// completion in x.rcq (polled with Poll, or waited for with Wait), or with
// WRITE in busy-poll mode, cnt in the last byte of x's buffer. A consumed
// receive is reposted.
func (s *stackPingPong) await(x *side, buf []byte, recv []memreg.SGE, cnt byte, wcs []WC) error {
	if s.op == "WRITE" && s.spin {
		return pollLastByte(x.dev, buf[8:16], cnt)
	}
	if s.spin || s.pollOnly {
		var deadline time.Time
		for i := 0; x.rcq.Poll(wcs[:1]) == 0; i++ {
			if i&1023 == 1023 {
				if deadline.IsZero() {
					deadline = time.Now().Add(latTimeout)
				} else if time.Now().After(deadline) {
					return errors.New("stack: no completion")
				}
			}
			runtime.Gosched()
		}
	} else {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if s.ctxPerWait {
			ctx, cancel = context.WithTimeout(ctx, latTimeout)
		}
		_, err := x.rcq.Wait(ctx, wcs[:1])
		cancel()
		if err != nil {
			return err
		}
	}
	if wcs[0].Status != WCSuccess {
		return wcs[0].Err()
	}
	return x.qp.PostRecv(RecvWR{SGEs: recv})
}

// pollLastByte spins until buf's last byte is cnt (the peer's WRITE lands
// in it), driving dev's link (Device.Progress) and yielding between tries.
func pollLastByte(dev *Device, buf []byte, cnt byte) error {
	word := (*uint32)(unsafe.Pointer(&buf[len(buf)-4]))
	var deadline time.Time
	for i := 0; ; i++ {
		if byte(atomic.LoadUint32(word)>>24) == cnt {
			return nil
		}
		if dev.Progress() > 0 {
			continue
		}
		if i&1023 == 1023 {
			if deadline.IsZero() {
				deadline = time.Now().Add(latTimeout)
			} else if time.Now().After(deadline) {
				return errors.New("stack: no WRITE")
			}
		}
		runtime.Gosched()
	}
}

// pong is one answer of the echo side.
func (s *stackPingPong) pong(wcs []WC) error {
	s.rcnt++
	if err := s.await(s.r, s.rbuf, s.rrecv, s.rcnt, wcs); err != nil {
		return err
	}
	s.rbuf[7] = s.rcnt
	if err := s.r.qp.PostSend(s.request(s.rsge, s.amr)); err != nil {
		return err
	}
	s.r.scq.Poll(wcs) // unsignaled: none
	return nil
}

func (s *stackPingPong) round(n int) error {
	s.serve <- n
	for range n {
		s.acnt++
		s.abuf[7] = s.acnt
		if err := s.a.qp.PostSend(s.request(s.asge, s.rmr)); err != nil {
			return err
		}
		if err := s.await(s.a, s.abuf, s.arecv, s.acnt, s.wcs); err != nil {
			return err
		}
		s.a.scq.Poll(s.wcs)
	}
	return <-s.done
}

func (s *stackPingPong) stop() { close(s.serve) }

// newLatSocketPair is newSocketPair with socket options o, on the
// latency benchmarks' addresses.
func newLatSocketPair(tb testing.TB, o *udp.SocketOptions) (a, r *side) {
	tb.Helper()
	return newSocketPairAt(tb, o, latAddrA, latAddrB)
}

// latAddrA and latAddrB are the loopback addresses of the latency
// benchmark and tests: 127.b1.b2.71 and .72, b1 and b2 from the process
// ID, so that concurrent runs of the package (and the other socket
// benchmarks, on 127.0.0.71 and .72) do not collide on port 4791.
var latAddrA, latAddrB = func() (netip.Addr, netip.Addr) {
	pid := os.Getpid()
	b1, b2 := byte(40+pid%200), byte(1+(pid/200)%250)
	return netip.AddrFrom4([4]byte{127, b1, b2, 71}), netip.AddrFrom4([4]byte{127, b1, b2, 72})
}()
