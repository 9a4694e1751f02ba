//go:build linux

package share

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tryJoin is join that returns Join's error instead of failing the test.
func tryJoin(ap netip.AddrPort, o *Options) (*testSock, error) {
	s := &testSock{fd: -1}
	m, err := Join(ap, o, func(prog int) (int, error) {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return -1, err
		}
		if err := SetReusePort(fd); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if err := AttachProgram(fd, prog); err != nil {
			unix.Close(fd)
			return -1, err
		}
		s.fd = fd
		return fd, nil
	})
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}

// TestJoinWaitsForTimeWaitSlot: a group whose 64 slots are taken, some
// only by members that left within TimeWait (a reconnect loop of short
// runs next to a long-lived member), makes a joiner wait for the first
// of those slots to come free instead of failing with ErrFull (a
// reconnect loop failed 27 of 150 runs so); with every slot live, Join
// fails at once with ErrFull, saying how many are in TimeWait.
func TestJoinWaitsForTimeWaitSlot(t *testing.T) {
	needRoot(t)
	ap := netip.MustParseAddrPort("127.0.0.62:24791")
	const tw = 400 * time.Millisecond
	o := &Options{TimeWait: tw, LockDir: t.TempDir()}
	if ok, err := Remove(ap, ""); err == nil && !ok {
		t.Fatal("a live group holds the test's address")
	}
	t.Cleanup(func() { Remove(ap, "") })
	var socks []*testSock
	t.Cleanup(func() {
		for _, s := range socks {
			s.close()
		}
	})
	for range MaxMembers {
		s, err := tryJoin(ap, o)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
	}
	// Every slot live: ErrFull at once.
	t0 := time.Now()
	if s, err := tryJoin(ap, o); err == nil {
		s.close()
		t.Fatal("a 65th member joined")
	} else if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "0 of them in TimeWait") {
		t.Fatalf("65th member: %v, want ErrFull naming 0 in TimeWait", err)
	}
	if d := time.Since(t0); d > tw/2 {
		t.Errorf("a group of live members made the joiner wait %v", d)
	}
	// One leaves: its slot is in TimeWait; the next joiner waits for it.
	socks[10].close()
	t0 = time.Now()
	s, err := tryJoin(ap, o)
	if err != nil {
		t.Fatalf("joiner behind a TimeWait slot: %v", err)
	}
	socks = append(socks, s)
	if d := time.Since(t0); d < tw/2 || d > 2*tw+time.Second {
		t.Errorf("joined after %v, want about the TimeWait (%v)", d, tw)
	}
}
