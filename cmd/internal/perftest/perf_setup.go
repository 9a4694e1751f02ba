package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// perfConnect opens the out-of-band TCP connection. The client retries
// until connTimeout; the server accepts one client, and prints perftest's
// banner to stdout once it listens.
func perfConnect(ctx context.Context, c *perfConfig, stdout io.Writer) (net.Conn, error) {
	port := strconv.Itoa(c.port)
	if c.server != "" {
		addr := net.JoinHostPort(c.server, port)
		deadline := time.Now().Add(c.connTimeout)
		local := cli.OOBLocalTCPAddr(c.bind, c.server)
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
			if perr := cli.OOBDialPermanent(err, c.bind, local); perr != nil {
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
	return cli.AcceptOne(ctx, c.port, func(err error) error {
		return fmt.Errorf("TCP port %d is in use (another server running?); pick another with -p: %w", c.port, err)
	}, func() {
		if c.output == "" { // --output prints the figures only
			printWaiting(stdout)
		}
	})
}

// printWaiting prints the banner of a perftest server waiting for its
// client.
func printWaiting(w io.Writer) {
	fmt.Fprintln(w, "\n************************************\n* Waiting for client to connect... *\n************************************")
}

// perfSide is one side of a perftest run: the endpoint, its memory and
// what the out-of-band exchange negotiated.
type perfSide struct {
	*cli.Endpoint
	c *perfConfig
	// mem is mmap'd: QP i's source at [i*half, (i+1)*half), its target
	// at [(q+i)*half, (q+i+1)*half) for q QPs, then the cycle buffer, as
	// perftest lays out one MR for all QPs (BUFF_SIZE per QP and side).
	mem     []byte
	half    int
	mr      *memreg.MR
	mrs     []*memreg.MR // --mr_per_qp: QP i's MR, over its source and target
	params  oob.Params   // negotiated
	remote  oob.PerfDest // QP 0's peer (qps[0].remote)
	local   oob.PerfDest // QP 0's QP data (with -R: after the CM connected it)
	qps     []*perfQP    // -q: the QPs, qps[0] on the endpoint's QP
	capture *pcaptap.Writer
	cm      *perfCM // -R: the rdma_cm connections
	results []perfResult
	srvRecv perfResult // send-bw server's own measurement
	// peerTestNote, if not empty, suspects the peer of running another
	// kind of test (checkPeerTest).
	peerTestNote string
	lastWC       atomic.Int64  // -b send-bw: UnixNano of the last completion
	sendWCs      atomic.Uint64 // send completions polled (one per -Q WRs)
}

// perfQP is one QP of a perftest side (-q): its first PSN, its QP data and
// the peer's, and the receives outstanding on it.
type perfQP struct {
	qp     *transport.QP
	psn    uint32
	local  oob.PerfDest // for QP 0 see perfSide.local
	remote oob.PerfDest
	posted int // receives outstanding
}

const perfCycle = 4096 // cycle buffer: the page size, as perftest

// srcOff and dstOff are the offsets in mem of QP i's source and target
// regions.
// With --mr_per_qp each QP's source and target are adjacent, one buffer
// and MR per QP, as perftest allocates them.
func (s *perfSide) srcOff(i int) int {
	if s.c.mrPerQP {
		return 2 * i * s.half
	}
	return i * s.half
}

func (s *perfSide) dstOff(i int) int {
	if s.c.mrPerQP {
		return (2*i + 1) * s.half
	}
	return (len(s.qps) + i) * s.half
}

// qpMR is QP i's memory region and the offset in mem where it starts.
func (s *perfSide) qpMR(i int) (*memreg.MR, int) {
	if s.mrs != nil {
		return s.mrs[i], s.srcOff(i)
	}
	return s.mr, 0
}

// srcAddr is the address of QP i's source region in its MR.
func (s *perfSide) srcAddr(i int) uint64 {
	mr, base := s.qpMR(i)
	return mr.IOVA() + uint64(s.srcOff(i)-base)
}

// src and dst are QP i's source and target regions.
func (s *perfSide) src(i int) []byte { return s.mem[s.srcOff(i) : s.srcOff(i)+s.half] }
func (s *perfSide) dst(i int) []byte { return s.mem[s.dstOff(i) : s.dstOff(i)+s.half] }

func (s *perfSide) recvBase() uint64 { return s.recvBaseQP(0) }

// recvBaseQP is the address of QP i's target region, which it announces.
func (s *perfSide) recvBaseQP(i int) uint64 {
	mr, base := s.qpMR(i)
	return mr.IOVA() + uint64(s.dstOff(i)-base)
}

// locals returns the QP data of every QP, for the exchange.
func (s *perfSide) locals() []oob.PerfDest {
	l := make([]oob.PerfDest, len(s.qps))
	for i, q := range s.qps {
		l[i] = q.local
	}
	l[0] = s.local
	return l
}

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
	sock, err := cli.ListenSocket(local, c.sock.Options(!c.test.IsBW() && !c.events, cli.DefaultBusyPoll), "use --bind with another local address")
	if err != nil {
		return nil, err
	}
	var link udp.Link = sock
	var capture *pcaptap.Writer
	if c.pcap != "" {
		if capture, err = cli.CreateCapture(c.pcap, c.snaplen); err != nil {
			sock.Close()
			return nil, err
		}
		link = pcaptap.New(sock, capture, pcaptap.Both)
	}
	nqp := max(c.qps, 1)
	// One send and one receive CQ for all QPs, as perftest sizes them.
	cfg := cli.EndpointConfig{SendCQ: c.txDepth*nqp + 16, RecvCQ: (c.txDepth+c.rxDepth)*nqp + 16,
		MaxSendWR: c.txDepth + 1, MaxRecvWR: c.rxDepth + 1,
		Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic, CC: c.sock.CC.Config()}
	if c.useSRQ {
		cfg.SRQWR = c.rxDepth + 1 // perftest's max_wr: -r
	}
	e, err := cli.NewEndpoint(link, cfg)
	if err != nil {
		if capture != nil {
			capture.Close()
		}
		return nil, err
	}
	e.SR = c.sr
	e.TrafficClass = uint8(c.tclass)
	s := &perfSide{Endpoint: e, c: c, capture: capture}
	s.qps = []*perfQP{{qp: e.QP, psn: e.PSN}}
	for i := 1; i < nqp; i++ {
		qp, err := e.NewQP(cfg)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("QP %d of %d: %w", i+1, nqp, err)
		}
		s.qps = append(s.qps, &perfQP{qp: qp, psn: rand.Uint32() & 0xffffff})
	}
	s.half = (max(slices.Max(c.sizes()), perfCycle) + 4095) &^ 4095
	s.mem, s.mr, err = e.Alloc(2*nqp*s.half+perfCycle, memreg.AccessLocalWrite|e.Access)
	if err != nil {
		s.close()
		return nil, err
	}
	if c.mrPerQP {
		for i := range s.qps {
			mr, err := e.Register(s.mem[s.srcOff(i):s.dstOff(i)+s.half], memreg.AccessLocalWrite|e.Access)
			if err != nil {
				s.close()
				return nil, fmt.Errorf("QP %d's MR (--mr_per_qp): %w", i+1, err)
			}
			s.mrs = append(s.mrs, mr)
		}
	}
	outReads := uint16(1)
	if c.test == oob.ReadBW || c.test == oob.ReadLat || c.test == oob.AtomicBW || c.test == oob.AtomicLat {
		outReads = 16
	}
	for i, q := range s.qps {
		mr, _ := s.qpMR(i)
		q.local = oob.PerfDest{OutReads: outReads, QPN: q.qp.QPN(), PSN: q.psn, RKey: mr.RKey(),
			VAddr: s.recvBaseQP(i), GID: e.Dev.GID()}
	}
	s.local = s.qps[0].local
	return s, nil
}

// close closes the endpoint, then the capture (with every packet the
// device sent or received), and reports the capture's error.
func (s *perfSide) close() error {
	s.Endpoint.Close()
	var err error
	if s.capture != nil {
		err = s.capture.Close()
		s.capture = nil
	}
	return err
}

func (s *perfSide) txDepth() int { return s.c.sendWindow() }

// connect takes the QP to RTS towards the peer with the negotiated
// parameters (ctx_connect; with -R the CM has connected it: the peer's QP
// data must name the QP it connected) and prints perftest's header, both
// address lines and the head of the result table.
func (s *perfSide) connect(remotes []oob.PerfDest, neg oob.Params, stdout io.Writer) error {
	if len(remotes) != len(s.qps) {
		// RunQPs has checked the count; this is a safety net.
		return fmt.Errorf("%d QP data records from the peer for %d QPs", len(remotes), len(s.qps))
	}
	remote := remotes[0]
	s.remote, s.params = remote, neg
	for i, q := range s.qps {
		q.remote = remotes[i]
	}
	if err := s.checkPeerTest(remotes); err != nil {
		return err
	}
	if s.cm != nil {
		if err := s.cm.checkRemote(remotes); err != nil {
			return err
		}
	} else {
		mtu, ok := transport.MTUFromBytes(neg.MTU.Bytes())
		if !ok {
			return fmt.Errorf("negotiated MTU %d is invalid", neg.MTU)
		}
		for i, q := range s.qps {
			r := remotes[i]
			peer, err := cli.PeerFromGID(r.GID, "-x")
			if err != nil {
				return err
			}
			rd := uint8(min(max(r.OutReads, 1), 16))
			if err := s.Endpoint.ConnectQP(q.qp, q.psn, peer, r.QPN, r.PSN, mtu, rd, uint8(s.c.qpTimeout)); err != nil {
				if len(s.qps) > 1 {
					return fmt.Errorf("QP %d of %d: %w", i+1, len(s.qps), err)
				}
				return err
			}
		}
	}
	if s.c.verbose {
		s.printRecovery(stdout)
	}
	if s.c.output != "" {
		return nil // --output prints the figures only
	}
	s.printHeader(stdout)
	// perftest prints every local QP's line, then every remote one's.
	for i := range s.qps {
		s.printDest(stdout, "local", s.locals()[i])
	}
	for _, r := range remotes {
		s.printDest(stdout, "remote", r)
	}
	fmt.Fprint(stdout, perfLine)
	if s.c.test.IsBW() {
		fmt.Fprintln(stdout, bwColumns(s.c.gbits))
	} else {
		fmt.Fprintln(stdout, latColumns)
	}
	return nil
}

// packets counts the packets the side's device has sent and received, to
// tell a data phase that still moves.
func (s *perfSide) packets() uint64 {
	c := s.Dev.Counters()
	return c.SentPkts + c.RcvdPkts
}

// checkPeerTest tells from the peer's QP data whether it runs another
// kind of test, as far as perftest's exchange, which has no field for the
// test, tells: perftest announces 1 outstanding READ (out_reads) in its
// WRITE and SEND tests and the device's limit, or -o, in its READ and
// atomic tests (rocev2d 16). A WRITE or SEND side refuses a peer that
// announces more than 1. A READ or atomic side cannot refuse 1 (ib_read_bw
// -o 1 announces it too); it notes the suspicion in peerTestNote, which
// words the error if the peer then hangs up.
func (s *perfSide) checkPeerTest(remotes []oob.PerfDest) error {
	t := s.c.test
	readSide := t == oob.ReadBW || t == oob.ReadLat || t == oob.AtomicBW || t == oob.AtomicLat
	most := uint16(0)
	for _, r := range remotes {
		most = max(most, r.OutReads)
	}
	switch {
	case !readSide && most > 1:
		return fmt.Errorf("%w: the peer announces %d outstanding READs/atomics (OUT %#x), which perftest's READ and atomic tests do "+
			"and its WRITE and SEND tests never (they announce 1): it runs a READ or atomic test against this %s; both sides need the same test",
			errPeerTest, most, most, t)
	case readSide && most == 1:
		s.peerTestNote = fmt.Sprintf("the peer announced 1 outstanding READ, as perftest's WRITE and SEND tests do "+
			"(and its READ and atomic tests only with -o 1): does it run a WRITE or SEND test against this %s? both sides need the same test", t)
	}
	return nil
}

// errPeerTest marks the peer running another kind of perftest test.
var errPeerTest = errors.New("test mismatch")

// prepare posts the receives a SEND test needs before the barrier.
func (s *perfSide) prepare(size int) error {
	c := s.c
	recvSide := c.test == oob.SendLat || (c.test == oob.SendBW && (c.role() == oob.Server || c.bidi))
	if !recvSide {
		return nil
	}
	want := min(s.recvDepth(), c.iters)
	if c.duration > 0 {
		want = s.recvDepth()
	}
	// rx depth receives on each QP, as perftest's ctx_set_recv_wqes.
	for i, q := range s.qps {
		for q.posted < want {
			if err := s.postRecv(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// recvDepth is how many receives a side keeps posted for each QP: -r,
// or with --use-srq -r over the QPs, as perftest divides its SRQ.
func (s *perfSide) recvDepth() int {
	if s.SRQ != nil {
		return max(s.c.rxDepth/len(s.qps), 1)
	}
	return s.c.rxDepth
}

// postRecv posts a receive on QP i, into its target region; its wr_id is
// i, as perftest's.
func (s *perfSide) postRecv(i int) error {
	// Each receive may take the largest message of the run, at its slot.
	q := s.qps[i]
	mr, _ := s.qpMR(i)
	wr := transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{{Addr: s.recvBaseQP(i), Length: uint32(s.half), LKey: mr.LKey()}}}
	post := q.qp.PostRecv
	if s.SRQ != nil {
		post = s.SRQ.PostRecv // --use-srq: any QP may take it
	}
	if err := post(wr); err != nil {
		return fmt.Errorf("couldn't post receive: %w", err)
	}
	q.posted++
	return nil
}

// printRecovery prints, per test QP, the loss recovery it runs (-v):
// selective repeat when both sides asked for it (--selective-repeat) and,
// with -R, what the ECE exchange carried each way.
func (s *perfSide) printRecovery(w io.Writer) {
	for i, q := range s.qps {
		mode := "go-back-N"
		if q.qp.SelectiveRepeat() {
			mode = "selective repeat"
		}
		ece := ""
		if s.cm != nil && i < len(s.cm.tests) {
			c := s.cm.tests[i]
			ece = fmt.Sprintf(" (ECE sent %v, received %v)", c.LocalECE(), c.RemoteECE())
		} else if s.c.sr {
			ece = " (--selective-repeat: the peer must set it too)"
		}
		fmt.Fprintf(w, " QP %d loss recovery: %s%s\n", i+1, mode, ece)
	}
}
