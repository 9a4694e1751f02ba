//go:build linux

package udp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
)

// BenchmarkLinkVsRaw measures, in the same run and interleaved (so that
// the load of a shared machine hits both alike), kernel UDP on loopback
// driven directly with one technique and the Link that uses the same
// technique, for 1 KiB and 4 KiB packets, 64 packets per exchange:
//
//	plain    raw: sendto/recvfrom per packet    link: SocketLink, BatchSize 1, no GRO
//	mmsg     raw: sendmmsg/recvmmsg ×64          link: SocketLink, no GRO
//	gso-gro  raw: UDP_SEGMENT + UDP_GRO          link: SocketLink, GSO + GRO
//	rawlink  raw: sendmmsg/recvmmsg ×64 (UDP)    link: RawLink (raw IPv4 sockets)
//
// The raw side moves bytes only; the Link also computes every ICRC on send
// and verifies it on receive (with GRO, in the same pass that copies each
// segment out of the coalesced buffer). Metrics: raw-pkts/s, link-pkts/s,
// link/raw, and link/(raw+icrc), where the time of the same ICRC
// computations (through icrc.Prefix, as the Link makes them), measured alone
// in the same loop, is added to the raw side: the Link's overhead beyond the
// work every RoCEv2 endpoint must do. Everything runs on one goroutine, so
// link/raw can be no higher than raw/(raw+icrc); BenchmarkLinkVsRawStream
// runs the two ends at once.
func BenchmarkLinkVsRaw(b *testing.B) {
	const batch = 64
	for _, size := range []int{1024, 4096} {
		for _, tech := range []string{"plain", "plain-tos", "mmsg", "gso-gro", "rawlink"} {
			b.Run(fmt.Sprintf("%s/%dKiB", tech, size/1024), func(b *testing.B) {
				benchLinkVsRaw(b, tech, size, batch)
			})
		}
	}
}

// techPair is one technique of BenchmarkLinkVsRaw and BenchmarkLinkVsRawStream:
// send and receive functions for the raw sockets and for the Links.
type techPair struct {
	rawSend, linkSend func() error
	rawRecv, linkRecv func(max int) (int, error)
}

// newTechPair opens the raw sockets and Links of technique tech for
// batches of batch packets of size bytes, closed at cleanup.
func newTechPair(b *testing.B, tech string, size, batch int) *techPair {
	s := newRawUDP(b, sockA, batch)
	r := newRawUDP(b, sockB, batch)
	out := make([][]byte, batch)
	in := make([][]byte, batch)
	for i := range out {
		out[i] = testPayload(make([]byte, size), uint32(i), size)
		in[i] = make([]byte, MaxPacketSize)
	}
	var rawSend func() error
	var rawRecv func(max int) (int, error)
	var sl, rl Link
	switch tech {
	case "plain":
		rawSend = func() error { return s.sendPlain(out, sockB) }
		rawRecv = func(int) (int, error) { return r.recvPlain(in[0]) }
		sl, rl = benchSocketPair(b, &SocketOptions{BatchSize: 1, NoGRO: true}, &SocketOptions{BatchSize: 1, NoGRO: true})
	case "plain-tos":
		r.enableTOS(b)
		rawSend = func() error { return s.sendPlain(out, sockB) }
		rawRecv = func(int) (int, error) { return r.recvTOS(in[0]) }
		sl, rl = benchSocketPair(b, &SocketOptions{BatchSize: 1, NoGRO: true}, &SocketOptions{BatchSize: 1, NoGRO: true})
	case "mmsg", "rawlink":
		rawSend = func() error { return s.send(out, sockB) }
		rawRecv = func(max int) (int, error) { return r.recv(in[:max]) }
		if tech == "mmsg" {
			sl, rl = benchSocketPair(b, &SocketOptions{NoGRO: true}, &SocketOptions{NoGRO: true})
		} else {
			sl, rl = listenRaw(b, sockA), listenRaw(b, sockB)
		}
	case "gso-gro":
		r.enableGRO(b)
		rawSend = func() error { return s.sendGSO(out, sockB) }
		rawRecv = func(int) (int, error) { return r.recvGRO() }
		sl, rl = benchSocketPair(b, &SocketOptions{GSO: true}, &SocketOptions{})
	}
	linkSend, linkRecv := linkExchange(sl, rl, testPackets(batch, size, sockB, 0xc000))
	return &techPair{rawSend: rawSend, rawRecv: rawRecv, linkSend: linkSend, linkRecv: linkRecv}
}

func benchLinkVsRaw(b *testing.B, tech string, size, batch int) {
	tp := newTechPair(b, tech, size, batch)
	rawSend, rawRecv, linkSend, linkRecv := tp.rawSend, tp.rawRecv, tp.linkSend, tp.linkRecv
	exchange(b, batch, rawSend, rawRecv) // warm up both
	exchange(b, batch, linkSend, linkRecv)
	b.SetBytes(int64(2 * size * batch))
	b.ReportAllocs()
	// The ICRC work the Link does on top of the raw technique, timed
	// alone: compute on send, solve/verify on receive, per packet.
	pk := testPackets(batch, size, sockB, 0xc000)
	txp := icrc.NewIPv4Prefix(&icrc.IPv4Pseudo{Src: sockA.As4(), Dst: sockB.As4(), FlagsFrag: 0x4000, SrcPort: Port, DstPort: Port})
	rxp := txp // the same flow seen from the receiver
	icrcWork := func() {
		for i := range pk {
			buf := pk[i].Buf
			storeICRC(buf, txp.Compute(uint16(i%gsoSegsPerDatagram(size)), buf))
			if _, ok := rxp.SolveIPv4ID(buf); !ok {
				b.Fatal("ICRC does not verify")
			}
		}
	}
	var tRaw, tLink, tICRC time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		icrcWork()
		tICRC += time.Since(t0)
		if i%2 == 0 {
			tRaw += timeExchange(b, batch, rawSend, rawRecv)
			tLink += timeExchange(b, batch, linkSend, linkRecv)
		} else {
			tLink += timeExchange(b, batch, linkSend, linkRecv)
			tRaw += timeExchange(b, batch, rawSend, rawRecv)
		}
	}
	n := float64(b.N * batch)
	b.ReportMetric(n/tRaw.Seconds(), "raw-pkts/s")
	b.ReportMetric(n/tLink.Seconds(), "link-pkts/s")
	b.ReportMetric(tRaw.Seconds()/tLink.Seconds(), "link/raw")
	b.ReportMetric((tRaw+tICRC).Seconds()/tLink.Seconds(), "link/(raw+icrc)")
	// The most link/raw any endpoint doing the ICRC work on this one core
	// could reach.
	b.ReportMetric(tRaw.Seconds()/(tRaw+tICRC).Seconds(), "bound")
}

// BenchmarkLinkVsRawStream is BenchmarkLinkVsRaw with the two ends running
// at once, as two endpoints do: a sender goroutine sends batches of 64
// packets while a receiver goroutine receives them (GOMAXPROCS 2 on this
// machine: both cores), with a window of streamWindow packets in flight (so
// neither side overruns the other's socket buffer). Raw and Link runs alternate in the
// same loop. Where the serial exchange adds up every cost on one core, this
// measures the throughput of the slower end: on loopback the sender, whose
// system call carries the datagram through the whole stack to the
// receiving socket. It is noisier than the serial exchange on a shared VM
// (where the two goroutines run matters), so read it over several runs.
// Metrics: raw-pkts/s, link-pkts/s, link/raw, and the median, 10th and 90th
// percentile of link/raw over the adjacent pairs of runs.
func BenchmarkLinkVsRawStream(b *testing.B) {
	const batch = 64
	for _, size := range []int{1024, 4096} {
		for _, tech := range []string{"plain", "plain-tos", "mmsg", "gso-gro", "rawlink"} {
			b.Run(fmt.Sprintf("%s/%dKiB", tech, size/1024), func(b *testing.B) {
				tp := newTechPair(b, tech, size, batch)
				const rounds = 32                                   // batches per timed stream
				streamRun(b, batch, rounds, tp.rawSend, tp.rawRecv) // warm up both
				streamRun(b, batch, rounds, tp.linkSend, tp.linkRecv)
				b.SetBytes(int64(size * batch * rounds))
				var tRaw, tLink time.Duration
				var pairs []float64 // link/raw of each adjacent pair of runs
				for i := 0; b.Loop(); i++ {
					var r, l time.Duration
					if i%2 == 0 {
						r = streamRun(b, batch, rounds, tp.rawSend, tp.rawRecv)
						l = streamRun(b, batch, rounds, tp.linkSend, tp.linkRecv)
					} else {
						l = streamRun(b, batch, rounds, tp.linkSend, tp.linkRecv)
						r = streamRun(b, batch, rounds, tp.rawSend, tp.rawRecv)
					}
					tRaw += r
					tLink += l
					pairs = append(pairs, r.Seconds()/l.Seconds())
				}
				n := float64(b.N * batch * rounds)
				b.ReportMetric(n/tRaw.Seconds(), "raw-pkts/s")
				b.ReportMetric(n/tLink.Seconds(), "link-pkts/s")
				b.ReportMetric(tRaw.Seconds()/tLink.Seconds(), "link/raw")
				slices.Sort(pairs)
				b.ReportMetric(pairs[len(pairs)/2], "link/raw-median")
				b.ReportMetric(pairs[len(pairs)/10], "link/raw-p10")
				b.ReportMetric(pairs[len(pairs)*9/10], "link/raw-p90")
			})
		}
	}
}

// streamWindow is how many packets the sender of streamRun may be ahead of
// the receiver: 256 packets of 4 KiB take about 2 MiB of the 8 MiB receive
// buffers, counting the kernel's per-datagram overhead.
const streamWindow = 256

// streamRun sends rounds batches of batch packets with send while a second
// goroutine receives them with recv, and returns how long it took until the
// last packet was received. A receive error, or a stream that makes no
// progress for 10 s (a lost packet), fails the benchmark with what
// happened; nothing waits forever.
func streamRun(b *testing.B, batch, rounds int, send func() error, recv func(max int) (int, error)) time.Duration {
	total := batch * rounds
	var got atomic.Int64
	var recvErr atomic.Pointer[error]
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(done)
		n := 0
		for n < total {
			k, err := recv(min(batch, total-n))
			if err != nil {
				err = fmt.Errorf("receive after %d of %d packets: %w", n, total, err)
				recvErr.Store(&err)
				return
			}
			n += k
			got.Store(int64(n))
		}
	}()
	stalled := func() {
		if e := recvErr.Load(); e != nil {
			b.Fatal(*e)
		}
		b.Fatalf("stream stalled at %d of %d packets for 10 s (lost in the kernel?)", got.Load(), total)
	}
	for r := range rounds {
		var since time.Time
		for int64(r*batch)-got.Load() > streamWindow-int64(batch) {
			if recvErr.Load() != nil {
				stalled()
			}
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) > 10*time.Second {
				stalled()
			}
			runtime.Gosched()
		}
		if err := send(); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-done:
		if recvErr.Load() != nil {
			stalled()
		}
	case <-time.After(10 * time.Second):
		stalled()
	}
	return time.Since(t0)
}

// timeExchange runs one exchange and returns how long it took.
func timeExchange(b *testing.B, batch int, send func() error, recv func(max int) (int, error)) time.Duration {
	t0 := time.Now()
	exchange(b, batch, send, recv)
	return time.Since(t0)
}

// benchSocketPair opens SocketLinks on sockA and sockB, closed at cleanup.
func benchSocketPair(b *testing.B, oa, ob *SocketOptions) (Link, Link) {
	a, c := listenPairOpts(b, oa, ob)
	return a, c
}

// sendPlain sends each buffer with its own sendto to dst.
func (r *rawUDP) sendPlain(bufs [][]byte, dst netip.Addr) error {
	sa := &r.names[0]
	sa.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], Port+1)
	sa.Addr = dst.As4()
	for _, b := range bufs {
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(r.fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0,
			uintptr(unsafe.Pointer(sa)), unix.SizeofSockaddrInet4)
		if e != 0 {
			return e
		}
	}
	return nil
}

// recvPlain receives one datagram (and its source address) with recvfrom.
func (r *rawUDP) recvPlain(buf []byte) (int, error) {
	alen := uint32(unix.SizeofSockaddrInet4)
	var e unix.Errno
	for {
		_, _, e = unix.Syscall6(unix.SYS_RECVFROM, uintptr(r.fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0,
			uintptr(unsafe.Pointer(&r.names[0])), uintptr(unsafe.Pointer(&alen)))
		if !interrupted(e) {
			break
		}
	}
	if e != 0 {
		return 0, e
	}
	return 1, nil
}

// enableTOS turns IP_RECVTOS on, for recvTOS.
func (r *rawUDP) enableTOS(b testing.TB) {
	if err := unix.SetsockoptInt(r.fd, unix.IPPROTO_IP, unix.IP_RECVTOS, 1); err != nil {
		b.Fatal(err)
	}
	r.ctrl = make([]byte, cmsgSpace)
}

// recvTOS receives one datagram, its source address and its TOS byte (an
// IP_TOS control message) with recvmsg: what a receiver that reads ECN per
// packet, as the Link does, must do at the least.
func (r *rawUDP) recvTOS(buf []byte) (int, error) {
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(len(buf))
	h := unix.Msghdr{Name: (*byte)(unsafe.Pointer(&r.names[0])), Namelen: unix.SizeofSockaddrInet4, Iov: &iov, Control: &r.ctrl[0]}
	h.SetIovlen(1)
	h.SetControllen(len(r.ctrl))
	var e unix.Errno
	for {
		_, _, e = unix.Syscall(unix.SYS_RECVMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&h)), 0)
		if !interrupted(e) {
			break
		}
	}
	if e != 0 {
		return 0, e
	}
	if h.Controllen == 0 {
		return 0, fmt.Errorf("recvTOS: no IP_TOS control message")
	}
	r.tos = parseCmsgs(r.ctrl[:h.Controllen]).tos
	return 1, nil
}

// gsoSegsPerDatagram is how many packets of size bytes one GSO datagram
// carries (the same limits SocketLink uses).
func gsoSegsPerDatagram(size int) int { return min(gsoMaxSegs, gsoMaxBytes/size) }

// sendGSO sends bufs (all of one size) as UDP GSO datagrams with one
// sendmmsg: each message gathers up to gsoSegsPerDatagram buffers and
// carries a UDP_SEGMENT control message.
func (r *rawUDP) sendGSO(bufs [][]byte, dst netip.Addr) error {
	size := len(bufs[0])
	g := gsoSegsPerDatagram(size)
	if r.gsoIovs == nil {
		r.gsoIovs = make([]unix.Iovec, len(r.hdrs))
		r.ctrl = make([]byte, len(r.hdrs)*cmsgSpace)
	}
	nmsg := 0
	for i := 0; i < len(bufs); i += g {
		k := min(g, len(bufs)-i)
		for j := range k {
			r.gsoIovs[i+j].Base = &bufs[i+j][0]
			r.gsoIovs[i+j].SetLen(size)
		}
		h := &r.hdrs[nmsg].Hdr
		h.Iov = &r.gsoIovs[i]
		h.SetIovlen(k)
		r.names[nmsg].Family = unix.AF_INET
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&r.names[nmsg].Port))[:], Port+1)
		r.names[nmsg].Addr = dst.As4()
		h.Namelen = unix.SizeofSockaddrInet4
		c := r.ctrl[nmsg*cmsgSpace:]
		h.Control = &c[0]
		h.SetControllen(putGSOCmsg(c, uint16(size)))
		nmsg++
	}
	defer func() {
		for i := range nmsg { // back to one iovec, no control, for send/recv
			h := &r.hdrs[i].Hdr
			h.Iov = &r.iovs[i]
			h.SetIovlen(1)
			h.Control = nil
			h.SetControllen(0)
		}
	}()
	for off := 0; off < nmsg; {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.hdrs[off])), uintptr(nmsg-off), 0, 0, 0)
		if e != 0 {
			return e
		}
		off += int(n)
	}
	return nil
}

// enableGRO turns UDP_GRO on and gives r 64 KiB receive buffers.
func (r *rawUDP) enableGRO(b testing.TB) {
	if err := unix.SetsockoptInt(r.fd, unix.SOL_UDP, unix.UDP_GRO, 1); err != nil {
		b.Fatal(err)
	}
	r.groMem = make([]byte, len(r.hdrs)*groBufSize)
	r.groCtrl = make([]byte, len(r.hdrs)*cmsgSpace)
	r.groIov = make([]unix.Iovec, len(r.hdrs))
}

// recvGRO receives coalesced datagrams with one recvmmsg and returns the
// number of packets (segments) in them.
func (r *rawUDP) recvGRO() (int, error) {
	k := len(r.hdrs)
	for i := range k {
		r.gro(i)
	}
	defer func() {
		for i := range k {
			h := &r.hdrs[i].Hdr
			h.Iov = &r.iovs[i]
			h.Control = nil
			h.SetControllen(0)
		}
	}()
	var n uintptr
	var e unix.Errno
	for {
		n, _, e = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(k), unix.MSG_WAITFORONE, 0, 0)
		if !interrupted(e) {
			break
		}
	}
	if e != 0 {
		return 0, e
	}
	segs := 0
	for i := range int(n) {
		m := &r.hdrs[i]
		seg := parseCmsgs(r.groCtrl[i*cmsgSpace : i*cmsgSpace+int(m.Hdr.Controllen)]).groSize
		if seg <= 0 {
			segs++
		} else {
			segs += (int(m.Len) + seg - 1) / seg
		}
	}
	return segs, nil
}

// gro readies message i for a GRO receive into its 64 KiB buffer.
func (r *rawUDP) gro(i int) {
	h := &r.hdrs[i].Hdr
	r.groIov[i].Base = &r.groMem[i*groBufSize]
	r.groIov[i].SetLen(groBufSize)
	h.Iov = &r.groIov[i]
	h.SetIovlen(1)
	h.Namelen = unix.SizeofSockaddrInet4
	h.Control = &r.groCtrl[i*cmsgSpace]
	h.SetControllen(cmsgSpace)
}

// storeICRC is a helper of the ICRC baseline.
func storeICRC(b []byte, v uint32) { icrc.Store(b, v) }
