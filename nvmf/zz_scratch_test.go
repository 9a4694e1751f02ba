package nvmf

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

type rawTap struct {
	udp.Wrap
	lasts, acked atomic.Uint64
}

func (l *rawTap) Send(pkts []udp.Packet) error {
	for _, p := range pkts {
		op := bth.Opcode(p.Buf[0])
		if op == bth.RCWriteLast || op == bth.RCWriteOnly {
			l.lasts.Add(1)
			if p.Buf[8]&0x80 != 0 {
				l.acked.Add(1)
			}
		}
	}
	return l.Wrap.Link.Send(pkts)
}

func TestZZScratchSocket(t *testing.T) {
	ta, ha := netip.MustParseAddr("127.0.77.1"), netip.MustParseAddr("127.0.77.2")
	sl, err := udp.ListenSocket(ta, &udp.SocketOptions{GSOAuto: true})
	if err != nil {
		t.Fatal(err)
	}
	wl := &rawTap{Wrap: udp.Wrap{Link: sl}}
	tdev, err := transport.NewDevice(wl, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	hl, err := udp.ListenSocket(ha, &udp.SocketOptions{GSOAuto: true})
	if err != nil {
		t.Fatal(err)
	}
	hdev, _ := transport.NewDevice(hl, transport.DeviceConfig{})
	be, _ := NewMemBackend(8 << 20)
	tg, err := Listen(tdev, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: be, BlockSize: 4096}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { tg.Close(); hdev.Close(); tdev.Close() }()
	ctx := ctxT(t, 60*time.Second)
	h, err := Connect(ctx, hdev, netip.AddrPortFrom(ta, nvme.Port), testNQN, &HostConfig{IOQueues: 1, QueueSize: 128, RemoteInvalidate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, _ := h.Namespace(ctx, 1)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; i < 50; i++ {
				ns.ReadAtContext(ctx, buf, int64(i*4096))
			}
		}()
	}
	wg.Wait()
	t.Logf("lasts %d acked %d", wl.lasts.Load(), wl.acked.Load())
}
