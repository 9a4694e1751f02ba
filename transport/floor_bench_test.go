//go:build linux

package transport

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
)

// The two benchmarks here split BenchmarkLatency8B's gap to raw UDP into
// what the wire needs and what the transport's code costs:
//
//   - BenchmarkLatencyFloor8B: the RC ping-pong's datagrams without the
//     transport — each message a 2-segment GSO datagram (the 24-byte SEND
//     and the 20-byte ACK of the previous one, as the stack sends them)
//     through udp.SocketLink (ICRC computed and checked, GRO receive in
//     place), against the same raw UDP ping-pong as BenchmarkLatency8B, in
//     the same run and with the same wait (blocking in Go's poller).
//   - BenchmarkProtocol8B: the transport's own CPU per 8-byte SEND round
//     trip — two devices in one goroutine over a polled in-memory link
//     (no system call, no goroutine switch), both directions, ICRC
//     included — next to the raw UDP round trip of the same run.

// BenchmarkLatencyFloor8B: segs=1 sends the request alone, segs=2 adds the
// ACK segment. Metrics: raw-µs/rtt, stack-µs/rtt (here: the link's) and
// stack/raw. wire sends segs=2's datagrams with plain system calls (no
// link, no ICRC): what the RC ping-pong's wire costs the kernel, against
// the same raw UDP ping-pong.
func BenchmarkLatencyFloor8B(b *testing.B) {
	for _, segs := range []int{1, 2} {
		b.Run("segs="+string(rune('0'+segs)), func(b *testing.B) {
			benchLatencyPair(b, newRawPingPong(b, false), newLinkPingPong(b, segs))
		})
	}
	b.Run("wire", func(b *testing.B) {
		benchLatencyPair(b, newRawPingPong(b, false), newWirePingPong(b))
	})
}

// wirePingPong bounces the RC ping-pong's datagrams as the stack's links
// send them — one sendmsg of a 2-segment UDP GSO datagram (the 24-byte
// request and a 20-byte ACK) into a socket with UDP_GRO, received with one
// recvmsg — between two plain sockets, through the same Go calls as
// rawPingPong (WriteMsgUDPAddrPort and ReadMsgUDPAddrPort are its
// WriteToUDPAddrPort and ReadFromUDPAddrPort with control messages). Next
// to rawPingPong (sendto/recvfrom of the request alone) it is the floor
// the wire puts under an RC ping-pong: the second datagram and the
// GSO/GRO control messages, without the link's work.
type wirePingPong struct {
	a, b  *wireEnd
	serve chan int
	done  chan error
}

// wireEnd is one socket of a wirePingPong with its datagram and buffers.
type wireEnd struct {
	c        *net.UDPConn
	to       netip.AddrPort
	msg, oob []byte // the 44-byte datagram and its UDP_SEGMENT control message
	in, inc  []byte
}

func newWirePingPong(tb testing.TB) *wirePingPong {
	tb.Helper()
	end := func(a netip.Addr) *wireEnd {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
		if err != nil {
			tb.Skipf("UDP on %v unavailable: %v", a, err)
		}
		c.SetReadBuffer(8 << 20)
		c.SetWriteBuffer(8 << 20)
		rc, err := c.SyscallConn()
		if err != nil {
			tb.Fatal(err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) }); err != nil || serr != nil {
			c.Close()
			tb.Skipf("UDP_GRO: %v %v", err, serr)
		}
		e := &wireEnd{c: c, msg: make([]byte, rawRequestSize+12+4+4), oob: make([]byte, unix.CmsgSpace(2)),
			in: make([]byte, 2048), inc: make([]byte, 128)}
		h := (*unix.Cmsghdr)(unsafe.Pointer(&e.oob[0]))
		h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Pointer(&e.oob[unix.CmsgLen(0)])) = rawRequestSize
		return e
	}
	p := &wirePingPong{a: end(latAddrA), b: end(latAddrB), serve: make(chan int), done: make(chan error)}
	p.a.to = p.b.c.LocalAddr().(*net.UDPAddr).AddrPort()
	p.b.to = p.a.c.LocalAddr().(*net.UDPAddr).AddrPort()
	go func() {
		for n := range p.serve {
			var err error
			for range n {
				if err = p.b.recv(); err != nil {
					break
				}
				if _, _, err = p.b.c.WriteMsgUDPAddrPort(p.b.msg, p.b.oob, p.b.to); err != nil {
					break
				}
			}
			p.done <- err
		}
	}()
	return p
}

// recv receives the peer's datagram: the two segments, coalesced by GRO
// (or the request, if they came apart).
func (e *wireEnd) recv() error {
	for {
		n, _, _, _, err := e.c.ReadMsgUDPAddrPort(e.in, e.inc)
		if err != nil || n >= rawRequestSize {
			return err
		}
	}
}

func (p *wirePingPong) round(n int) error {
	p.serve <- n
	for range n {
		if _, _, err := p.a.c.WriteMsgUDPAddrPort(p.a.msg, p.a.oob, p.a.to); err != nil {
			return err
		}
		if err := p.a.recv(); err != nil {
			return err
		}
	}
	return <-p.done
}

func (p *wirePingPong) stop() {
	close(p.serve)
	p.a.c.Close()
	p.b.c.Close()
}

// linkPingPong bounces the RC ping-pong's datagrams between two
// udp.SocketLinks (GSOAuto, as the stack's links), no transport above.
type linkPingPong struct {
	a, b  *udp.SocketLink
	segs  int
	out   []udp.Packet // a's message to b
	back  []udp.Packet // b's answer to a
	in    []udp.Packet
	serve chan int
	done  chan error
}

// floorAddrs are the links' addresses: the latency benchmark's loopback
// block, hosts .73 and .74.
func floorAddrs() (netip.Addr, netip.Addr) {
	a, b := latAddrA.As4(), latAddrB.As4()
	a[3], b[3] = 73, 74
	return netip.AddrFrom4(a), netip.AddrFrom4(b)
}

func newLinkPingPong(tb testing.TB, segs int) *linkPingPong {
	tb.Helper()
	aa, ba := floorAddrs()
	o := &udp.SocketOptions{GSOAuto: true}
	listen := func(addr netip.Addr) *udp.SocketLink {
		l, err := udp.ListenSocket(addr, o)
		if err != nil {
			tb.Skipf("UDP %v:4791 unavailable: %v", addr, err)
		}
		tb.Cleanup(func() { l.Close() })
		return l
	}
	// A SEND ONLY of 8 bytes and an ACK, as the stack's answer datagram
	// holds them (their contents do not matter to the link, but for the
	// destination QP: a link that shares its address, as the stack's
	// links do where the process may load the steering program, gets only
	// the datagrams to QPNs it leased, so each message goes to a QPN the
	// receiving link leased; QP 0 was dropped by the steering program and
	// the first round waited forever).
	msg := func(dst netip.Addr, to *udp.SocketLink) []udp.Packet {
		req, ack := make([]byte, 12+8+4), make([]byte, 12+4+4)
		req[0], ack[0] = 0x04, 0x11
		if to.Shared() {
			qpn, _, err := to.LeaseQPNs()
			if err != nil {
				tb.Fatalf("lease QPNs on %v: %v", dst, err)
			}
			for _, b := range [][]byte{req, ack} {
				b[5], b[6], b[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
			}
		}
		return []udp.Packet{{Buf: req, Addr: dst}, {Buf: ack, Addr: dst}}[:segs]
	}
	bufs := func() []udp.Packet {
		ps := make([]udp.Packet, 8)
		for i := range ps {
			ps[i].Buf = make([]byte, udp.MaxPacketSize)
		}
		return ps
	}
	la, lb := listen(aa), listen(ba)
	p := &linkPingPong{a: la, b: lb, segs: segs, out: msg(ba, lb), back: msg(aa, la),
		in: bufs(), serve: make(chan int), done: make(chan error)}
	go func() {
		in := bufs()
		for n := range p.serve {
			var err error
			for range n {
				if err = p.recv(p.b, in); err != nil {
					break
				}
				if err = p.b.Send(p.back); err != nil {
					break
				}
			}
			p.done <- err
		}
	}()
	return p
}

// recv receives one message (segs packets) on l.
func (p *linkPingPong) recv(l *udp.SocketLink, in []udp.Packet) error {
	for got := 0; got < p.segs; {
		for i := range in {
			in[i].Buf = in[i].Buf[:cap(in[i].Buf)]
		}
		n, err := l.Recv(in)
		if err != nil {
			return err
		}
		got += n
	}
	return nil
}

func (p *linkPingPong) round(n int) error {
	p.serve <- n
	for range n {
		if err := p.a.Send(p.out); err != nil {
			return err
		}
		if err := p.recv(p.a, p.in); err != nil {
			return err
		}
	}
	return <-p.done
}

func (p *linkPingPong) stop() { close(p.serve) }

// BenchmarkProtocol8B: metrics raw-µs/rtt (raw UDP's blocking ping-pong),
// stack-µs/rtt (here: the transport's CPU per round trip, no system call)
// and stack/raw.
func BenchmarkProtocol8B(b *testing.B) {
	b.ReportAllocs()
	benchLatencyPair(b, newRawPingPong(b, false), newProtoPingPong(b))
}

// protoPingPong is an 8-byte SEND ping-pong between two devices on a
// memLoop, driven by one goroutine with Progress and Poll.
type protoPingPong struct {
	a, r         *side
	asge, rsge   []memreg.SGE
	arecv, rrecv []memreg.SGE
	wcs          []WC
}

func newProtoPingPong(tb testing.TB) *protoPingPong {
	tb.Helper()
	aa, ra := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	la, lr := newMemLoop(aa, ra)
	po := pairOpts{mtu: MTU4096, sqDepth: 256, rqDepth: 256, cqDepth: 1024, retry: 7, rnrRetry: 7, minRNR: 12}
	po.defaults()
	a, r := newSideOn(tb, la, &po), newSideOn(tb, lr, &po)
	connect(tb, a, r, ra, 0x10, 0x20, &po)
	connect(tb, r, a, aa, 0x20, 0x10, &po)
	_, amr := a.buffer(tb, 64, 0)
	_, rmr := r.buffer(tb, 64, 0)
	p := &protoPingPong{a: a, r: r, asge: sge(amr, 0, 8), rsge: sge(rmr, 0, 8),
		arecv: sge(amr, 8, 8), rrecv: sge(rmr, 8, 8), wcs: make([]WC, 4)}
	for range 16 {
		if err := a.qp.PostRecv(RecvWR{SGEs: p.arecv}); err != nil {
			tb.Fatal(err)
		}
		if err := r.qp.PostRecv(RecvWR{SGEs: p.rrecv}); err != nil {
			tb.Fatal(err)
		}
	}
	return p
}

// await drives x until its receive CQ has the peer's message, and reposts
// the receive.
func (p *protoPingPong) await(x *side, recv []memreg.SGE) error {
	for i := 0; x.rcq.Poll(p.wcs[:1]) == 0; i++ {
		// Progress skips its receive right after a batch, and the
		// receive goroutine may hold the link for a moment at first.
		if x.dev.Progress() == 0 && i > 16 {
			runtime.Gosched()
		}
		if i > 1<<24 {
			return errors.New("proto: no completion")
		}
	}
	if p.wcs[0].Status != WCSuccess {
		return p.wcs[0].Err()
	}
	return x.qp.PostRecv(RecvWR{SGEs: recv})
}

func (p *protoPingPong) round(n int) error {
	for range n {
		if err := p.a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: p.asge}); err != nil {
			return err
		}
		if err := p.await(p.r, p.rrecv); err != nil {
			return err
		}
		if err := p.r.qp.PostSend(SendWR{Opcode: WRSend, SGEs: p.rsge}); err != nil {
			return err
		}
		p.r.scq.Poll(p.wcs)
		if err := p.await(p.a, p.arecv); err != nil {
			return err
		}
		p.a.scq.Poll(p.wcs)
	}
	return nil
}

func (p *protoPingPong) stop() {}

// memLoop is one end of a polled in-memory link pair: Send computes each
// packet's ICRC (as a socket link does, for its flow) and queues a copy at
// the peer; TryRecv checks the ICRC and hands the packets out. It busy-polls
// (BusyPoll > 0), so its device is driven by Progress in the caller's
// goroutine; Recv, for the device's receive goroutine, polls every 50 µs
// until WakeRecv.
type memLoop struct {
	addr netip.Addr
	peer *memLoop
	pf   icrc.Prefix // ICRC prefix of this end's flow to the peer

	mu   sync.Mutex
	q    [][]byte // received, not yet handed out
	free [][]byte
	wake atomic.Bool
	shut atomic.Bool
}

// newMemLoop returns the two ends of a link between a and b.
func newMemLoop(a, b netip.Addr) (*memLoop, *memLoop) {
	pf := func(src, dst netip.Addr) icrc.Prefix {
		return icrc.NewIPv4Prefix(&icrc.IPv4Pseudo{Src: src.As4(), Dst: dst.As4(), SrcPort: memLoopPort, DstPort: udp.Port})
	}
	la, lb := &memLoop{addr: a, pf: pf(a, b)}, &memLoop{addr: b, pf: pf(b, a)}
	la.peer, lb.peer = lb, la
	return la, lb
}

// memLoopPort is every packet's UDP source port on a memLoop.
const memLoopPort = 49152

func (l *memLoop) Send(pkts []udp.Packet) error {
	p := l.peer
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range pkts {
		icrc.Store(k.Buf, l.pf.Compute(0, k.Buf))
		var b []byte
		if n := len(p.free); n > 0 {
			b, p.free = p.free[n-1][:0], p.free[:n-1]
		}
		p.q = append(p.q, append(b, k.Buf...))
	}
	return nil
}

func (l *memLoop) TryRecv(pkts []udp.Packet) (int, error) {
	if l.shut.Load() {
		return 0, net.ErrClosed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n, got := 0, 0
	for ; n < len(l.q) && got < len(pkts); n++ {
		b := l.q[n]
		l.free = append(l.free, b)
		if icrc.Load(b) != l.peer.pf.Compute(0, b) {
			return got, errors.New("memLoop: bad ICRC")
		}
		pkts[got].Buf = append(pkts[got].Buf[:0], b...)
		pkts[got].Addr, pkts[got].SrcPort, pkts[got].TOS = l.peer.addr, memLoopPort, 0
		got++
	}
	l.q = append(l.q[:0], l.q[n:]...)
	return got, nil
}

func (l *memLoop) Recv(pkts []udp.Packet) (int, error) {
	for {
		n, err := l.TryRecv(pkts)
		if n > 0 || err != nil {
			return n, err
		}
		if l.wake.Swap(false) {
			return 0, nil
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// RecvPrefix: TryRecv fills pkts[:got] only, in the buffers given.
func (l *memLoop) RecvPrefix() bool { return true }

func (l *memLoop) WakeRecv()               { l.wake.Store(true) }
func (l *memLoop) BusyPoll() time.Duration { return time.Second }
func (l *memLoop) LocalAddr() netip.Addr   { return l.addr }
func (l *memLoop) BatchSize() int          { return 32 }
func (l *memLoop) Stats() udp.Stats        { return udp.Stats{} }
func (l *memLoop) Close() error            { l.shut.Store(true); return nil }
