//go:build linux

package udp

import (
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/udp/share"
)

// BenchmarkSharedRecv measures what the steering program of a shared
// address (SO_REUSEPORT group with the SK_REUSEPORT eBPF program of
// package udp/share) costs per received datagram: a sender link sends
// batches of 64 datagrams of 1 KiB (64 skbs, no GSO) to a shared link and
// to an unshared one on another address, alternately, and each batch is
// received by its link in the same goroutine. Metrics: CPU time (user +
// system, getrusage) per datagram of each, and the median over the pairs
// of runs of shared minus unshared — the steering's per-skb cost, which a
// raw UDP socket does not pay. Needs the capabilities of ShareOn (root);
// skipped otherwise.
func BenchmarkSharedRecv(b *testing.B) {
	if err := share.CheckCapabilities(); err != nil {
		b.Skipf("sharing needs: %v", err)
	}
	src := netip.MustParseAddr("127.0.0.91")
	listen := func(a netip.Addr, m ShareMode) *SocketLink { return benchListen(b, a, m) }
	tx := listen(src, ShareOff)
	ls := listen(netip.MustParseAddr("127.0.0.92"), ShareOn)
	lu := listen(netip.MustParseAddr("127.0.0.93"), ShareOff)
	first, _, err := ls.LeaseQPNs()
	if err != nil {
		b.Fatal(err)
	}
	const batch, size, rounds = 64, 1024, 200
	pkts := func(dst netip.Addr) []Packet {
		p := testPackets(batch, size, dst, 0)
		for i := range p { // a QPN the shared link owns
			p[i].Buf[5], p[i].Buf[6], p[i].Buf[7] = byte(first>>16), byte(first>>8), byte(first)
		}
		return p
	}
	pS, pU := pkts(ls.addr), pkts(lu.addr)
	in := recvBufs(batch)
	run := func(l *SocketLink, p []Packet) time.Duration {
		c0 := rusageCPU()
		for range rounds {
			if err := tx.Send(p); err != nil {
				b.Fatal(err)
			}
			for got := 0; got < batch; {
				k, err := l.Recv(in[:batch-got])
				if err != nil {
					b.Fatal(err)
				}
				got += k
			}
		}
		return rusageCPU() - c0
	}
	run(ls, pS) // warm up both
	run(lu, pU)
	var tS, tU time.Duration
	var diffs []float64
	for b.Loop() {
		s := run(ls, pS)
		u := run(lu, pU)
		tS += s
		tU += u
		diffs = append(diffs, float64((s-u).Nanoseconds())/(rounds*batch))
	}
	if st := ls.ShareStats(); st.Steered == 0 {
		b.Fatalf("the shared link's datagrams were not steered: %+v", st)
	}
	n := float64(b.N * rounds * batch)
	b.ReportMetric(float64(tS.Nanoseconds())/n, "shared-cpu-ns/dgram")
	b.ReportMetric(float64(tU.Nanoseconds())/n, "unshared-cpu-ns/dgram")
	slices.Sort(diffs)
	b.ReportMetric(diffs[len(diffs)/2], "steer-ns/dgram-median")
	b.ReportMetric(0, "ns/op")
}

// rusageCPU returns the process's user + system CPU time.
func rusageCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSharedRecvParts splits what BenchmarkSharedRecv measures: the
// same 1 KiB datagrams, received in turn by an unshared link and by three
// shared links (each alone in its group) that differ only in the
// group's program — the steering program, a program that only returns
// SK_PASS (the kernel then picks by hash: the one socket), and none
// (detached). Metrics, each the median over the rounds of the link's CPU
// per datagram minus the unshared link's: steer-ns (what sharing costs
// now), anyprog-ns (the kernel's cost of running any SK_REUSEPORT
// program), group-ns (a reuseport group without a program); steer-ns
// minus anyprog-ns is the steering program's own work. The two stand-in
// programs would misroute other members' datagrams, so each is set only
// on a group of which the benchmark's link is the only member (skipped
// otherwise). Needs the capabilities of ShareOn (root).
func BenchmarkSharedRecvParts(b *testing.B) {
	if err := share.CheckCapabilities(); err != nil {
		b.Skipf("sharing needs: %v", err)
	}
	listen := func(a string, m ShareMode) *SocketLink { return benchListen(b, netip.MustParseAddr(a), m) }
	alone := func(l *SocketLink) {
		st, err := share.ReadStatus(netip.AddrPortFrom(l.addr, Port), "")
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range st.Members {
			if m.Slot != l.ShareStats().Slot && m.State == "live" {
				b.Skipf("another member (slot %d, %s) shares %v: not replacing its program", m.Slot, m.State, l.addr)
			}
		}
	}
	tx := listen("127.0.0.91", ShareOff)
	unshared := listen("127.0.0.93", ShareOff)
	steer := listen("127.0.0.92", ShareOn)
	anyProg := listen("127.0.0.94", ShareOn)
	noProg := listen("127.0.0.95", ShareOn)
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SkReuseport, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		b.Fatal(err)
	}
	defer pass.Close()
	alone(anyProg)
	anyProg.rx.Control(func(fd uintptr) { err = share.AttachProgram(int(fd), pass.FD()) })
	if err != nil {
		b.Fatal(err)
	}
	alone(noProg)
	noProg.rx.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
	})
	if err != nil {
		b.Fatal(err)
	}
	const batch, size, rounds = 64, 1024, 200
	type part struct {
		l    *SocketLink
		p    []Packet
		cpu  []float64
		name string
	}
	var parts []*part
	for i, l := range []*SocketLink{unshared, steer, anyProg, noProg} {
		qpn := uint32(0x12345)
		if l.Shared() {
			if qpn, _, err = l.LeaseQPNs(); err != nil {
				b.Fatal(err)
			}
		}
		p := testPackets(batch, size, l.addr, 0)
		for i := range p {
			p[i].Buf[5], p[i].Buf[6], p[i].Buf[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
		}
		parts = append(parts, &part{l: l, p: p, name: []string{"", "steer", "anyprog", "group"}[i]})
	}
	in := recvBufs(batch)
	run := func(x *part) float64 {
		c0 := rusageCPU()
		for range rounds {
			if err := tx.Send(x.p); err != nil {
				b.Fatal(err)
			}
			for got := 0; got < batch; {
				k, err := x.l.Recv(in[:batch-got])
				if err != nil {
					b.Fatal(err)
				}
				got += k
			}
		}
		return float64((rusageCPU() - c0).Nanoseconds()) / (rounds * batch)
	}
	for _, x := range parts { // warm up
		run(x)
	}
	for b.Loop() {
		for _, x := range parts {
			x.cpu = append(x.cpu, run(x))
		}
	}
	if st := steer.ShareStats(); st.Steered == 0 {
		b.Fatalf("the steered link's datagrams were not steered: %+v", st)
	}
	for _, x := range parts[1:] {
		d := make([]float64, len(x.cpu))
		for i := range d {
			d[i] = x.cpu[i] - parts[0].cpu[i]
		}
		slices.Sort(d)
		b.ReportMetric(d[len(d)/2], x.name+"-ns/dgram")
	}
	b.ReportMetric(0, "ns/op")
}

// benchListen opens a SocketLink on a with sharing mode m for a
// benchmark, closed at its end; it skips the benchmark when the address
// is taken or missing.
func benchListen(b *testing.B, a netip.Addr, m ShareMode) *SocketLink {
	b.Helper()
	l, err := ListenSocket(a, &SocketOptions{Share: m})
	if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
		b.Skipf("UDP %v:4791 unavailable: %v", a, err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}
