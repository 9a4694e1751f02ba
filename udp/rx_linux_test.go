//go:build linux

package udp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// epollTargets returns how many descriptors the rxConn's private epoll
// instance watches, from /proc/self/fdinfo ("tfd:" lines).
func epollTargets(t *testing.T, c *rxConn) int {
	t.Helper()
	var efd uintptr
	if err := c.erc.Control(func(fd uintptr) { efd = fd }); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", efd))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "tfd:")
}

// TestRxConnWatchedOnlyWhileWaiting checks the point of rxConn: while
// the receiver finds data without waiting, the receive socket is in no
// epoll set (so an arriving datagram wakes nobody); a Recv that finds it
// empty adds it and is woken by the next datagram; the socket stays in the
// set while Recvs keep waiting and leaves after leaveAfter Recvs in a row
// did not wait.
func TestRxConnWatchedOnlyWhileWaiting(t *testing.T) {
	// No GRO: then every Recv of one packet is one receive call (with GRO
	// one call may take several queued datagrams).
	a, b := listenPairOpts(t, &SocketOptions{NoGRO: true}, &SocketOptions{NoGRO: true})
	out := testPackets(1, 256, sockB, 0)
	in := recvBufs(1)
	send := func(n int) {
		t.Helper()
		for range n {
			if err := a.Send(out); err != nil {
				t.Fatal(err)
			}
		}
	}
	recv := func(n int) {
		t.Helper()
		for range n {
			if n, err := b.Recv(in); n != 1 || err != nil {
				t.Fatalf("Recv = %d, %v", n, err)
			}
		}
	}
	targets := func(want int, when string) {
		t.Helper()
		if n := epollTargets(t, b.rx); n != want {
			t.Fatalf("%s: epoll watches %d descriptors, want %d", when, n, want)
		}
	}
	targets(0, "idle link")
	send(3)
	targets(0, "after arrivals without a waiter")
	recv(3)
	if w := b.rx.waits.Load(); w != 0 {
		t.Fatalf("%d receives of queued datagrams waited, want 0", w)
	}
	targets(0, "after receiving queued datagrams")

	// Two rounds of a Recv on an empty socket, woken by a datagram.
	for round := range 2 {
		done := make(chan error, 1)
		go func() {
			n, err := b.Recv(in)
			if err == nil && n != 1 {
				err = fmt.Errorf("Recv = %d packets", n)
			}
			done <- err
		}()
		deadline := time.Now().Add(10 * time.Second)
		for epollTargets(t, b.rx) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: Recv on an empty socket did not add it to the epoll set in 10 s", round)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond) // let it park
		send(1)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: woken Recv: %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: a datagram did not wake the waiting Recv in 10 s", round)
		}
		if w := b.rx.waits.Load(); w != uint64(round+1) {
			t.Fatalf("round %d: waits = %d, want %d", round, w, round+1)
		}
		targets(1, "after a wakeup (a waiting receiver stays in the set)")
	}
	send(leaveAfter)
	recv(leaveAfter - 1)
	targets(1, "after leaveAfter-1 receives without waiting")
	recv(1)
	targets(0, "after leaveAfter receives without waiting")
}

// TestRxConnNoLostWakeup runs a ping-pong in which each side sends as soon
// as the other's Recv found its socket empty, which races the datagram
// against the adding of the socket to the epoll set; every round must
// complete (a lost wakeup would hang until the watchdog closes the links).
func TestRxConnNoLostWakeup(t *testing.T) {
	a, b := listenPair(t)
	rounds := 3000
	if testing.Short() {
		rounds = 500
	}
	watchdog := time.AfterFunc(60*time.Second, func() { a.Close(); b.Close() })
	defer watchdog.Stop()
	errc := make(chan error, 1)
	go func() { // echo on b
		in := recvBufs(1)
		for {
			n, err := b.Recv(in)
			if err != nil {
				errc <- err
				return
			}
			_ = n
			out := []Packet{{Buf: in[0].Buf, Addr: sockA}}
			if err := b.Send(out); err != nil {
				errc <- err
				return
			}
		}
	}()
	in := recvBufs(1)
	out := testPackets(1, 64, sockB, 0)
	for i := range rounds {
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Recv(in); err != nil {
			t.Fatalf("round %d of %d: %v (a lost wakeup is ended by the 60 s watchdog)", i, rounds, err)
		}
	}
	if a.rx.waits.Load() == 0 || b.rx.waits.Load() == 0 {
		t.Fatalf("waits a=%d b=%d: the waiting path was not exercised", a.rx.waits.Load(), b.rx.waits.Load())
	}
	b.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("echo after Close: %v, want net.ErrClosed", err)
	}
}
