package nvmf_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/nvmf"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

func device(n *memnet.MemNetwork, addr string) *transport.Device {
	link, err := n.Link(netip.MustParseAddr(addr))
	if err != nil {
		log.Fatal(err)
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		log.Fatal(err)
	}
	return dev
}

// A target exports a 1 MiB memory namespace; a host discovers it,
// connects, writes and reads back. Over kernel UDP sockets
// (udp.ListenSocket) the target serves Linux's nvme-rdma and the host
// reads Linux's nvmet-rdma.
func Example() {
	n := memnet.NewMemNetwork(memnet.Faults{})
	tdev, hdev := device(n, "192.0.2.1"), device(n, "192.0.2.2")
	defer tdev.Close()
	defer hdev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	mem, _ := nvmf.NewMemBackend(1 << 20)
	t, err := nvmf.Listen(tdev, nvmf.TargetConfig{Subsystems: []*nvmf.Subsystem{{
		NQN: "nqn.2026-12.io.example:disk", Namespaces: []*nvmf.Namespace{{Backend: mem}}}}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	addr := netip.MustParseAddrPort("192.0.2.1:4420")
	entries, err := nvmf.Discover(ctx, hdev, addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("discovered", entries[0].SubNQN, "at", entries[0].TrAddr+":"+entries[0].TrSvcID)

	c, err := nvmf.Connect(ctx, hdev, addr, entries[0].SubNQN, &nvmf.HostConfig{IOQueues: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("namespace %d: %d bytes in %d-byte blocks\n", ns.ID(), ns.Size(), ns.BlockSize())
	w := bytes.Repeat([]byte("RoCEv2!\n"), 1024) // 8 KiB: two 4 KiB writes' worth
	if _, err := ns.WriteAtContext(ctx, w, 4096); err != nil {
		log.Fatal(err)
	}
	r := make([]byte, len(w))
	if _, err := ns.ReadAtContext(ctx, r, 4096); err != nil {
		log.Fatal(err)
	}
	fmt.Println("read back equal:", bytes.Equal(r, w))
	// Output:
	// discovered nqn.2026-12.io.example:disk at 192.0.2.1:4420
	// namespace 1: 1048576 bytes in 512-byte blocks
	// read back equal: true
}
