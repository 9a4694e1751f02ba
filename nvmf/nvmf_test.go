package nvmf

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

const testNQN = "nqn.2026-12.io.rocev2:test"

var (
	targetIP = netip.MustParseAddr("192.0.2.1")
	hostIP   = netip.MustParseAddr("192.0.2.2")
)

type pair struct {
	net        *memnet.MemNetwork
	tdev, hdev *transport.Device
	t          *Target
	backend    *MemBackend
	targetAddr netip.AddrPort
}

func newDevice(t testing.TB, n *memnet.MemNetwork, a netip.Addr) *transport.Device {
	t.Helper()
	link, err := n.Link(a)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// newPair starts a target with one 8 MiB memory namespace and a host device.
func newPair(t testing.TB, f memnet.Faults, cfg TargetConfig) *pair {
	t.Helper()
	p := &pair{net: memnet.NewMemNetwork(f)}
	p.tdev, p.hdev = newDevice(t, p.net, targetIP), newDevice(t, p.net, hostIP)
	var err error
	if p.backend, err = NewMemBackend(8 << 20); err != nil {
		t.Fatal(err)
	}
	if cfg.Subsystems == nil {
		cfg.Subsystems = []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: p.backend}}}}
	}
	if p.t, err = Listen(p.tdev, cfg); err != nil {
		t.Fatal(err)
	}
	p.targetAddr = netip.AddrPortFrom(targetIP, nvme.Port)
	t.Cleanup(func() {
		p.t.Close()
		p.hdev.Close()
		p.tdev.Close()
	})
	return p
}

// connectNS connects a host controller to testNQN at addr over dev and
// returns it with its namespace 1; the caller closes the controller.
func connectNS(t *testing.T, ctx context.Context, dev *transport.Device, addr netip.AddrPort, cfg *HostConfig) (*Controller, *HostNamespace) {
	t.Helper()
	h, err := Connect(ctx, dev, addr, testNQN, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		h.Close()
		t.Fatal(err)
	}
	return h, ns
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestHostTargetReadWrite(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	id, _ := h.Identify(ctx)
	if id.SubNQN != testNQN || id.MDTS != MDTS || id.SGLS&nvme.SGLSOffset == 0 || id.IOCCSZ != (64+4096)/16 {
		t.Errorf("identify %+v", id)
	}
	if h.IOQueues() != 2 {
		t.Errorf("%d I/O queues", h.IOQueues())
	}
	nss, err := h.ActiveNamespaces(ctx)
	if err != nil || len(nss) != 1 || nss[0] != 1 {
		t.Fatalf("namespaces %v %v", nss, err)
	}
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ns.Size() != 8<<20 || ns.BlockSize() != 512 {
		t.Errorf("size %d block %d", ns.Size(), ns.BlockSize())
	}
	rng := rand.New(rand.NewSource(1))
	for _, size := range []int{512, 4096, 8192, 128 << 10, 1 << 20, 3<<20 + 512} {
		off := int64(rng.Intn(int(ns.Size()-int64(size))/512)) * 512
		w := make([]byte, size)
		rng.Read(w)
		if n, err := ns.WriteAtContext(ctx, w, off); err != nil || n != size {
			t.Fatalf("write %d at %d: %d %v", size, off, n, err)
		}
		if got := p.backend.buf[off : off+int64(size)]; !bytes.Equal(got, w) {
			t.Fatalf("write %d at %d: backend differs", size, off)
		}
		r := make([]byte, size)
		if n, err := ns.ReadAtContext(ctx, r, off); err != nil || n != size {
			t.Fatalf("read %d at %d: %d %v", size, off, n, err)
		}
		if !bytes.Equal(r, w) {
			t.Fatalf("read %d at %d: data differs", size, off)
		}
	}
	if err := ns.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ns.WriteZeroes(ctx, 0, 4096); err != nil || !bytes.Equal(p.backend.buf[:4096], make([]byte, 4096)) {
		t.Fatalf("write zeroes: %v", err)
	}
	if _, err := ns.ReadAt(make([]byte, 100), 0); !errors.Is(err, ErrAlignment) {
		t.Errorf("unaligned read: %v", err)
	}
	st := p.t.Stats()
	if st.Errors != 0 || st.WriteBytes == 0 || st.ReadBytes == 0 || st.LiveCtrls != 1 {
		t.Errorf("target stats %+v", st)
	}
	h.Close()
	waitFor(t, func() bool { return p.t.Queues() == 0 && p.t.Stats().LiveCtrls == 0 }, "queues gone after Close")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting: %s", what)
}
