package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

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
		local := oobLocalTCPAddr(c.bind, c.server)
		var lastErr error
		for delay := 20 * time.Millisecond; ; delay = min(delay*2, 500*time.Millisecond) {
			d := net.Dialer{Deadline: deadline}
			if local != nil {
				d.LocalAddr = local
			}
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				return conn, nil
			}
			if perr := oobDialPermanent(err, c.bind, local); perr != nil {
				return nil, fmt.Errorf("couldn't connect to server %s on TCP port %d: %w", c.server, c.port, perr)
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

// perfSide is one side of a perftest run: the endpoint, its memory and
// what the out-of-band exchange negotiated.
type perfSide struct {
	*endpoint
	c       *perfConfig
	mem     []byte // mmap'd: [0, half) source, [half, 2*half+cycle) target
	half    int
	mr      *memreg.MR
	params  oob.Params // negotiated
	remote  oob.PerfDest
	local   oob.PerfDest
	capture *pcaptap.Writer
	cm      *perfCM // -R: the rdma_cm connections
	posted  int     // receives outstanding
	results []perfResult
	srvRecv perfResult   // send-bw server's own measurement
	lastWC  atomic.Int64 // -b send-bw: UnixNano of the last completion
}

const perfCycle = 4096 // cycle buffer: the page size, as perftest

func (s *perfSide) recvBase() uint64 { return s.mr.IOVA() + uint64(s.half) }

// perfInc is perftest's INC(size, cache line): the step between slots.
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
	sock, err := listenSocket(local, c.sock.options(!c.test.IsBW() && !c.events, defaultBusyPoll), "use --bind with another local address")
	if err != nil {
		return nil, err
	}
	var link udp.Link = sock
	var capture *pcaptap.Writer
	if c.pcap != "" {
		if capture, err = createCapture(c.pcap); err != nil {
			sock.Close()
			return nil, err
		}
		link = pcaptap.New(sock, capture, pcaptap.Both)
	}
	e, err := newEndpoint(link, endpointConfig{sendCQ: c.txDepth + 16, recvCQ: c.txDepth + c.rxDepth + 16,
		maxSendWR: c.txDepth + 1, maxRecvWR: c.rxDepth + 1,
		access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic})
	if err != nil {
		if capture != nil {
			capture.Close()
		}
		return nil, err
	}
	s := &perfSide{endpoint: e, c: c, capture: capture}
	s.half = (max(slices.Max(c.sizes()), perfCycle) + 4095) &^ 4095
	s.mem, s.mr, err = e.alloc(2*s.half+perfCycle, memreg.AccessLocalWrite|e.access)
	if err != nil {
		s.close()
		return nil, err
	}
	outReads := uint16(1)
	if c.test == oob.ReadBW || c.test == oob.ReadLat || c.test == oob.AtomicBW || c.test == oob.AtomicLat {
		outReads = 16
	}
	s.local = oob.PerfDest{OutReads: outReads, QPN: s.qp.QPN(), PSN: s.psn, RKey: s.mr.RKey(),
		VAddr: s.recvBase(), GID: e.dev.GID()}
	return s, nil
}

// close closes the endpoint, then the capture (with every packet the
// device sent or received), and reports the capture's error.
func (s *perfSide) close() error {
	s.endpoint.close()
	var err error
	if s.capture != nil {
		err = s.capture.Close()
		s.capture = nil
	}
	return err
}

func (s *perfSide) txDepth() int {
	if s.c.test.IsBW() {
		return min(s.c.txDepth, s.c.iters)
	}
	return 1
}

// connect takes the QP to RTS towards the peer with the negotiated
// parameters (ctx_connect; with -R the CM has connected it: the peer's QP
// data must name the QP it connected) and prints perftest's header, both
// address lines and the head of the result table.
func (s *perfSide) connect(remote oob.PerfDest, neg oob.Params, stdout io.Writer) error {
	s.remote, s.params = remote, neg
	if s.cm != nil {
		if err := s.cm.checkRemote(remote); err != nil {
			return err
		}
	} else {
		peer, err := peerFromGID(remote.GID, "-x")
		if err != nil {
			return err
		}
		mtu, ok := transport.MTUFromBytes(neg.MTU.Bytes())
		if !ok {
			return fmt.Errorf("negotiated MTU %d is invalid", neg.MTU)
		}
		rd := uint8(min(max(remote.OutReads, 1), 16))
		if err := s.endpoint.connect(peer, remote.QPN, remote.PSN, mtu, rd, uint8(s.c.qpTimeout)); err != nil {
			return err
		}
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
	recvSide := c.test == oob.SendLat || (c.test == oob.SendBW && (c.role() == oob.Server || c.bidi))
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
