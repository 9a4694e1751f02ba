package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// perfConnect opens the out-of-band TCP connection. The client retries
// until connTimeout; the server accepts one client.
func perfConnect(ctx context.Context, c *perfConfig) (net.Conn, error) {
	port := strconv.Itoa(c.port)
	if c.server != "" {
		addr := net.JoinHostPort(c.server, port)
		deadline := time.Now().Add(c.connTimeout)
		var lastErr error
		for delay := 20 * time.Millisecond; ; delay = min(delay*2, 500*time.Millisecond) {
			d := net.Dialer{Deadline: deadline}
			if c.bind.IsValid() {
				d.LocalAddr = &net.TCPAddr{IP: c.bind.AsSlice()}
			}
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				return conn, nil
			}
			lastErr = err
			if ctx.Err() != nil || time.Now().Add(delay).After(deadline) {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("couldn't connect to %s (server %s, TCP port %d): %v (%v)", addr, c.server, c.port, lastErr, context.Cause(ctx))
		}
		return nil, fmt.Errorf("couldn't connect to server %s on TCP port %d within %v (is `%s` running there as a server?): %v",
			c.server, c.port, c.connTimeout, c.test, lastErr)
	}
	return acceptOne(ctx, c.port, func(err error) error {
		return fmt.Errorf("TCP port %d is in use (another server running?); pick another with -p: %w", c.port, err)
	})
}

// perfSide is one side of a perftest run: device, memory, CQs and QP.
type perfSide struct {
	c       *perfConfig
	dev     *transport.Device
	pd      *memreg.PD
	mem     []byte // mmap'd: [0, half) source, [half, 2*half+cycle) target
	half    int
	mr      *memreg.MR
	scq     *transport.CQ
	rcq     *transport.CQ
	qp      *transport.QP
	psn     uint32
	params  oob.Params // negotiated
	remote  oob.PerfDest
	local   oob.PerfDest
	capture *pcaptap.Writer
	posted  int // receives outstanding
	results []perfResult
	srvRecv perfResult // send-bw server's own measurement
}

const perfCycle = 4096 // cycle buffer: the page size, as perftest

func (s *perfSide) recvBase() uint64 { return s.mr.IOVA() + uint64(s.half) }

// inc is perftest's INC(size, cache line): the step between slots.
func perfInc(size, line int) int { return (size + line - 1) / line * line }

// slotOff is the offset of iteration i's message in the source and target
// regions: messages cycle through the cycle buffer when they fit in half of
// it (perftest's increase_loc_addr / increase_rem_addr).
func (s *perfSide) slotOff(size int, i uint64) uint64 {
	cycle := int(s.params.CycleBuffer)
	if cycle == 0 {
		cycle = perfCycle
	}
	if size > cycle/2 || !s.c.test.IsBW() {
		return 0 // latency tests use one address, as perftest
	}
	inc := perfInc(size, int(max(s.params.CacheLine, 1)))
	return (i % uint64(cycle/inc)) * uint64(inc)
}

func newPerfSide(c *perfConfig, local netip.Addr) (*perfSide, error) {
	opts := linkOptions(!c.test.IsBW() && !c.events)
	link, err := udp.ListenSocket(local, &opts)
	if err != nil {
		hint := ""
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			hint = " (port 4791 on that address is taken — by a kernel rxe device or another rocev2d; use --bind with another address)"
		case errors.Is(err, syscall.EADDRNOTAVAIL):
			hint = " (address not configured here; pass --bind with a local address)"
		}
		return nil, fmt.Errorf("RoCEv2 on %s: %w%s", netip.AddrPortFrom(local, udp.Port), err, hint)
	}
	var dlink udp.Link = link
	var capture *pcaptap.Writer
	if c.pcap != "" {
		f, err := os.Create(c.pcap)
		if err != nil {
			link.Close()
			return nil, fmt.Errorf("--pcap: %w", err)
		}
		if capture, err = pcaptap.NewWriter(f); err != nil {
			f.Close()
			link.Close()
			return nil, fmt.Errorf("--pcap %s: %w", c.pcap, err)
		}
		dlink = pcaptap.New(link, capture, pcaptap.Both)
	}
	dev, err := transport.NewDevice(dlink, transport.DeviceConfig{})
	if err != nil {
		link.Close()
		if capture != nil {
			capture.Close()
		}
		return nil, err
	}
	s := &perfSide{c: c, dev: dev, capture: capture, psn: rand.Uint32() & 0xffffff}
	maxSize := slices.Max(c.sizes())
	s.half = (max(maxSize, perfCycle) + 4095) &^ 4095
	s.mem, err = unix.Mmap(-1, 0, 2*s.half+perfCycle, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("allocating %d bytes: %w", 2*s.half+perfCycle, err)
	}
	if s.pd, err = dev.AllocPD(); err != nil {
		s.close()
		return nil, err
	}
	access := memreg.AccessLocalWrite | memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic
	if s.mr, err = s.pd.RegisterMR(s.mem, access); err != nil {
		s.close()
		return nil, fmt.Errorf("couldn't register MR: %w", err)
	}
	depth := c.txDepth + c.rxDepth + 16
	if s.scq, err = dev.CreateCQ(c.txDepth + 16); err != nil {
		s.close()
		return nil, err
	}
	if s.rcq, err = dev.CreateCQ(depth); err != nil {
		s.close()
		return nil, err
	}
	s.qp, err = dev.CreateQP(s.pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: s.scq, RecvCQ: s.rcq,
		MaxSendWR: c.txDepth + 1, MaxRecvWR: c.rxDepth + 1, MaxSGE: 1})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("couldn't create QP: %w", err)
	}
	a := transport.QPAttr{State: transport.QPSInit, Port: 1, AccessFlags: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic}
	if err := s.qp.Modify(&a, transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags); err != nil {
		s.close()
		return nil, fmt.Errorf("failed to modify QP to INIT: %w", err)
	}
	outReads := uint16(1)
	if c.test == oob.ReadBW || c.test == oob.ReadLat || c.test == oob.AtomicBW || c.test == oob.AtomicLat {
		outReads = 16
	}
	s.local = oob.PerfDest{OutReads: outReads, QPN: s.qp.QPN(), PSN: s.psn, RKey: s.mr.RKey(),
		VAddr: s.recvBase(), GID: dev.GID()}
	return s, nil
}

func (s *perfSide) close() error {
	if s.dev != nil {
		s.dev.Close()
	}
	var err error
	if s.capture != nil {
		err = s.capture.Close()
		s.capture = nil
	}
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
	return err
}

func (s *perfSide) txDepth() int {
	if s.c.test.IsBW() {
		return min(s.c.txDepth, s.c.iters)
	}
	return 1
}

// connect brings the QP to RTR and RTS towards the peer (ctx_connect).
func (s *perfSide) connect(remote oob.PerfDest, neg oob.Params, stdout io.Writer) error {
	s.remote, s.params = remote, neg
	peer, err := peerFromGID(remote.GID, "-x")
	if err != nil {
		return err
	}
	mtu, ok := transport.MTUFromBytes(neg.MTU.Bytes())
	if !ok {
		return fmt.Errorf("negotiated MTU %d is invalid", neg.MTU)
	}
	rd := uint8(min(max(remote.OutReads, 1), 16))
	if err := connectRTS(s.qp, peer, remote.QPN, s.psn, remote.PSN, mtu, rd, uint8(s.c.qpTimeout)); err != nil {
		return err
	}
	s.printHeader(stdout)
	s.printDest(stdout, "local", s.local)
	s.printDest(stdout, "remote", remote)
	fmt.Fprint(stdout, perfLine)
	if s.c.test.IsBW() {
		fmt.Fprintln(stdout, " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]")
	} else {
		fmt.Fprintln(stdout, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
	}
	return nil
}

// prepare posts the receives a SEND test needs before the barrier.
func (s *perfSide) prepare(size int) error {
	c := s.c
	recvSide := c.test == oob.SendLat || (c.test == oob.SendBW && c.role() == oob.Server)
	if !recvSide {
		return nil
	}
	want := min(c.rxDepth, c.iters)
	if c.duration > 0 {
		want = c.rxDepth
	}
	for s.posted < want {
		if err := s.postRecv(); err != nil {
			return err
		}
	}
	return nil
}

func (s *perfSide) postRecv() error {
	// Each receive may take the largest message of the run, at its slot.
	wr := transport.RecvWR{WRID: 0, SGEs: []memreg.SGE{{Addr: s.recvBase(), Length: uint32(s.half), LKey: s.mr.LKey()}}}
	if err := s.qp.PostRecv(wr); err != nil {
		return fmt.Errorf("couldn't post receive: %w", err)
	}
	s.posted++
	return nil
}
