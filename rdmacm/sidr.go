package rdmacm

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
)

// UDPQKey is the Q_Key rdma_cm gives the UD QPs of its UDP port space
// (RDMA_UDP_QKEY): a UD QP that serves librdmacm peers (udaddy) uses it.
const UDPQKey = 0x01234567

// UDPeer is a resolved UD service: where to send datagrams.
type UDPeer struct {
	Addr        netip.Addr // the service's IP address
	QPN         uint32     // its UD QP
	QKey        uint32     // the Q_Key its QP takes
	PrivateData []byte     // the SIDR_REP's private data
}

// UDOptions configure ResolveUD.
type UDOptions struct {
	// PrivateData goes with the request (at most 180 bytes behind
	// rdma_cm's header).
	PrivateData []byte
	// ResponseTimeout and MaxRetries as in Options (defaults 1 s, 15).
	ResponseTimeout time.Duration
	MaxRetries      int
	// TrafficClass of the MADs; LocalPort the rdma_cm source port
	// (default random).
	TrafficClass uint8
	LocalPort    uint16
}

type sidrResult struct {
	peer UDPeer
	err  error
}

type sidrWait struct {
	ch  chan sidrResult
	to  netip.AddrPort // where the SIDR_REQ goes
	tid uint64         // its transaction ID
}

func (w *sidrWait) done(r sidrResult) {
	select {
	case w.ch <- r:
	default:
	}
}

// ResolveUD asks the UD service at addr (IP address and port of the UDP
// port space) for its QP number and Q_Key with a SIDR_REQ, the way
// rdma_resolve_route and rdma_connect do for a UD rdma_cm ID (udaddy).
// The error is a *RejectError for a SIDR_REP with an error status
// (errors.Is(err, ErrRefused) when nothing serves the port), ErrTimeout
// after the retries, ErrUnreachable naming the address as soon as the
// network bounces the request (ICMP port or host unreachable, on links
// that report them: as Dial), or ctx's error.
func (m *Manager) ResolveUD(ctx context.Context, addr netip.AddrPort, opts *UDOptions) (UDPeer, error) {
	dev := m.dev
	var o UDOptions
	if opts != nil {
		o = *opts
	}
	if o.ResponseTimeout <= 0 {
		o.ResponseTimeout = time.Second
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = 15
	}
	if len(o.PrivateData) > cm.CMASIDRREQPrivateDataSize {
		return UDPeer{}, fmt.Errorf("rdmacm: ResolveUD: %d bytes of private data, at most %d", len(o.PrivateData), cm.CMASIDRREQPrivateDataSize)
	}
	peer := addr.Addr().Unmap().WithZone("") // as Dial
	if !peer.IsValid() || peer.Is4() != dev.Addr().Is4() {
		return UDPeer{}, fmt.Errorf("rdmacm: ResolveUD: address %v is not in the device's address family", addr)
	}
	if o.LocalPort == 0 {
		o.LocalPort = uint16(32768 + random32()%28232)
	}
	req := cm.SIDRREQFields{PKey: 0xffff, ServiceID: cm.ServiceID(cm.PSUDP, addr.Port())}
	hdr := cm.CMAHeaderFields{Version: cm.CMAVersion, SrcPort: o.LocalPort, Src: dev.Addr(), Dst: peer}
	if err := cm.CMAHeader(req.PrivateData[:cm.CMAHeaderSize]).Encode(&hdr); err != nil {
		return UDPeer{}, fmt.Errorf("rdmacm: ResolveUD: %w", err)
	}
	copy(req.PrivateData[cm.CMAHeaderSize:], o.PrivateData)
	w := &sidrWait{ch: make(chan sidrResult, 1), to: netip.AddrPortFrom(peer, addr.Port()), tid: m.agent.NewTID()}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return UDPeer{}, m.closeErr
	}
	for {
		req.RequestID = m.tag.Apply(random32())
		if _, busy := m.sidr[req.RequestID]; !busy {
			break
		}
	}
	m.sidr[req.RequestID] = w
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.sidr, req.RequestID)
		m.mu.Unlock()
	}()
	tid := w.tid
	var out [transport.MADSize]byte
	t := time.NewTimer(o.ResponseTimeout)
	defer t.Stop()
	for try := 0; ; try++ {
		if err := m.send(peer, o.TrafficClass, tid, &req, &out); err != nil {
			return UDPeer{}, fmt.Errorf("rdmacm: ResolveUD: %w", err)
		}
		if try > 0 {
			m.st.retransmits.Add(1)
		}
		select {
		case r := <-w.ch:
			if r.err == nil {
				r.peer.Addr = peer
			}
			return r.peer, r.err
		case <-ctx.Done():
			return UDPeer{}, ctx.Err()
		case <-t.C:
			if try >= o.MaxRetries {
				return UDPeer{}, ErrTimeout
			}
			t.Reset(o.ResponseTimeout)
		}
	}
}

// UDListener answers SIDR requests for one port of the UDP port space with
// a UD QP's number and Q_Key (what rdma_listen on a UD rdma_cm ID does).
type UDListener struct {
	m    *Manager
	svc  uint64
	qpn  uint32
	qkey uint32
	data []byte
}

// ListenUD serves SIDR requests for port with the UD QP qp, whose Q_Key is
// qkey (UDPQKey for librdmacm peers); privateData (at most 136 bytes) goes
// with every reply.
func (m *Manager) ListenUD(port uint16, qp *transport.QP, qkey uint32, privateData []byte) (*UDListener, error) {
	dev := m.dev
	if len(privateData) > cm.SIDRREPPrivateDataSize {
		return nil, fmt.Errorf("rdmacm: ListenUD: %d bytes of private data, at most %d", len(privateData), cm.SIDRREPPrivateDataSize)
	}
	l := &UDListener{m: m, svc: cm.ServiceID(cm.PSUDP, port), qpn: qp.QPN(), qkey: qkey, data: privateData}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, m.closeErr
	}
	if _, busy := m.udl[l.svc]; busy {
		return nil, fmt.Errorf("rdmacm: ListenUD on port %d: %w: the port has a listener", port, ErrInUse)
	}
	if err := dev.ClaimService(l.svc); err != nil {
		return nil, fmt.Errorf("rdmacm: ListenUD on port %d: %w: %v", port, ErrInUse, err)
	}
	m.udl[l.svc] = l
	return l, nil
}

// Close stops answering.
func (l *UDListener) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.m.udl[l.svc] == l {
		delete(l.m.udl, l.svc)
		l.m.dev.ReleaseService(l.svc)
	}
	return nil
}
