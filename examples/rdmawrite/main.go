// Command rdmawrite is the library's smallest real program, in two
// processes: a server registers a buffer in its own protection domain,
// listens through the connection manager with that PD and puts the
// buffer's address and rkey in the reply's private data; a client dials,
// reads them from the private data and writes a message into the buffer
// with one RDMA WRITE with immediate (the immediate carries the length and
// tells the server the data is there). Both run over kernel UDP sockets on
// port 4791, so either side may talk to another host (or, with its own
// protocol on top, to a librdmacm program).
//
//	go run ./examples/rdmawrite server --bind 127.0.0.1
//	go run ./examples/rdmawrite client --bind 127.0.0.2 --server 127.0.0.1 --msg 'hello, RDMA'
//
// The server prints one line when it listens and one when the message has
// arrived ("received 11 bytes: \"hello, RDMA\""); exit status 0 means the
// WRITE went through, 1 any error.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// bufSize is the server's buffer: the largest message a client may write.
const bufSize = 4096

// The private data of the server's reply: the buffer's address, rkey and
// length, big-endian (the CM pads the private data with zeros behind it).
const pdataLen = 16

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rdmawrite:", err)
		os.Exit(1)
	}
}

// run is the program: run(["server", flags...]) or run(["client", flags...]).
func run(args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "server" && args[0] != "client") {
		return errors.New("usage: rdmawrite server --bind ADDR | rdmawrite client --bind ADDR --server ADDR [--msg TEXT]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	bind := fs.String("bind", "", "local IP address (RoCEv2 on UDP port 4791 of it)")
	server := fs.String("server", "", "client: the server's IP address")
	port := fs.Uint("port", 7174, "rdma_cm port (TCP port space)")
	msg := fs.String("msg", "hello, RDMA", "client: the message to write")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	local, err := netip.ParseAddr(*bind)
	if err != nil {
		return fmt.Errorf("--bind: %w", err)
	}
	if *port == 0 || *port > 0xffff {
		return fmt.Errorf("--port %d: not a port", *port)
	}
	var srv netip.Addr
	if args[0] == "client" {
		if srv, err = netip.ParseAddr(*server); err != nil {
			return fmt.Errorf("--server: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	// A device over a real UDP socket: the RoCEv2 "NIC" of this process.
	link, err := udp.ListenSocket(local, nil)
	if err != nil {
		return err
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		link.Close()
		return err
	}
	defer dev.Close()

	if args[0] == "server" {
		return serve(ctx, dev, local, uint16(*port), out)
	}
	return write(ctx, dev, netip.AddrPortFrom(srv, uint16(*port)), []byte(*msg), out)
}

// serve accepts one connection, waits for the client's WRITE with
// immediate into its buffer and prints what arrived.
func serve(ctx context.Context, dev *transport.Device, local netip.Addr, port uint16, out io.Writer) error {
	// The buffer lives in the server's own PD, registered for remote
	// writes; the connection's QP is created in that PD (Options.PD), so
	// the buffer's rkey is valid on it.
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Dealloc()
	buf := make([]byte, bufSize)
	mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		return err
	}
	defer mr.Deregister()
	// A WRITE with immediate consumes a receive WR (with no data: the
	// bytes go where the WRITE says); it completes when the data is placed.
	pdata := make([]byte, pdataLen)
	binary.BigEndian.PutUint64(pdata[0:], mr.IOVA())
	binary.BigEndian.PutUint32(pdata[8:], mr.RKey())
	binary.BigEndian.PutUint32(pdata[12:], uint32(mr.Len()))

	l, err := rdmacm.Listen(dev, port, &rdmacm.ListenOptions{Options: rdmacm.Options{
		PD:          pd,
		PrivateData: pdata,
		Prepare:     func(qp *transport.QP) error { return qp.PostRecv(transport.RecvWR{WRID: 1}) },
	}})
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(out, "listening on %v port %d: buffer of %d bytes, rkey %#x\n", local, port, mr.Len(), mr.RKey())

	c, err := l.Accept(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var wc [1]transport.WC
	if _, err := c.RecvCQ().Wait(ctx, wc[:]); err != nil {
		return err
	}
	if err := wc[0].Err(); err != nil {
		return err
	}
	if wc[0].Flags&transport.WCWithImm == 0 || wc[0].Imm > bufSize {
		return fmt.Errorf("completion %+v: want a WRITE with immediate of at most %d bytes", wc[0], bufSize)
	}
	n := wc[0].Imm
	fmt.Fprintf(out, "received %d bytes from %v: %q\n", n, c.RemoteAddr().Addr(), buf[:n])
	// Wait (bounded) for the client to disconnect, then close our side.
	select {
	case <-c.Done():
	case <-ctx.Done():
	}
	return nil
}

// write dials the server, writes msg into the buffer its private data
// names and disconnects.
func write(ctx context.Context, dev *transport.Device, server netip.AddrPort, msg []byte, out io.Writer) error {
	c, err := rdmacm.Dial(ctx, dev, server, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	pdata := c.PeerPrivateData()
	if len(pdata) < pdataLen {
		return fmt.Errorf("server's private data is %d bytes, want %d", len(pdata), pdataLen)
	}
	va := binary.BigEndian.Uint64(pdata[0:])
	rkey := binary.BigEndian.Uint32(pdata[8:])
	size := binary.BigEndian.Uint32(pdata[12:])
	if uint64(len(msg)) > uint64(size) {
		return fmt.Errorf("message of %d bytes does not fit the server's buffer of %d", len(msg), size)
	}
	// The source buffer is registered in the connection's PD (Dial made
	// one: Options.PD nil); deregister it before Close frees the PD.
	mr, err := c.PD().RegisterMR(msg, memreg.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer mr.Deregister()
	err = c.QP().PostSend(transport.SendWR{
		WRID: 1, Opcode: transport.WRWriteImm, Flags: transport.SendSignaled,
		SGEs:       []memreg.SGE{mr.SGE(0, uint32(len(msg)))},
		RemoteAddr: va, RKey: rkey, Imm: uint32(len(msg)),
	})
	if err != nil {
		return err
	}
	var wc [1]transport.WC
	if _, err := c.SendCQ().Wait(ctx, wc[:]); err != nil {
		return err
	}
	if err := wc[0].Err(); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %d bytes to %v (va %#x, rkey %#x)\n", len(msg), server, va, rkey)
	return nil
}
