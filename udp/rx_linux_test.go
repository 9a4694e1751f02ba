//go:build linux

package udp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// epollTargets returns how many epoll registrations of the process watch
// the rxConn's socket (Go's poller holds one while the socket is a member),
// from /proc/self/fdinfo of every epoll descriptor ("tfd:" lines with the
// socket's inode).
func epollTargets(t *testing.T, c *rxConn) int {
	t.Helper()
	var st unix.Stat_t
	var serr error
	if err := c.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	ino := fmt.Sprintf(" ino:%x ", st.Ino)
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || l != "anon_inode:[eventpoll]" {
			continue
		}
		b, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue // closed in between
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "tfd:") && strings.Contains(line+" ", ino) {
				n++
			}
		}
	}
	return n
}

// rxHarness is a pair of links without GRO (every Recv of one packet is
// one receive call; with GRO one call may take several queued datagrams)
// for the rxConn tests: b receives what a sends.
type rxHarness struct {
	t       *testing.T
	a, b    *SocketLink
	out, in []Packet
}

func newRxHarness(t *testing.T) *rxHarness {
	a, b := listenPairOpts(t, &SocketOptions{NoGRO: true}, &SocketOptions{NoGRO: true})
	return &rxHarness{t: t, a: a, b: b, out: testPackets(1, 256, sockB, 0), in: recvBufs(1)}
}

// send sends n one-packet datagrams from a to b.
func (h *rxHarness) send(n int) {
	h.t.Helper()
	for range n {
		if err := h.a.Send(h.out); err != nil {
			h.t.Fatal(err)
		}
	}
}

// recv receives n packets on b, one per Recv.
func (h *rxHarness) recv(n int) {
	h.t.Helper()
	for range n {
		if n, err := h.b.Recv(h.in); n != 1 || err != nil {
			h.t.Fatalf("Recv = %d, %v", n, err)
		}
	}
}

// start runs one Recv of one packet on b in a goroutine.
func (h *rxHarness) start() chan error {
	done := make(chan error, 1)
	go func() {
		n, err := h.b.Recv(h.in)
		if err == nil && n != 1 {
			err = fmt.Errorf("Recv = %d packets", n)
		}
		done <- err
	}()
	return done
}

// wait waits for start's Recv to return without an error.
func (h *rxHarness) wait(done chan error, what string) {
	h.t.Helper()
	select {
	case err := <-done:
		if err != nil {
			h.t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatalf("%s: Recv did not return in 10 s", what)
	}
}

// waitedRecv has a Recv on an empty socket join the poller, wait, and be
// woken by a datagram.
func (h *rxHarness) waitedRecv(what string) {
	h.t.Helper()
	done := h.start()
	deadline := time.Now().Add(10 * time.Second)
	for epollTargets(h.t, h.b.rx) != 1 {
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: Recv on an empty socket did not join the poller in 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond) // let it park
	h.send(1)
	h.wait(done, what)
}

// TestRxConnWatchedOnlyWhileWaiting checks the point of rxConn: while
// the receiver finds data without waiting, the receive socket is in no
// epoll set (so an arriving datagram wakes nobody); a Recv that finds it
// empty adds it and is woken by the next datagram; the socket stays in the
// set while Recvs keep waiting and leaves after leaveAfter Recvs in a row
// did not wait.
func TestRxConnWatchedOnlyWhileWaiting(t *testing.T) {
	h := newRxHarness(t)
	b, send, recv := h.b, h.send, h.recv
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
		h.waitedRecv(fmt.Sprintf("round %d", round))
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

// TestRxConnStaysWhenWaitingOften: a receiver that waits every few Recvs
// — each wait followed by leaveAfter+1 Recvs of queued datagrams — left
// the poller after every burst and joined it again at the next wait (five
// system calls and an os.File a round). Joining again within fewer Recvs
// than it took to leave doubles that streak, so from the second round on
// the socket stays in the epoll set through the bursts; a receiver that
// then stays away long enough leaves after leaveAfter again.
func TestRxConnStaysWhenWaitingOften(t *testing.T) {
	h := newRxHarness(t)
	b, send, recv := h.b, h.send, h.recv
	// wait has a Recv find the socket empty and be woken by a datagram
	// (tried again if the Recv started only after the datagram came).
	wait := func(round int) {
		t.Helper()
		for try := 0; ; try++ {
			waits := b.rx.waits.Load()
			done := h.start()
			time.Sleep(5 * time.Millisecond) // let it find the socket empty and park
			send(1)
			h.wait(done, fmt.Sprintf("round %d", round))
			if b.rx.waits.Load() != waits {
				return
			}
			if try == 20 {
				t.Fatalf("round %d: no Recv of 20 waited", round)
			}
		}
	}
	burst := leaveAfter + 1
	for round := range 4 {
		wait(round)
		send(burst)
		recv(burst)
		n := epollTargets(t, b.rx)
		if round == 0 && n != 0 {
			t.Fatalf("round 0: epoll watches %d descriptors after %d Recvs without waiting, want 0 (left)", n, burst)
		}
		if round > 0 && n != 1 {
			t.Fatalf("round %d: epoll watches %d descriptors after a burst of %d, want 1 (the socket joined again within %d Recvs of leaving)", round, n, burst, burst)
		}
	}
	// A long stream without waiting: out after the longer streak, and the
	// next join, after a long absence, halves the streak again.
	send(leaveMax)
	recv(leaveMax)
	if n := epollTargets(t, b.rx); n != 0 {
		t.Fatalf("after %d Recvs without waiting: epoll watches %d descriptors, want 0", leaveMax, n)
	}
	if b.rx.need != 2*leaveAfter {
		t.Fatalf("need = %d after the flapping rounds, want %d (doubled once)", b.rx.need, 2*leaveAfter)
	}
	wait(4)
	if b.rx.need != leaveAfter {
		t.Fatalf("need = %d after joining after a long absence, want %d (halved)", b.rx.need, leaveAfter)
	}
}

// TestRxConnProbeAfterWait: a Read that follows one that waited makes its
// first attempt a peek, and waits for a socket the peek found empty
// without the full receive call; a datagram that is already queued when
// such a Read starts is received at once, without waiting.
func TestRxConnProbeAfterWait(t *testing.T) {
	h := newRxHarness(t)
	b, start, wait, waitedRecv := h.b, h.start, h.wait, h.waitedRecv
	send := func() { t.Helper(); h.send(1) }
	waitedRecv("first wait")
	if w, p := b.rx.waits.Load(), b.rx.probes.Load(); w != 1 || p != 0 {
		t.Fatalf("after the first wait: waits %d probes %d, want 1 and 0 (no Read waited before it)", w, p)
	}
	waitedRecv("wait after a wait")
	if w, p := b.rx.waits.Load(), b.rx.probes.Load(); w != 2 || p != 1 {
		t.Fatalf("after a wait that followed a wait: waits %d probes %d, want 2 and 1 (its first attempt a peek)", w, p)
	}
	// The datagram is queued (and its readiness taken by the poller)
	// before the Read starts: the peek finds it and the Read receives it
	// without waiting for another.
	send()
	time.Sleep(5 * time.Millisecond)
	wait(start(), "queued datagram after a wait")
	if w, p := b.rx.waits.Load(), b.rx.probes.Load(); w != 2 || p != 1 {
		t.Fatalf("after a queued datagram: waits %d probes %d, want 2 and 1 (received at the first attempt)", w, p)
	}
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

// TestRxConnStress runs pairs of a plain sending socket and an rxConn
// reader: bursts of 1..12 datagrams, sometimes streamed on without waiting
// for the reader, and random pauses on both sides, so that arrivals race
// every step of joining, waiting and leaving the epoll set. Every burst must
// be received within 5 s; a lost wakeup shows as datagrams left queued
// (reported with the socket's queue length and epoll membership). A
// variant of this test (by the udp review) caught a planted wakeup race
// that TestRxConnNoLostWakeup misses.
func TestRxConnStress(t *testing.T) {
	if testing.Short() {
		t.Skip("3 s stress test; runs without -short")
	}
	const pairs = 4
	dur := 3 * time.Second
	var wg sync.WaitGroup
	var total, waits atomic.Uint64
	for pi := range pairs {
		rx, err := openRecvSocket(netip.AddrPortFrom(sockB, 0), unix.SOCK_DGRAM, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		var port int
		rx.Control(func(fd uintptr) {
			if sa, err := unix.Getsockname(int(fd)); err == nil {
				port = sa.(*unix.SockaddrInet4).Port
			}
		})
		sfd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		to := &unix.SockaddrInet4{Port: port, Addr: sockB.As4()}
		got := make(chan struct{}, 4096)
		wg.Add(2)
		go func() { // reader
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(pi), 99))
			buf := make([]byte, 2048)
			f := func(fd uintptr) bool {
				_, _, e := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
				return e != unix.EAGAIN
			}
			for {
				if err := rx.Read(f); err != nil {
					if !errors.Is(err, net.ErrClosed) {
						t.Errorf("pair %d: Read: %v", pi, err)
					}
					return
				}
				got <- struct{}{}
				stressPause(r)
			}
		}()
		go func() { // sender
			defer wg.Done()
			defer unix.Close(sfd)
			defer rx.Close()
			r := rand.New(rand.NewPCG(uint64(pi), 7))
			msg := make([]byte, 64)
			outstanding := 0
			for end := time.Now().Add(dur); time.Now().Before(end); {
				k := 1 + r.IntN(12)
				for range k {
					if err := unix.Sendto(sfd, msg, 0, to); err != nil {
						t.Errorf("pair %d: send: %v", pi, err)
						return
					}
					if r.IntN(3) == 0 {
						stressPause(r)
					}
				}
				outstanding += k
				if outstanding < 64 && r.IntN(4) == 0 {
					continue // stream on without waiting for the reader
				}
				timeout := time.After(5 * time.Second)
				for ; outstanding > 0; outstanding-- {
					select {
					case <-got:
						total.Add(1)
					case <-timeout:
						var inq int
						rx.Control(func(fd uintptr) { inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
						t.Errorf("pair %d: %d datagrams not received in 5 s; %d bytes queued, epoll targets %d: a lost wakeup",
							pi, outstanding, inq, epollTargets(t, rx))
						return
					}
				}
				stressPause(r)
			}
			waits.Add(rx.waits.Load())
		}()
	}
	wg.Wait()
	if waits.Load() == 0 {
		t.Fatalf("%d datagrams and no Read waited: the test did not exercise waiting", total.Load())
	}
	t.Logf("%d datagrams, %d waits", total.Load(), waits.Load())
}

// stressPause does nothing, yields, spins or sleeps for a few µs, at random.
func stressPause(r *rand.Rand) {
	switch r.IntN(8) {
	case 3:
		runtime.Gosched()
	case 4:
		for end := time.Now().Add(time.Duration(r.IntN(20)) * time.Microsecond); time.Now().Before(end); {
		}
	case 5:
		time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
	case 6:
		time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond)
	}
}

// TestRxConnBusyPollLeaves: receives served by busy polling (which go
// through Control, not Read) also count as not waiting, so a busy-polling
// receiver leaves the epoll set too.
func TestRxConnBusyPollLeaves(t *testing.T) {
	a, b := listenPairOpts(t, &SocketOptions{NoGRO: true}, &SocketOptions{NoGRO: true, BusyPoll: time.Millisecond})
	out := testPackets(1, 128, sockB, 0)
	in := recvBufs(1)
	done := make(chan error, 1)
	go func() { _, err := b.Recv(in); done <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for epollTargets(t, b.rx) != 1 { // the poll gave up and Read waits
		if time.Now().After(deadline) {
			t.Fatal("Recv on an empty socket did not join the epoll set in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	if err := a.Send(out); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	hits := b.recv.spinHits
	for range leaveAfter {
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Recv(in); err != nil {
			t.Fatal(err)
		}
	}
	if b.recv.spinHits-hits != leaveAfter {
		t.Fatalf("%d of %d receives were served by polling", b.recv.spinHits-hits, leaveAfter)
	}
	if n := epollTargets(t, b.rx); n != 0 {
		t.Fatalf("after %d polled receives the socket is still in the epoll set (%d targets)", leaveAfter, n)
	}
}
