package cli

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

// Endpoint is one RoCEv2 end of a command (demo and bench run two in one
// process, pingpong and the perftest commands one each): a device on a
// link, a protection domain, its CQs, one QP in INIT (RC, or UC for
// uc-pingpong, or UD for ud-pingpong), and the memory registered with alloc.
type Endpoint struct {
	Link   udp.Link // the device's link
	Dev    *transport.Device
	PD     *memreg.PD
	SCQ    *transport.CQ // send CQ
	RCQ    *transport.CQ // receive CQ (scq when one CQ serves both queues)
	QP     *transport.QP
	PSN    uint32         // first send PSN (random, 24 bits)
	SRQ    *transport.SRQ // the shared receive queue of the QPs (srq-pingpong), or nil
	Access memreg.Access  // remote access the QP grants the peer
	// SR connects the QPs with selective repeat (--selective-repeat: the
	// peer must be a rocev2d that set it too).
	SR bool
	// TrafficClass is the traffic class ConnectQP gives the QPs (the IP
	// DSCP/ECN byte of their packets), as ibv_modify_qp's GRH
	// traffic_class (perftest's --tclass).
	TrafficClass uint8
	// release undoes the registrations and mappings of Alloc, in reverse
	// order, after the device is closed.
	release []func()
}

// EndpointConfig sizes an Endpoint's queues.
type EndpointConfig struct {
	SendCQ, RecvCQ       int // CQ depths; recvCQ 0: one CQ of sendCQ entries for both queues
	MaxSendWR, MaxRecvWR int
	SigAll               bool          // every send work request completes signalled
	Access               memreg.Access // remote access rights of the QP (RC)
	// UD makes the QP a UD QP with Q_Key qkey (in INIT; QP.ReadyUD takes
	// it to RTS) instead of an RC QP.
	UD      bool
	QKey    uint32
	PortMTU transport.MTU // the device's port MTU, the largest UD message (0: 1024)
	// UC makes the QP a UC QP (in INIT like an RC QP; connect takes it
	// to RTS, and sets only what UC has).
	UC bool
	// SRQWR, when > 0, gives the Endpoint a shared receive queue of
	// srqWR one-SGE WRs (e.SRQ) from which its QPs take their receives;
	// maxRecvWR is then unused (srq-pingpong).
	SRQWR int
	// CC is the device's congestion control (ECN, CNPs, DCQCN): the
	// command's --ecn, --cnp-interval, --dcqcn and --dcqcn-param.
	CC transport.CongestionConfig
	// Clock drives the device's timers (nil: the wall clock); congestion's
	// virtual-time runs share one transport.ManualClock.
	Clock transport.Clock
	// RdAtomic is the device's READ/atomic depth limit
	// (DeviceConfig.MaxRdAtomic; 0: the transport's default, 16).
	RdAtomic int
	// MaxQP bounds the device's QPs (DeviceConfig.MaxQP; 0: the
	// transport's default, 1024): cmtime's thousands of connections.
	MaxQP int
}

// NewEndpoint creates a device on link with one PD, the CQs and an RC (or
// UC or UD) QP, and takes the QP to INIT, so that receives can be posted before
// the peer is known. The Endpoint owns Link: on an error it is closed.
func NewEndpoint(link udp.Link, cfg EndpointConfig) (*Endpoint, error) {
	dev, err := transport.NewDevice(link, transport.DeviceConfig{PortMTU: cfg.PortMTU, Congestion: cfg.CC, Clock: cfg.Clock, MaxRdAtomic: cfg.RdAtomic, MaxQP: cfg.MaxQP})
	if err != nil {
		link.Close()
		return nil, err
	}
	e := &Endpoint{Link: link, Dev: dev, PSN: rand.Uint32() & 0xffffff, Access: cfg.Access}
	fail := func(err error) (*Endpoint, error) {
		e.Close()
		return nil, err
	}
	if e.PD, err = dev.AllocPD(); err != nil {
		return fail(fmt.Errorf("couldn't allocate PD: %w", err))
	}
	if e.SCQ, err = dev.CreateCQ(cfg.SendCQ); err != nil {
		return fail(fmt.Errorf("couldn't create CQ: %w", err))
	}
	e.RCQ = e.SCQ
	if cfg.RecvCQ > 0 {
		if e.RCQ, err = dev.CreateCQ(cfg.RecvCQ); err != nil {
			return fail(fmt.Errorf("couldn't create CQ: %w", err))
		}
	}
	if cfg.SRQWR > 0 {
		if e.SRQ, err = dev.CreateSRQ(e.PD, transport.SRQAttr{MaxWR: cfg.SRQWR, MaxSGE: 1}); err != nil {
			return fail(fmt.Errorf("couldn't create SRQ: %w", err))
		}
	}
	if e.QP, err = e.NewQP(cfg); err != nil {
		return fail(err)
	}
	return e, nil
}

// newQP creates a QP as cfg says (RC, UC or UD; on the SRQ when the
// Endpoint has one) on the Endpoint's PD and CQs and takes it to INIT.
// NewEndpoint creates the first (e.QP); srq-pingpong adds more.
func (e *Endpoint) NewQP(cfg EndpointConfig) (*transport.QP, error) {
	typ := transport.QPTypeRC
	switch {
	case cfg.UD:
		typ = transport.QPTypeUD
	case cfg.UC:
		typ = transport.QPTypeUC
	}
	qp, err := e.Dev.CreateQP(e.PD, transport.QPInitAttr{Type: typ, SendCQ: e.SCQ, RecvCQ: e.RCQ,
		MaxSendWR: cfg.MaxSendWR, MaxRecvWR: cfg.MaxRecvWR, MaxSGE: 1, SRQ: e.SRQ, SigAll: cfg.SigAll})
	if err != nil {
		return nil, fmt.Errorf("couldn't create QP: %w", err)
	}
	if cfg.UD {
		// RESET to INIT with the Q_Key, as ibv_ud_pingpong's pp_init_ctx.
		a := transport.QPAttr{State: transport.QPSInit, Port: 1, QKey: cfg.QKey}
		if err := qp.Modify(&a, transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrQKey); err != nil {
			return nil, fmt.Errorf("failed to modify QP to INIT: %w", err)
		}
		return qp, nil
	}
	if err := qp.Init(cfg.Access); err != nil {
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
func (e *Endpoint) Connect(peer netip.Addr, peerQPN, peerPSN uint32, mtu transport.MTU, rdAtomic, timeout uint8) error {
	return e.ConnectQP(e.QP, e.PSN, peer, peerQPN, peerPSN, mtu, rdAtomic, timeout)
}

// connectQP is connect for another QP of the Endpoint (newQP), whose
// first send PSN is psn.
func (e *Endpoint) ConnectQP(qp *transport.QP, psn uint32, peer netip.Addr, peerQPN, peerPSN uint32, mtu transport.MTU, rdAtomic, timeout uint8) error {
	if err := PeerFamily(e.Dev.Addr(), peer); err != nil {
		return err
	}
	return qp.Connect(transport.ConnParams{Peer: peer, DestQPN: peerQPN, RQPSN: peerPSN, SQPSN: psn,
		PathMTU: mtu, Access: e.Access, MaxRdAtomic: rdAtomic, MaxDestRdAtomic: rdAtomic, TrafficClass: e.TrafficClass,
		Retry: &transport.Retry{Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}, SelectiveRepeat: e.SR})
}

// PeerFamily explains a peer GID of the other address family than the
// local RoCEv2 address: both come from what the user gave (--bind, or the
// out-of-band connection's local end without it; the peer's GID index).
func PeerFamily(local, peer netip.Addr) error {
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
func (e *Endpoint) Alloc(n int, access memreg.Access) ([]byte, *memreg.MR, error) {
	b, free, err := MapMemory(max(n, 1))
	if err != nil {
		return nil, nil, fmt.Errorf("allocating %d bytes: %w", n, err)
	}
	e.release = append(e.release, free)
	mr, err := e.PD.RegisterMR(b[:n], access)
	if err != nil {
		return nil, nil, fmt.Errorf("couldn't register MR: %w", err)
	}
	e.release = append(e.release, func() { mr.Deregister() })
	return b[:n], mr, nil
}

// Register registers b, memory of Alloc, as a memory region of its own
// (perftest's --mr_per_qp), deregistered with Alloc's.
func (e *Endpoint) Register(b []byte, access memreg.Access) (*memreg.MR, error) {
	mr, err := e.PD.RegisterMR(b, access)
	if err != nil {
		return nil, fmt.Errorf("couldn't register MR: %w", err)
	}
	e.release = append(e.release, func() { mr.Deregister() })
	return mr, nil
}

// close closes the device (its QP, CQs and link), then deregisters and
// unmaps the memory of alloc. It may be called more than once.
func (e *Endpoint) Close() {
	if e.Dev != nil {
		e.Dev.Close()
		e.Dev = nil
	}
	e.ReleaseMemory()
}

// ReleaseMemory deregisters and unmaps the memory of Alloc (in reverse
// order) without closing the device: for an endpoint that shares another's
// device and PD (a persistent rping server's connections).
func (e *Endpoint) ReleaseMemory() {
	for i := len(e.release) - 1; i >= 0; i-- {
		e.release[i]()
	}
	e.release = nil
}

// ListenSocket opens a UDP socket link on addr, port 4791. When that
// fails, the error names address and port and says what to do; advice
// names the command's way out (another address, another link).
func ListenSocket(addr netip.Addr, opts udp.SocketOptions, advice string) (*udp.SocketLink, error) {
	l, err := udp.ListenSocket(addr, &opts)
	if err == nil {
		return l, nil
	}
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		if !foreignGroup(err) { // that error says who holds it
			advice = "another program (a kernel rxe device, another rocev2d) holds the port; " + advice
		}
		if addr.Is4() && addr.IsLoopback() {
			// Two sides on one host each need an address of their own.
			advice += "; every 127.0.0.x address is this host's, so 127.0.0.N with another N will do"
		}
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		advice = "the address is not configured on this host; " + advice
	case errors.Is(err, syscall.EINVAL) && NeedsZone(addr):
		advice = fmt.Sprintf("a link-local address needs its zone, the interface it is on, e.g. %v%%eth0", addr)
	}
	return nil, fmt.Errorf("cannot open a RoCEv2 socket on %v: %w\n  (%s)", netip.AddrPortFrom(addr, udp.Port), err, advice)
}

// ListenSocketPair opens the socket links of two endpoints in one process
// (demo, bench), on addresses a and b.
func ListenSocketPair(a, b netip.Addr, opts udp.SocketOptions, advice string) (la, lb udp.Link, err error) {
	sa, err := ListenSocket(a, opts, advice)
	if err != nil {
		return nil, nil, err
	}
	sb, err := ListenSocket(b, opts, advice)
	if err != nil {
		sa.Close()
		return nil, nil, err
	}
	return sa, sb, nil
}

// PairQueues sizes the queues of demo's and bench's endpoints.
var PairQueues = EndpointConfig{SendCQ: 1024, RecvCQ: 1024, MaxSendWR: 256, MaxRecvWR: 256,
	Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic}

// NewEndpointPair creates endpoints A on la (address addrA) and B on lb
// (addrB), their devices' congestion control configured by cc (the
// command's --ecn, --dcqcn, ... options), and connects their QPs to each
// other with path MTU mtu, 16 READ/atomic requests outstanding each way
// and ACK timeout 14, as ibv_rc_pingpong's. It owns both links.
func NewEndpointPair(la, lb udp.Link, addrA, addrB netip.Addr, mtu transport.MTU, cc transport.CongestionConfig) (a, b *Endpoint, err error) {
	q := PairQueues
	q.CC = cc
	if a, err = NewEndpoint(la, q); err != nil {
		lb.Close()
		return nil, nil, fmt.Errorf("device A: %w", err)
	}
	if b, err = NewEndpoint(lb, q); err != nil {
		a.Close()
		return nil, nil, fmt.Errorf("device B: %w", err)
	}
	if err = a.Connect(addrB, b.QP.QPN(), b.PSN, mtu, 16, 14); err == nil {
		err = b.Connect(addrA, a.QP.QPN(), a.PSN, mtu, 16, 14)
	}
	if err != nil {
		a.Close()
		b.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// CheckCapturePath reports the error that CreateCapture would give for
// path's file, without writing it, for a command that creates its capture
// only later (a perftest server, once a client has connected): a bad --pcap
// is said at start-up, not to the first client.
func CheckCapturePath(path string) error {
	_, serr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("--pcap %s: %w", path, err)
	}
	f.Close()
	if os.IsNotExist(serr) {
		os.Remove(path)
	}
	return nil
}

// CreateCapture creates the pcap file of a --pcap flag, with the snap
// length of --snaplen (0: whole frames).
func CreateCapture(path string, snaplen int) (*pcaptap.Writer, error) {
	if snaplen < 0 {
		return nil, fmt.Errorf("--snaplen %d: must be 0 (whole frames) or more", snaplen)
	}
	w, err := pcaptap.Create(path, snaplen)
	if err != nil {
		return nil, fmt.Errorf("--pcap %s: %w", path, err)
	}
	return w, nil
}
