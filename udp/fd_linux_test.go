//go:build linux

package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/internal/netns"
)

// newStalledLoNetns creates a network namespace whose lo is up behind a tbf
// qdisc of 1 kbit/s with a 10 MB queue: datagrams sent there stay queued,
// still charged to their socket's send buffer, so a sender with a small
// SO_SNDBUF blocks in the kernel after a few packets. It is deleted at
// cleanup. Skips without root or iproute2 (fails with CI=true).
func newStalledLoNetns(t *testing.T) string {
	t.Helper()
	netns.Require(t, "tc")
	ns := netns.TestNew(t, "udptest-stall")
	if out, err := exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
		"tbf", "rate", "1kbit", "burst", "1600", "limit", "10000000").CombinedOutput(); err != nil {
		t.Fatalf("tc qdisc add: %v: %s", err, out)
	}
	return ns
}

// waitSendBlocked waits (at most 10 s) until the goroutine started by
// creator is in a system call inside a Link's Send, with at least minSent
// packets sent (so the send buffer has filled and the call blocks).
func waitSendBlocked(t *testing.T, creator string, l Link, minSent uint64) {
	t.Helper()
	waitGoroutine(t, fmt.Sprintf("the Send goroutine did not block (want %d sent)", minSent), creator, "Link).Send(",
		[]string{"[syscall"}, func() bool { return l.Stats().SentPkts >= minSent })
}

// TestCloseUnblocksSend: a Send blocked in the kernel on a full send buffer
// returns once the link is closed, with an error matching net.ErrClosed
// (not the EPIPE the shutdown gives the blocked system call), and Close
// returns. One message per system call (BatchSize 1), so the blocked call
// is always the sendmsg of a single packet.
func TestCloseUnblocksSend(t *testing.T) {
	ns := newStalledLoNetns(t)
	lo := netip.MustParseAddr("127.0.0.1")
	for _, c := range []struct {
		name string
		open func() (Link, error)
	}{
		{"socket", func() (Link, error) {
			return ListenSocket(lo, &SocketOptions{BatchSize: 1, SendBufferSize: 4096, NoGRO: true})
		}},
		{"socket-srcports", func() (Link, error) {
			return ListenSocket(lo, &SocketOptions{BatchSize: 1, SendBufferSize: 4096, NoGRO: true, SourcePorts: true})
		}},
		{"raw", func() (Link, error) { return ListenRaw(lo, &RawOptions{BatchSize: 1, SendBufferSize: 4096}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := netns.MustGet(t, ns, c.open)
			closed := false
			defer func() {
				if !closed {
					l.Close()
				}
			}()
			pkts := testPackets(200, 1400, lo, 0xc321)
			done := make(chan error, 1)
			go func() { done <- l.Send(pkts) }()
			waitSendBlocked(t, "TestCloseUnblocksSend", l, 2)
			cerr := make(chan error, 1)
			go func() { cerr <- l.Close() }()
			closed = true
			select {
			case err := <-done:
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("Send blocked at Close returned %v, want net.ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Send still blocked 10 s after Close")
			}
			select {
			case err := <-cerr:
				if err != nil {
					t.Errorf("Close: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not return within 10 s")
			}
			if err := l.Send(pkts[:1]); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Send after Close: %v, want net.ErrClosed", err)
			}
			if err := l.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// TestSocketIPv6LinkLocalZone: a SocketLink on a link-local IPv6 address
// with a zone — by interface name and by index — binds its send sockets
// (the link's own and, with SourcePorts, the per-port ones, opened from a
// thread outside the namespace) to that zone, and the packets arrive from
// the ports Send reports, with valid ICRCs.
func TestSocketIPv6LinkLocalZone(t *testing.T) {
	np := newNetnsPair(t, 0)
	llA, llB := netip.MustParseAddr("fe80::c0:1"), netip.MustParseAddr("fe80::c0:2")
	for _, x := range []struct{ ns, ifname string }{{np.NsA, np.IfA + " " + llA.String()}, {np.NsB, np.IfB + " " + llB.String()}} {
		f := strings.Fields(x.ifname)
		if out, err := exec.Command("ip", "-n", x.ns, "addr", "add", f[1]+"/64", "dev", f[0], "nodad").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add: %v: %s", err, out)
		}
	}
	idxA := netns.MustGet(t, np.NsA, func() (int, error) {
		ifi, err := net.InterfaceByName(np.IfA)
		if err != nil {
			return 0, err
		}
		return ifi.Index, nil
	})
	b := netns.MustGet(t, np.NsB, func() (*SocketLink, error) {
		return ListenSocket(llB.WithZone(np.IfB), &SocketOptions{NoGRO: true})
	})
	defer b.Close()
	for _, zone := range []string{np.IfA, fmt.Sprint(idxA)} {
		for _, srcPorts := range []bool{false, true} {
			a := netns.MustGet(t, np.NsA, func() (*SocketLink, error) {
				return ListenSocket(llA.WithZone(zone), &SocketOptions{NoGRO: true, SourcePorts: srcPorts})
			})
			pkts := testPackets(3, 200, llB, 0xc477)
			if err := a.Send(pkts); err != nil {
				a.Close()
				t.Fatalf("zone %q SourcePorts %v: %v", zone, srcPorts, err)
			}
			want := a.SendPort()
			if srcPorts {
				want = 0xc477
			}
			got := recvN(t, b, 3, 5*time.Second)
			for i := range got {
				if got[i].Addr != llA || got[i].SrcPort != want || pkts[i].SrcPort != want {
					t.Errorf("zone %q SourcePorts %v: packet %d from [%v]:%d, SrcPort after Send %d; want [%v]:%d",
						zone, srcPorts, i, got[i].Addr, got[i].SrcPort, pkts[i].SrcPort, llA, want)
				}
			}
			if n := a.SourcePortFallbacks(); n != 0 {
				t.Errorf("zone %q: %d source port fallbacks", zone, n)
			}
			a.Close()
		}
	}
	if s := b.Stats(); s.DropBadICRC != 0 {
		t.Errorf("receiver: %d bad ICRCs", s.DropBadICRC)
	}
}
