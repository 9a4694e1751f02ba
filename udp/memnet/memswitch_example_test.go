package memnet_test

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/udp"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// A switch port in virtual time: ten ECN-capable packets sent at once
// into a 1 Gb/s port with room for eight queue up, the last two are
// tail-dropped, those that find more than Kmax queued are marked CE (and
// between Kmin and Kmax with a probability rising to Pmax), and
// the port drains one 1128-byte datagram every 9.024 µs. Step moves the
// network to the clock's time; NextEvent says when the next departure is.
func ExampleMemNetwork_Bottleneck() {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	n := memnet.NewVirtualMemNetwork(memnet.Faults{Seed: 1}, clock)
	a, _ := n.Link(netip.MustParseAddr("192.0.2.1"))
	b, _ := n.Link(netip.MustParseAddr("192.0.2.2"))
	defer a.Close()
	port, _ := n.Bottleneck(b.LocalAddr(), memnet.Bottleneck{
		Rate: 1e9, Buffer: 8 * 1128, Kmin: 2 * 1128, Kmax: 4 * 1128, Pmax: 0.5})

	// In virtual time every link needs a receiver: Step waits for it.
	got := make(chan string, 16)
	go func() {
		defer close(got)
		pkts := []udp.Packet{{Buf: make([]byte, udp.MaxPacketSize)}}
		for {
			pkts[0].Buf = pkts[0].Buf[:cap(pkts[0].Buf)]
			if _, err := b.Recv(pkts); err != nil {
				return
			}
			got <- fmt.Sprintf("packet %d CE=%v at %v", pkts[0].Buf[12], pkts[0].TOS&udp.ECNMask == udp.ECNCE, clock().Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
		}
	}()

	var out []udp.Packet
	for i := range 10 {
		p := make([]byte, 1100) // + 8 UDP + 20 IPv4 = 1128 bytes on the wire
		p[0] = 0x0a             // RC RDMA WRITE only
		p[12] = byte(i)
		out = append(out, udp.Packet{Buf: p, Addr: b.LocalAddr(), SrcPort: 0xc000, TOS: udp.ECNECT0})
	}
	a.Send(out)
	for {
		t, ok := n.NextEvent()
		if !ok {
			break
		}
		mu.Lock()
		now = t
		mu.Unlock()
		n.Step() // returns once the receiver is back in Recv
	}
	b.Close()
	for s := range got {
		fmt.Println(s)
	}
	st := port.Stats()
	fmt.Printf("enqueued %d, dropped %d, marked %d, max depth %d B\n", st.Enqueued, st.Dropped, st.Marked, st.MaxDepth)
	// Output:
	// packet 0 CE=false at 9.024µs
	// packet 1 CE=false at 18.048µs
	// packet 2 CE=false at 27.072µs
	// packet 3 CE=true at 36.096µs
	// packet 4 CE=false at 45.12µs
	// packet 5 CE=true at 54.144µs
	// packet 6 CE=true at 63.168µs
	// packet 7 CE=true at 72.192µs
	// enqueued 8, dropped 2, marked 4, max depth 9024 B
}
