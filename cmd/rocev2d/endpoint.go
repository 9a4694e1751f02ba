package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"syscall"

	"github.com/gorocev2/rocev2/cmd/internal/pcaptap"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// endpoint is one RoCEv2 end of a command (demo and bench run two in one
// process, pingpong and the perftest commands one each): a device on a
// link, a protection domain, its CQs, one QP in INIT (RC, or UC for
// uc-pingpong, or UD for ud-pingpong), and the memory registered with alloc.
type endpoint struct {
	link   udp.Link // the device's link
	dev    *transport.Device
	pd     *memreg.PD
	scq    *transport.CQ // send CQ
	rcq    *transport.CQ // receive CQ (scq when one CQ serves both queues)
	qp     *transport.QP
	psn    uint32         // first send PSN (random, 24 bits)
	srq    *transport.SRQ // the shared receive queue of the QPs (srq-pingpong), or nil
	access memreg.Access  // remote access the QP grants the peer
	// sr connects the QPs with selective repeat (--selective-repeat: the
	// peer must be a rocev2d that set it too).
	sr bool
	// release undoes the registrations and mappings of alloc, in reverse
	// order, after the device is closed.
	release []func()
}

// endpointConfig sizes an endpoint's queues.
type endpointConfig struct {
	sendCQ, recvCQ       int // CQ depths; recvCQ 0: one CQ of sendCQ entries for both queues
	maxSendWR, maxRecvWR int
	sigAll               bool          // every send work request completes signalled
	access               memreg.Access // remote access rights of the QP (RC)
	// ud makes the QP a UD QP with Q_Key qkey (in INIT; QP.ReadyUD takes
	// it to RTS) instead of an RC QP.
	ud      bool
	qkey    uint32
	portMTU transport.MTU // the device's port MTU, the largest UD message (0: 1024)
	// uc makes the QP a UC QP (in INIT like an RC QP; connect takes it
	// to RTS, and sets only what UC has).
	uc bool
	// srqWR, when > 0, gives the endpoint a shared receive queue of
	// srqWR one-SGE WRs (e.srq) from which its QPs take their receives;
	// maxRecvWR is then unused (srq-pingpong).
	srqWR int
	// cc is the device's congestion control (ECN, CNPs, DCQCN): the
	// command's --ecn, --cnp-interval, --dcqcn and --dcqcn-param.
	cc transport.CongestionConfig
	// clock drives the device's timers (nil: the wall clock); congestion's
	// virtual-time runs share one transport.ManualClock.
	clock transport.Clock
	// rdAtomic is the device's READ/atomic depth limit
	// (DeviceConfig.MaxRdAtomic; 0: the transport's default, 16).
	rdAtomic int
}

// newEndpoint creates a device on link with one PD, the CQs and an RC (or
// UC or UD) QP, and takes the QP to INIT, so that receives can be posted before
// the peer is known. The endpoint owns link: on an error it is closed.
func newEndpoint(link udp.Link, cfg endpointConfig) (*endpoint, error) {
	dev, err := transport.NewDevice(link, transport.DeviceConfig{PortMTU: cfg.portMTU, Congestion: cfg.cc, Clock: cfg.clock, MaxRdAtomic: cfg.rdAtomic})
	if err != nil {
		link.Close()
		return nil, err
	}
	e := &endpoint{link: link, dev: dev, psn: rand.Uint32() & 0xffffff, access: cfg.access}
	fail := func(err error) (*endpoint, error) {
		e.close()
		return nil, err
	}
	if e.pd, err = dev.AllocPD(); err != nil {
		return fail(fmt.Errorf("couldn't allocate PD: %w", err))
	}
	if e.scq, err = dev.CreateCQ(cfg.sendCQ); err != nil {
		return fail(fmt.Errorf("couldn't create CQ: %w", err))
	}
	e.rcq = e.scq
	if cfg.recvCQ > 0 {
		if e.rcq, err = dev.CreateCQ(cfg.recvCQ); err != nil {
			return fail(fmt.Errorf("couldn't create CQ: %w", err))
		}
	}
	if cfg.srqWR > 0 {
		if e.srq, err = dev.CreateSRQ(e.pd, transport.SRQAttr{MaxWR: cfg.srqWR, MaxSGE: 1}); err != nil {
			return fail(fmt.Errorf("couldn't create SRQ: %w", err))
		}
	}
	if e.qp, err = e.newQP(cfg); err != nil {
		return fail(err)
	}
	return e, nil
}

// newQP creates a QP as cfg says (RC, UC or UD; on the SRQ when the
// endpoint has one) on the endpoint's PD and CQs and takes it to INIT.
// newEndpoint creates the first (e.qp); srq-pingpong adds more.
func (e *endpoint) newQP(cfg endpointConfig) (*transport.QP, error) {
	typ := transport.QPTypeRC
	switch {
	case cfg.ud:
		typ = transport.QPTypeUD
	case cfg.uc:
		typ = transport.QPTypeUC
	}
	qp, err := e.dev.CreateQP(e.pd, transport.QPInitAttr{Type: typ, SendCQ: e.scq, RecvCQ: e.rcq,
		MaxSendWR: cfg.maxSendWR, MaxRecvWR: cfg.maxRecvWR, MaxSGE: 1, SRQ: e.srq, SigAll: cfg.sigAll})
	if err != nil {
		return nil, fmt.Errorf("couldn't create QP: %w", err)
	}
	if cfg.ud {
		// RESET to INIT with the Q_Key, as ibv_ud_pingpong's pp_init_ctx.
		a := transport.QPAttr{State: transport.QPSInit, Port: 1, QKey: cfg.qkey}
		if err := qp.Modify(&a, transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrQKey); err != nil {
			return nil, fmt.Errorf("failed to modify QP to INIT: %w", err)
		}
		return qp, nil
	}
	if err := qp.Init(cfg.access); err != nil {
		return nil, err
	}
	return qp, nil
}

// connect takes the QP to RTS towards the QP peerQPN at peer, whose first
// send PSN is peerPSN, with path MTU mtu, rdAtomic READ/atomic requests
// outstanding in each direction and the local ACK timeout exponent timeout.
// Retries are those of rdma-core's ibv_rc_pingpong and perftest, which
// rocev2d interoperates with: retry_cnt 7, rnr_retry 7 (infinite) and an
// RNR NAK timer of 12 (0.64 ms).
func (e *endpoint) connect(peer netip.Addr, peerQPN, peerPSN uint32, mtu transport.MTU, rdAtomic, timeout uint8) error {
	return e.connectQP(e.qp, e.psn, peer, peerQPN, peerPSN, mtu, rdAtomic, timeout)
}

// connectQP is connect for another QP of the endpoint (newQP), whose
// first send PSN is psn.
func (e *endpoint) connectQP(qp *transport.QP, psn uint32, peer netip.Addr, peerQPN, peerPSN uint32, mtu transport.MTU, rdAtomic, timeout uint8) error {
	if err := peerFamily(e.dev.Addr(), peer); err != nil {
		return err
	}
	return qp.Connect(transport.ConnParams{Peer: peer, DestQPN: peerQPN, RQPSN: peerPSN, SQPSN: psn,
		PathMTU: mtu, Access: e.access, MaxRdAtomic: rdAtomic, MaxDestRdAtomic: rdAtomic,
		Retry: &transport.Retry{Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}, SelectiveRepeat: e.sr})
}

// peerFamily explains a peer GID of the other address family than the
// local RoCEv2 address: both come from what the user gave (--bind, or the
// out-of-band connection's local end without it; the peer's GID index).
func peerFamily(local, peer netip.Addr) error {
	local, peer = local.Unmap(), peer.Unmap()
	if local.Is4() == peer.Is4() {
		return nil
	}
	fam := func(a netip.Addr) string {
		if a.Is4() {
			return "IPv4"
		}
		return "IPv6"
	}
	// The address --bind needs is of the peer's family.
	example := "e.g. 192.0.2.1"
	if !peer.Is4() {
		example = "a link-local one with its zone, e.g. fe80::1%eth0"
	}
	return fmt.Errorf("the peer's GID %v is %s but the local RoCEv2 address %v is %s: give --bind an %s address of this host "+
		"(%s), or have the peer use its %s GID index",
		peer, fam(peer), local, fam(local), fam(peer), example, fam(local))
}

// alloc maps n bytes (at least one page) of anonymous memory and registers
// them with access; close undoes both after closing the device. Registered
// memory is mmap'd, like the pinned host memory an RNIC reads and writes
// behind the program's back: the ordering between the program's accesses
// and the device's goes through completions and the network, which the
// race detector cannot see. The memory stays registered until close: a
// late duplicate request (a retransmission or a network duplicate) may
// still arrive for a finished transfer, as it may for any RNIC application.
func (e *endpoint) alloc(n int, access memreg.Access) ([]byte, *memreg.MR, error) {
	b, free, err := mapMemory(max(n, 1))
	if err != nil {
		return nil, nil, fmt.Errorf("allocating %d bytes: %w", n, err)
	}
	e.release = append(e.release, free)
	mr, err := e.pd.RegisterMR(b[:n], access)
	if err != nil {
		return nil, nil, fmt.Errorf("couldn't register MR: %w", err)
	}
	e.release = append(e.release, func() { mr.Deregister() })
	return b[:n], mr, nil
}

// close closes the device (its QP, CQs and link), then deregisters and
// unmaps the memory of alloc. It may be called more than once.
func (e *endpoint) close() {
	if e.dev != nil {
		e.dev.Close()
		e.dev = nil
	}
	for i := len(e.release) - 1; i >= 0; i-- {
		e.release[i]()
	}
	e.release = nil
}

// listenSocket opens a UDP socket link on addr, port 4791. When that
// fails, the error names address and port and says what to do; advice
// names the command's way out (another address, another link).
func listenSocket(addr netip.Addr, opts udp.SocketOptions, advice string) (*udp.SocketLink, error) {
	l, err := udp.ListenSocket(addr, &opts)
	if err == nil {
		return l, nil
	}
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		advice = "another program (a kernel rxe device, another rocev2d) holds the port; " + advice
		if addr.Is4() && addr.IsLoopback() {
			// Two sides on one host each need an address of their own.
			advice += "; every 127.0.0.x address is this host's, so 127.0.0.N with another N will do"
		}
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		advice = "the address is not configured on this host; " + advice
	}
	return nil, fmt.Errorf("cannot open a RoCEv2 socket on %v: %w\n  (%s)", netip.AddrPortFrom(addr, udp.Port), err, advice)
}

// listenSocketPair opens the socket links of two endpoints in one process
// (demo, bench), on addresses a and b.
func listenSocketPair(a, b netip.Addr, opts udp.SocketOptions, advice string) (la, lb udp.Link, err error) {
	sa, err := listenSocket(a, opts, advice)
	if err != nil {
		return nil, nil, err
	}
	sb, err := listenSocket(b, opts, advice)
	if err != nil {
		sa.Close()
		return nil, nil, err
	}
	return sa, sb, nil
}

// pairQueues sizes the queues of demo's and bench's endpoints.
var pairQueues = endpointConfig{sendCQ: 1024, recvCQ: 1024, maxSendWR: 256, maxRecvWR: 256,
	access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic}

// newEndpointPair creates endpoints A on la (address addrA) and B on lb
// (addrB), their devices' congestion control configured by cc (the
// command's --ecn, --dcqcn, ... options), and connects their QPs to each
// other with path MTU mtu, 16 READ/atomic requests outstanding each way
// and ACK timeout 14, as ibv_rc_pingpong's. It owns both links.
func newEndpointPair(la, lb udp.Link, addrA, addrB netip.Addr, mtu transport.MTU, cc transport.CongestionConfig) (a, b *endpoint, err error) {
	q := pairQueues
	q.cc = cc
	if a, err = newEndpoint(la, q); err != nil {
		lb.Close()
		return nil, nil, fmt.Errorf("device A: %w", err)
	}
	if b, err = newEndpoint(lb, q); err != nil {
		a.close()
		return nil, nil, fmt.Errorf("device B: %w", err)
	}
	if err = a.connect(addrB, b.qp.QPN(), b.psn, mtu, 16, 14); err == nil {
		err = b.connect(addrA, a.qp.QPN(), a.psn, mtu, 16, 14)
	}
	if err != nil {
		a.close()
		b.close()
		return nil, nil, err
	}
	return a, b, nil
}

// createCapture creates the pcap file of a --pcap flag, with the snap
// length of --snaplen (0: whole frames).
func createCapture(path string, snaplen int) (*pcaptap.Writer, error) {
	if snaplen < 0 {
		return nil, fmt.Errorf("--snaplen %d: must be 0 (whole frames) or more", snaplen)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--pcap: %w", err)
	}
	w, err := pcaptap.NewWriterSnap(f, snaplen)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("--pcap %s: %w", path, err)
	}
	return w, nil
}
