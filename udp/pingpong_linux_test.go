//go:build linux

package udp

import (
	"testing"
)

// BenchmarkPingPong measures the round-trip time of one 64-byte packet
// between two goroutines over loopback, each side waiting for the other's
// packet: the Link's waiting path (SocketLink, default options) against
// two plain UDP sockets driven with blocking sendto/recvfrom, in the same
// run. Metric: µs/rtt.
func BenchmarkPingPong(b *testing.B) {
	const size = 64
	b.Run("raw-blocking", func(b *testing.B) {
		s := newRawUDP(b, sockA, 1)
		r := newRawUDP(b, sockB, 1)
		out := [][]byte{testPayload(make([]byte, size), 0, size)}
		stop := make(chan struct{})
		go func() {
			in := make([]byte, MaxPacketSize)
			for {
				if _, err := r.recvPlain(in); err != nil {
					return
				}
				select {
				case <-stop:
					return
				default:
				}
				r.sendPlain([][]byte{in[:size]}, sockA)
			}
		}()
		in := make([]byte, MaxPacketSize)
		for b.Loop() {
			if err := s.sendPlain(out, sockB); err != nil {
				b.Fatal(err)
			}
			if _, err := s.recvPlain(in); err != nil {
				b.Fatal(err)
			}
		}
		close(stop)
		s.sendPlain(out, sockB) // let the echo see stop
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rtt")
	})
	b.Run("SocketLink", func(b *testing.B) {
		a, c := listenPair(b)
		go func() {
			in := recvBufs(1)
			for {
				if _, err := c.Recv(in); err != nil {
					return
				}
				if err := c.Send([]Packet{{Buf: in[0].Buf, Addr: sockA}}); err != nil {
					return
				}
			}
		}()
		out := testPackets(1, size, sockB, 0)
		in := recvBufs(1)
		for b.Loop() {
			if err := a.Send(out); err != nil {
				b.Fatal(err)
			}
			if _, err := a.Recv(in); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rtt")
	})
}
