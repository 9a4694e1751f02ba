package nvmf

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
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

// TestTargetBatchesSends: with 16 reads in flight on one I/O queue, the
// target posts the data and responses of every command a completion
// batch finished in one PostSend, so its link sees fewer Send calls than
// commands (one per command, or more with the ACKs, when each response
// was posted on its own), and the admin queue waits on its completion
// channel, the I/O queue in CQ.Wait.
func TestTargetBatchesSends(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	tl, err := n.Link(targetIP)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countLink{Link: tl}
	tdev, err := transport.NewDevice(cl, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	hdev := newDevice(t, n, hostIP)
	be, _ := NewMemBackend(8 << 20)
	tg, err := Listen(tdev, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: be, BlockSize: 4096}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		tg.Close()
		hdev.Close()
		tdev.Close()
	}()
	ctx := ctxT(t, 60*time.Second)
	h, err := Connect(ctx, hdev, netip.AddrPortFrom(targetIP, nvme.Port), testNQN, &HostConfig{IOQueues: 1, QueueSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
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
