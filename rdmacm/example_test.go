package rdmacm_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
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

// A server listens on an rdma_cm port, a client dials it; each side gets a
// connected RC QP and the other's private data, and a SEND travels over it.
// Over kernel UDP sockets (udp.ListenSocket) the same code talks to rping,
// ib_write_bw -R and any other librdmacm program.
func Example() {
	n := memnet.NewMemNetwork(memnet.Faults{})
	server, client := device(n, "192.0.2.1"), device(n, "192.0.2.2")
	defer server.Close()
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	l, err := rdmacm.Listen(server, 7174, &rdmacm.ListenOptions{Options: rdmacm.Options{PrivateData: []byte("welcome")}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	buf := make([]byte, 64)
	var smr *memreg.MR // the server's receive buffer, in its connection's PD
	accepted := make(chan *rdmacm.Conn)
	go func() {
		r, err := l.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("request from %v: %s\n", r.RemoteAddr().Addr(), r.PrivateData()[:5])
		c, err := r.Accept(ctx, &rdmacm.Options{
			PrivateData: []byte("welcome"),
			// Post a receive before the reply goes out, as rping does.
			Prepare: func(qp *transport.QP) error {
				smr, _ = qp.PD().RegisterMR(buf, memreg.AccessLocalWrite)
				return qp.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{smr.SGE(0, 64)}})
			},
		})
		if err != nil {
			log.Fatal(err)
		}
		accepted <- c
	}()

	c, err := rdmacm.Dial(ctx, client, netip.MustParseAddrPort("192.0.2.1:7174"), &rdmacm.Options{PrivateData: []byte("hello")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("connected to %v, server said %s\n", c.RemoteAddr(), c.PeerPrivateData()[:7])
	sc := <-accepted

	msg := []byte("ping over a CM connection")
	mr, _ := c.PD().RegisterMR(msg, memreg.AccessLocalWrite)
	if err := c.QP().PostSend(transport.SendWR{Opcode: transport.WRSend, SGEs: []memreg.SGE{mr.SGE(0, uint32(len(msg)))}}); err != nil {
		log.Fatal(err)
	}
	var wc [1]transport.WC
	if _, err := sc.RecvCQ().Wait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
		log.Fatal(err, wc[0].Err())
	}
	fmt.Printf("server received %q\n", buf[:wc[0].ByteLen])

	mr.Deregister()                   // Close deallocates the PD it created: regions first
	if err := c.Close(); err != nil { // DREQ; the server's side ends too
		log.Fatal(err)
	}
	<-sc.Done()
	fmt.Println("server side closed:", sc.Err())
	smr.Deregister()
	if err := sc.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// request from 192.0.2.2: hello
	// connected to 192.0.2.1:7174, server said welcome
	// server received "ping over a CM connection"
	// server side closed: rdmacm: disconnected by the peer
}

// Dialing a port nobody listens on fails at once with ErrRefused, as
// librdmacm reports ECONNREFUSED.
func ExampleDial_refused() {
	n := memnet.NewMemNetwork(memnet.Faults{})
	server, client := device(n, "192.0.2.1"), device(n, "192.0.2.2")
	defer server.Close()
	defer client.Close()
	l, _ := rdmacm.Listen(server, 1, nil) // the server runs a CM, but not on port 2
	defer l.Close()
	_, err := rdmacm.Dial(context.Background(), client, netip.MustParseAddrPort("192.0.2.1:2"), nil)
	fmt.Println(err)
	// Output:
	// rdmacm: connection rejected: invalid service ID (8)
}

// A Manager in hand: each device's connection manager started explicitly,
// its calls as methods, its own counters, and Close apart from the device.
func ExampleNewManager() {
	n := memnet.NewMemNetwork(memnet.Faults{})
	server, client := device(n, "192.0.2.1"), device(n, "192.0.2.2")
	defer server.Close()
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms, err := rdmacm.NewManager(server)
	if err != nil {
		log.Fatal(err)
	}
	mc, err := rdmacm.NewManager(client)
	if err != nil {
		log.Fatal(err)
	}
	l, err := ms.Listen(7174, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *rdmacm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		accepted <- c
	}()
	c, err := mc.Dial(ctx, l.Addr(), nil)
	if err != nil {
		log.Fatal(err)
	}
	sc := <-accepted
	fmt.Println("established:", ms.Stats().Established, mc.Stats().Established)
	mc.Close() // the client's connections end; the device stays open
	<-c.Done()
	fmt.Println("client side:", c.Err())
	sc.Close()
	// Output:
	// established: 1 1
	// client side: rdmacm: closed: the connection manager is closed
}
