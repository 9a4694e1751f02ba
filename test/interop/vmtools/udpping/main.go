// Command udpping is the raw UDP baseline of the interop lab's VM
// benchmark (BenchmarkVM): an 8-byte (-s) UDP ping-pong between the two
// VMs with Go's net package (blocking reads through the runtime's network
// poller), the same runtime and wait technique rocev2d uses without busy
// polling. It is built static into the pair's initramfs and never runs on
// the host.
//
//	udpping -l 192.0.2.10:7000           # echo server
//	udpping -n 300 -s 8 192.0.2.10:7000  # client
//
// With -busy both ends poll their socket without blocking
// (recvfrom MSG_DONTWAIT in a loop) instead of parking in the poller, as
// ibv_rc_pingpong polls its CQ and as rocev2d --busy-poll polls its link.
//
// The client prints its result in ibv_rc_pingpong's form:
// "N iters in S seconds = U usec/iter".
package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

func main() {
	listen := flag.String("l", "", "serve: echo datagrams on this address")
	n := flag.Int("n", 300, "round trips (client)")
	size := flag.Int("s", 8, "datagram size (client)")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	busy := flag.Bool("busy", false, "poll the socket without blocking (recvfrom MSG_DONTWAIT)")
	flag.Parse()
	busyPoll = *busy
	if *listen != "" {
		os.Exit(serve(*listen, *timeout))
	}
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: udpping -l ADDR:PORT | udpping [-n N] [-s SIZE] ADDR:PORT")
		os.Exit(2)
	}
	os.Exit(client(flag.Arg(0), *n, *size, *timeout))
}

func serve(addr string, timeout time.Duration) int {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpping:", err)
		return 1
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	c.SetDeadline(deadline)
	buf := make([]byte, 65536)
	for {
		n, from, err := readFrom(c, buf, deadline)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udpping:", err)
			return 1
		}
		if n == 1 && buf[0] == 0xff { // the client's end marker
			return 0
		}
		if _, err := c.WriteToUDPAddrPort(buf[:n], from); err != nil {
			fmt.Fprintln(os.Stderr, "udpping:", err)
			return 1
		}
	}
}

func client(addr string, n, size int, timeout time.Duration) int {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpping:", err)
		return 1
	}
	defer c.Close()
	msg := make([]byte, max(size, 2))
	buf := make([]byte, 65536)
	deadline := time.Now().Add(timeout)
	var t0 time.Time
	for i := -1; i < n; i++ { // round -1 warms up (and waits for the server)
		if i == 0 {
			t0 = time.Now()
		}
		for {
			if _, err := c.Write(msg); err != nil {
				fmt.Fprintln(os.Stderr, "udpping:", err)
				return 1
			}
			wait := time.Second
			if i >= 0 {
				wait = time.Until(deadline)
			}
			c.SetReadDeadline(time.Now().Add(wait))
			if _, _, err := readFrom(c, buf, time.Now().Add(wait)); err == nil {
				break
			} else if i >= 0 || time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, "udpping:", err)
				return 1
			}
		}
	}
	d := time.Since(t0)
	for range 3 { // the server's end marker; a lost one costs the server its -timeout
		c.Write([]byte{0xff})
	}
	fmt.Printf("%d bytes in %.2f seconds = %.2f Mbit/sec\n", 2*size*n, d.Seconds(), float64(2*size*n)*8/d.Seconds()/1e6)
	fmt.Printf("%d iters in %.2f seconds = %.2f usec/iter\n", n, d.Seconds(), float64(d.Microseconds())/float64(n))
	return 0
}

// busyPoll: readFrom polls instead of blocking (-busy).
var busyPoll bool

// readFrom receives one datagram into buf: blocking in Go's poller, or
// with -busy polling the socket until one is there or deadline passes.
func readFrom(c *net.UDPConn, buf []byte, deadline time.Time) (int, netip.AddrPort, error) {
	if !busyPoll {
		return c.ReadFromUDPAddrPort(buf)
	}
	for i := 0; ; i++ {
		n, from, ok, err := tryRead(c, buf)
		if ok || err != nil {
			return n, from, err
		}
		if i%1024 == 1023 && time.Now().After(deadline) {
			return 0, netip.AddrPort{}, os.ErrDeadlineExceeded
		}
	}
}
