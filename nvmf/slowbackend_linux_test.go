//go:build linux

package nvmf

import (
	"errors"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// slowBackend is a MemBackend whose reads take slow each (a file on a
// slow disk), counted in reads.
type slowBackend struct {
	*MemBackend
	slow  time.Duration
	reads chan struct{}
}

func (b *slowBackend) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(b.slow)
	b.reads <- struct{}{}
	return b.MemBackend.ReadAt(p, off)
}

// TestSlowBackendNoRetransmit: the target executes a command in its I/O
// queue's goroutine, between two CQ.Waits that receive from the link
// themselves, so a backend read is a stretch in which the application
// does not call into the device. The ACK of the command's SEND must not
// wait for it (for the response): over UDP sockets (where the waiters
// drive the link) with reads that take 300 ms and a host whose local ACK
// timeout is exponent 14 (67 ms), the host must resend nothing
// (local_ack_timeout_err and retransmitted_pkts stay 0).
func TestSlowBackendNoRetransmit(t *testing.T) {
	if testing.Short() {
		t.Skip("300 ms reads")
	}
	defer func(v uint8) { hostACKTimeout = v }(hostACKTimeout)
	hostACKTimeout = 14
	p := os.Getpid()
	lb := func(host byte) netip.Addr {
		return netip.AddrFrom4([4]byte{127, byte(40 + p%200), byte(1 + (p/200)%250), host})
	}
	tIP, hIP := lb(93), lb(94)
	mk := func(a netip.Addr) *transport.Device {
		l, err := udp.ListenSocket(a, &udp.SocketOptions{GSOAuto: true})
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Skipf("UDP %v:4791 unavailable: %v", a, err)
		}
		if err != nil {
			t.Fatal(err)
		}
		d, err := transport.NewDevice(l, transport.DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	tdev, hdev := mk(tIP), mk(hIP)
	mb, err := NewMemBackend(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	be := &slowBackend{MemBackend: mb, slow: 300 * time.Millisecond, reads: make(chan struct{}, 16)}
	tg, err := Listen(tdev, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: be}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	ctx := ctxT(t, 60*time.Second)
	h, ns := connectNS(t, ctx, hdev, netip.AddrPortFrom(tIP, nvme.Port), &HostConfig{IOQueues: 1, QueueSize: 8})
	defer h.Close()
	c0 := hdev.Counters()
	const reads = 3
	for i := range reads {
		if _, err := ns.ReadAtContext(ctx, make([]byte, 4096), int64(i)*4096); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if got := len(be.reads); got != reads {
		t.Fatalf("the backend was read %d times, want %d", got, reads)
	}
	c := hdev.Counters()
	if d1, d2 := c.LocalAckTimeout-c0.LocalAckTimeout, c.RetransmittedPkts-c0.RetransmittedPkts; d1 != 0 || d2 != 0 {
		t.Fatalf("the host resent commands while the target's backend read (300 ms each, ACK timeout 67 ms): local_ack_timeout_err %d, retransmitted_pkts %d", d1, d2)
	}
}
