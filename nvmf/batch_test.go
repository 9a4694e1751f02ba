package nvmf

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// countLink counts the Send calls of the link it wraps.
type countLink struct {
	udp.Link
	sends, pkts atomic.Uint64
}

func (l *countLink) Send(pkts []udp.Packet) error {
	l.sends.Add(1)
	l.pkts.Add(uint64(len(pkts)))
	return l.Link.Send(pkts)
}

// wrappedTarget starts a target with one 8 MiB namespace on an in-memory
// network, its device's link wrapped by wrap, and a host connected to it
// with one I/O queue of 32; it returns the target, the host's namespace 1
// and the test's context. Everything is closed when the test ends.
func wrappedTarget(t *testing.T, wrap func(udp.Link) udp.Link) (*Target, *HostNamespace, context.Context) {
	t.Helper()
	n := memnet.NewMemNetwork(memnet.Faults{})
	tl, err := n.Link(targetIP)
	if err != nil {
		t.Fatal(err)
	}
	tdev, err := transport.NewDevice(wrap(tl), transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	hdev := newDevice(t, n, hostIP)
	be, _ := NewMemBackend(8 << 20)
	tg, err := Listen(tdev, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: be, BlockSize: 4096}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tg.Close()
		hdev.Close()
		tdev.Close()
	})
	ctx := ctxT(t, 60*time.Second)
	h, err := Connect(ctx, hdev, netip.AddrPortFrom(targetIP, nvme.Port), testNQN, &HostConfig{IOQueues: 1, QueueSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return tg, ns, ctx
}

// TestTargetBatchesSends: with 16 reads in flight on one I/O queue, the
// target posts the data and responses of every command a completion
// batch finished in one PostSend, so its link sees fewer Send calls than
// commands (one per command, or more with the ACKs, when each response
// was posted on its own), and the admin queue waits on its completion
// channel, the I/O queue in CQ.Wait.
func TestTargetBatchesSends(t *testing.T) {
	var cl *countLink
	tg, ns, ctx := wrappedTarget(t, func(l udp.Link) udp.Link { cl = &countLink{Link: l}; return cl })
	var admin, io int
	tg.mu.Lock()
	for q := range tg.queues {
		if q.qid == 0 && q.ch != nil {
			admin++
		}
		if q.qid != 0 && q.ch == nil {
			io++
		}
	}
	tg.mu.Unlock()
	if admin != 1 || io != 1 {
		t.Errorf("admin queues on a channel %d, I/O queues in CQ.Wait %d; want 1 and 1", admin, io)
	}
	const workers, per = 16, 40
	cmds0, sends0 := tg.Stats().Commands, cl.sends.Load()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; i < per; i++ {
				if _, err := ns.ReadAtContext(ctx, buf, int64((w*per+i)%2048)*4096); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	cmds, sends := tg.Stats().Commands-cmds0, cl.sends.Load()-sends0
	t.Logf("%d commands, %d Link.Send calls of the target (%.2f per command)", cmds, sends, float64(sends)/float64(cmds))
	if cmds < workers*per {
		t.Fatalf("%d commands counted, want at least %d", cmds, workers*per)
	}
	if float64(sends) > 0.9*float64(cmds) {
		t.Errorf("%d sends for %d commands: the responses of a batch were not posted together", sends, cmds)
	}
}

// writeTapLink counts the RDMA WRITE LAST/ONLY packets sent through it,
// and those of them that ask for an acknowledgement.
type writeTapLink struct {
	udp.Link
	lasts, acked atomic.Uint64
}

func (l *writeTapLink) Send(pkts []udp.Packet) error {
	for _, p := range pkts {
		var pk packet.Packet
		if pk.Parse(p.Buf) != nil {
			continue
		}
		if op := pk.BTH.Opcode(); op == bth.RCWriteLast || op == bth.RCWriteOnly {
			l.lasts.Add(1)
			if pk.BTH.AckReq() {
				l.acked.Add(1)
			}
		}
	}
	return l.Link.Send(pkts)
}

// TestTargetReadNoAckReq: the RDMA WRITE of a read's data leaves without
// AckReq (transport.SendNoAckReq), the response behind it asks for the
// ACK that covers both, so the host sends one ACK per read, not two; the
// data read back is what was written.
func TestTargetReadNoAckReq(t *testing.T) {
	var wl *writeTapLink
	_, ns, ctx := wrappedTarget(t, func(l udp.Link) udp.Link { wl = &writeTapLink{Link: l}; return wl })
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	if _, err := ns.WriteAtContext(ctx, want, 0); err != nil {
		t.Fatal(err)
	}
	lasts0, acked0 := wl.lasts.Load(), wl.acked.Load()
	const workers, per = 8, 32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 8192)
			for i := 0; i < per; i++ {
				off := int64((w*per+i)%127) * 8192
				if _, err := ns.ReadAtContext(ctx, buf, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf, want[off:off+8192]) {
					errs <- fmt.Errorf("read at %d: data differs", off)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	lasts, acked := wl.lasts.Load()-lasts0, wl.acked.Load()-acked0
	t.Logf("%d reads: %d RDMA WRITE LAST packets, %d of them with AckReq", workers*per, lasts, acked)
	if lasts < workers*per {
		t.Fatalf("%d RDMA WRITE LAST packets for %d reads", lasts, workers*per)
	}
	if acked > lasts/10 {
		t.Errorf("%d of %d WRITEs ask for an ACK: the response's ACK should cover them", acked, lasts)
	}
}
