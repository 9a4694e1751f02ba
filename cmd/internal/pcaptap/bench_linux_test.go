//go:build linux

package pcaptap

import (
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/udp"
)

// BenchmarkTapSocket is the cost per packet of sending what one RDMA
// WRITE of 64 KiB hands the link (64 zero-copy packets of 1 KiB, one GSO
// datagram) over a real socket on loopback, with a receiver draining the
// other end: bare, and through a Tap recording to a file (Create: direct
// I/O where the file system takes it) whole and headers-only. The
// difference is what a capture costs the sender, cache misses and the
// file's writes included; the writer's BenchmarkWriteBatch sees only its
// own loop.
func BenchmarkTapSocket(b *testing.B) {
	id := os.Getpid()
	a := netip.AddrFrom4([4]byte{127, 97, byte(id >> 8), byte(id)})
	c := netip.AddrFrom4([4]byte{127, 98, byte(id >> 8), byte(id)})
	la := listenOrSkip(b, a, &udp.SocketOptions{GSO: true, Share: udp.ShareOff})
	defer la.Close()
	lc := listenOrSkip(b, c, &udp.SocketOptions{Share: udp.ShareOff})
	var drain sync.WaitGroup
	drain.Go(func() {
		rp := make([]udp.Packet, 64)
		for i := range rp {
			rp[i].Buf = make([]byte, udp.MaxPacketSize)
		}
		for {
			for i := range rp {
				rp[i].Buf = rp[i].Buf[:cap(rp[i].Buf)]
			}
			if _, err := lc.Recv(rp); err != nil {
				return
			}
		}
	})
	defer func() {
		lc.Close()
		drain.Wait()
	}()
	// The ICRCs are the link's (Send fills them in); zeroCopy needs a
	// packet whole to split.
	pkts := make([]udp.Packet, 64)
	for i := range pkts {
		p := build(b, 1024, uint32(i))
		icrc.Store(p, 0)
		pkts[i] = zeroCopy(udp.Packet{Buf: p, Addr: c, SrcPort: 0xc123})
	}
	for _, v := range []struct {
		name string
		snap int  // -1: no tap
		file bool // a file (Create), else io.Discard
	}{{"bare", -1, false}, {"whole", 0, true}, {"snaplen128", 128, true}, {"discard/whole", 0, false}, {"discard/snaplen128", 128, false}} {
		b.Run(v.name, func(b *testing.B) {
			var link udp.Link = la
			var w *Writer
			if v.snap >= 0 {
				var err error
				if v.file {
					w, err = Create(filepath.Join(b.TempDir(), "c.pcap"), v.snap)
				} else {
					w, err = NewWriterSnap(io.Discard, v.snap)
				}
				if err != nil {
					b.Fatal(err)
				}
				link = New(la, w, Both)
			}
			b.SetBytes(64 * 1024)
			cpu0 := cpuTime()
			for b.Loop() {
				if err := link.Send(pkts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(pkts)), "ns/packet")
			if w != nil {
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
			}
			// The process's CPU time (sender, receiver and file writers)
			// per packet: less at the mercy of other load than the
			// elapsed time.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*len(pkts)), "cpu-ns/packet")
			if w != nil {
				if w.Packets() != uint64(b.N*len(pkts)) || w.Unverified() != 0 {
					b.Fatalf("%d recorded, %d unverified, want %d and 0", w.Packets(), w.Unverified(), b.N*len(pkts))
				}
			}
		})
	}
}

// cpuTime returns the process's user and system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
