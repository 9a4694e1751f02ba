//go:build linux

package udp

import (
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

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
	listen := func(a netip.Addr, m ShareMode) *SocketLink {
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
