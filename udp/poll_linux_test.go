//go:build linux

package udp

import (
	"errors"
	"net"
	"testing"
	"time"
)

// TestSocketTryRecv: TryRecv never waits — 0 packets and no error on an
// empty socket — and returns what arrived, verified like Recv's, with and
// without GRO; after Close it fails with net.ErrClosed.
func TestSocketTryRecv(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    *SocketOptions
	}{
		{"gro", nil},
		{"nogro", &SocketOptions{NoGRO: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := listenPairOpts(t, nil, tc.o)
			in := recvBufs(8)
			if n, err := b.TryRecv(in); n != 0 || err != nil {
				t.Fatalf("TryRecv on an empty socket = %d, %v; want 0, nil", n, err)
			}
			if err := a.Send(testPackets(3, 64, sockB, 0)); err != nil {
				t.Fatal(err)
			}
			got := 0
			// Loopback delivers within the sendmmsg call; the bound only
			// keeps a broken TryRecv from looping forever.
			for try := 0; got < 3 && try < 1_000_000; try++ {
				n, err := b.TryRecv(in)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range in[:n] {
					if seq := seqOf(p.Buf); seq != uint32(got) || len(p.Buf) != 64 || p.Addr != sockA {
						t.Fatalf("packet %d: seq %d, %d bytes from %v", got, seq, len(p.Buf), p.Addr)
					}
					got++
				}
			}
			if got != 3 {
				t.Fatalf("TryRecv returned %d of 3 packets", got)
			}
			if n, err := b.TryRecv(in); n != 0 || err != nil {
				t.Fatalf("TryRecv after draining = %d, %v; want 0, nil", n, err)
			}
			b.Close()
			if _, err := b.TryRecv(in); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("TryRecv after Close: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestSocketWakeRecv: WakeRecv makes a Recv that waits in the poller, or
// busy-polls, return 0 packets and no error; a WakeRecv with no Recv
// waiting makes the next one return so, once; packets still arrive after.
func TestSocketWakeRecv(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    *SocketOptions
	}{
		{"blocking", nil},
		{"busypoll", &SocketOptions{BusyPoll: time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := listenPairOpts(t, nil, tc.o)
			type res struct {
				n   int
				err error
			}
			recv := func() chan res {
				c := make(chan res, 1)
				go func() {
					n, err := b.Recv(recvBufs(4))
					c <- res{n, err}
				}()
				return c
			}
			c := recv()
			// Wake until the Recv returns: a WakeRecv that lands before
			// the goroutine entered Recv is consumed by it just the same.
			var r res
			for done := false; !done; {
				b.WakeRecv()
				select {
				case r = <-c:
					done = true
				case <-time.After(10 * time.Millisecond):
				}
			}
			if r.n != 0 || r.err != nil {
				t.Fatalf("woken Recv = %d, %v; want 0, nil", r.n, r.err)
			}
			// A wake-up pending for no one ends the next Recv only.
			b.WakeRecv()
			if n, err := b.Recv(recvBufs(4)); n != 0 || err != nil {
				t.Fatalf("Recv after a pending WakeRecv = %d, %v; want 0, nil", n, err)
			}
			if err := a.Send(testPackets(1, 64, sockB, 0)); err != nil {
				t.Fatal(err)
			}
			select {
			case r = <-recv():
			case <-time.After(10 * time.Second):
				t.Fatal("no packet after the wake-ups")
			}
			if r.n != 1 || r.err != nil {
				t.Fatalf("Recv after the wake-ups = %d, %v; want 1, nil", r.n, r.err)
			}
			if b.BusyPoll() != tc.o.busyPoll() {
				t.Fatalf("BusyPoll() = %v", b.BusyPoll())
			}
		})
	}
}

func (o *SocketOptions) busyPoll() time.Duration {
	if o == nil {
		return 0
	}
	return o.BusyPoll
}
