package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

// perftest -R (rdma_cm QPs), as perftest 4.5-0.17 does it
// (src/perftest_communication.c):
//
//  1. The exchange itself runs over an RC connection made through rdma_cm on
//     the port of -p (default 18515, TCP port space): the client dials
//     (rdma_client_connect; no private data, responder resources and
//     initiator depth 0, retry 7, RNR retry 7), the server listens, accepts
//     the first request and stops listening (rdma_server_connect). Each
//     side posts one 56-byte receive before the request or reply goes out
//     and re-posts it after every message it reads; every message of the
//     TCP exchange becomes one SEND of the same bytes, but the QP data is
//     the binary struct pingpong_dest (oob.PerfDestCMSize) and there is no
//     "done".
//  2. After versions, cycle buffer, cache line and MTU: an empty (zeroed)
//     QP data message each way, the test QP's own rdma_cm connection on the
//     same port (the server listens again, accepts one request per QP and
//     stops; the client retries a refused request, 10 × 100 ms; responder
//     resources and initiator depth = out_reads for READ/atomic tests, 0
//     otherwise), another empty message each way.
//  3. The rest as over TCP: QP data (whose rkey and address the RDMA tests
//     use; ctx_connect is skipped), syncs, traffic, reports.
//  4. At the end each side disconnects the test QP (DREQ) and exits; the
//     kernel disconnects the exchange's connection when the process closes
//     its rdma_cm file.
//
// rocev2d keeps its server's listener for both connections (a request
// between them would otherwise be refused, which a perftest client does
// not retry), and, as server, also listens on TCP on the port for as long
// as it waits for the first connection, to refuse a client that runs
// without -R with a message instead of a silent timeout.

// perfCMTimeout is the CM response timeout of rocev2d's requests and
// replies (the REQ's, REP's and DREQ's retransmission interval).
const perfCMTimeout = 500 * time.Millisecond

// perfCM is the rdma_cm side of a -R run: the connection that carries the
// exchange and the test QP's.
type perfCM struct {
	c     *perfConfig
	s     *perfSide
	ln    *rdmacm.Listener // server: the port, for both connections
	peer  netip.AddrPort   // client: the server's rdma_cm address
	comm  *rdmacm.Conn     // the exchange's connection
	tests []*rdmacm.Conn   // the test QPs' connections (-q: one per QP, in QP order)
	msgs  *cmMsgConn
	once  sync.Once
}

// cmLocalAddr is the address to run RoCEv2 on with -R: --bind, else (client)
// the source address the kernel would use towards the server. A server
// needs --bind: the rdma_cm listener and the RoCEv2 socket live on one
// address.
func cmLocalAddr(c *perfConfig) (netip.Addr, error) {
	if c.bind.IsValid() {
		return c.bind, nil
	}
	if c.server == "" {
		return netip.Addr{}, errors.New("-R as a server needs --bind IP: the local address to accept rdma_cm connections and run RoCEv2 on")
	}
	peer, err := resolveServer(c.server)
	if err != nil {
		return netip.Addr{}, err
	}
	// A connected UDP socket sends nothing; it only asks for the route.
	conn, err := net.Dial("udp", netip.AddrPortFrom(peer, 4791).String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %s: %w (use --bind)", peer, err)
	}
	defer conn.Close()
	ap, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, err
	}
	return ap.Addr().Unmap(), nil
}

// resolveServer returns the server's address (an IP or a host name).
func resolveServer(server string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(server); err == nil {
		return a.Unmap(), nil
	}
	ips, err := net.LookupIP(server)
	if err != nil || len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("couldn't resolve server %q: %v", server, err)
	}
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip); ok && a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	a, _ := netip.AddrFromSlice(ips[0])
	return a.Unmap(), nil
}

// commOptions are the options of the exchange's connection: its own CQs
// (so that its completions never mix with the test's) and the one receive
// posted before the request or reply, as perftest's post_one_recv_wqe.
func (p *perfCM) commOptions() (*rdmacm.Options, error) {
	e := p.s.Endpoint
	scq, err := e.Dev.CreateCQ(4)
	if err != nil {
		return nil, fmt.Errorf("couldn't create CQ: %w", err)
	}
	rcq, err := e.Dev.CreateCQ(4)
	if err != nil {
		return nil, fmt.Errorf("couldn't create CQ: %w", err)
	}
	buf, mr, err := e.Alloc(2*cmMsgMax, memreg.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	p.msgs = &cmMsgConn{scq: scq, rcq: rcq, mr: mr, buf: buf, wake: make(chan struct{})}
	return &rdmacm.Options{PD: e.PD, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 2, MaxRecvWR: 2,
		Retry:           &transport.Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12},
		ResponseTimeout: perfCMTimeout,
		Prepare: func(qp *transport.QP) error {
			p.msgs.qp = qp
			return p.msgs.postRecv()
		}}, nil
}

// connectComm makes the exchange's connection: the server listens on the
// port and accepts the first request, the client dials until the server
// answers (--connect-timeout). It returns the connection as a net.Conn
// for the exchange.
func (p *perfCM) connectComm(ctx context.Context, stdout io.Writer) (net.Conn, error) {
	opts, err := p.commOptions()
	if err != nil {
		return nil, err
	}
	c := p.c
	if c.server == "" {
		// perftest -R -q connects every QP at once: room for all requests.
		p.ln, err = rdmacm.Listen(p.s.Dev, uint16(c.port), &rdmacm.ListenOptions{Backlog: max(4, c.qps+1)})
		if err != nil {
			return nil, fmt.Errorf("rdma_cm port %d: %w", c.port, err)
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := refuseTCPClients(c.port, cancel)
		defer stop()
		if c.output == "" {
			printWaiting(stdout)
		}
		r, err := p.ln.Next(ctx)
		if err == nil {
			p.comm, err = r.Accept(ctx, opts)
		}
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("waiting for an rdma_cm client on port %d: %w", c.port, cause)
			}
			return nil, fmt.Errorf("waiting for an rdma_cm client on port %d: %w", c.port, err)
		}
	} else {
		peer, err := resolveServer(c.server)
		if err != nil {
			return nil, err
		}
		p.peer = netip.AddrPortFrom(peer, uint16(c.port))
		if p.comm, err = p.dial(ctx, opts, c.connTimeout, true); err != nil {
			return nil, err
		}
	}
	p.msgs.conn = p.comm
	return p.msgs, nil
}

// dial connects to the server's rdma_cm port, trying again while the
// server refuses (nothing listens yet: REJ "invalid service ID") or does
// not answer, for up to patience. probeTCP: meanwhile look every half
// second whether the server listens on TCP instead (it runs without -R).
func (p *perfCM) dial(ctx context.Context, opts *rdmacm.Options, patience time.Duration, probeTCP bool) (*rdmacm.Conn, error) {
	dctx, cancel := context.WithTimeoutCause(ctx, patience, context.DeadlineExceeded)
	defer cancel()
	if probeTCP {
		pctx, stop := context.WithCancelCause(dctx)
		defer stop(nil)
		go func() {
			for pctx.Err() == nil {
				if tcpListens(pctx, p.peer) {
					stop(fmt.Errorf("%w: %s listens on TCP port %d, not through rdma_cm: the server runs without -R; run both sides with -R or neither",
						oob.ErrModeMismatch, p.peer.Addr(), p.peer.Port()))
					return
				}
				select {
				case <-pctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
		}()
		dctx = pctx
	}
	var lastErr error
	for delay := 100 * time.Millisecond; ; {
		if qp := opts.QP; qp != nil && qp.State() != transport.QPSReset && qp.State() != transport.QPSInit {
			// A refused attempt left the caller's QP in ERR.
			if err := qp.Modify(&transport.QPAttr{State: transport.QPSReset}, transport.AttrState); err != nil {
				return nil, fmt.Errorf("resetting the QP for another rdma_cm attempt: %w", err)
			}
		}
		o := *opts
		conn, err := rdmacm.Dial(dctx, p.s.Dev, p.peer, &o)
		if err == nil {
			return conn, nil
		}
		lastErr = err
		if cause := context.Cause(dctx); errors.Is(cause, oob.ErrModeMismatch) {
			return nil, cause
		}
		// Refused (no listener yet), no answer, or nothing on UDP 4791
		// yet (ICMP port unreachable): the server may still be starting.
		if !errors.Is(err, rdmacm.ErrRefused) && !errors.Is(err, rdmacm.ErrTimeout) && !errors.Is(err, rdmacm.ErrUnreachable) {
			break
		}
		select {
		case <-dctx.Done():
		case <-time.After(delay):
		}
		if dctx.Err() != nil {
			break
		}
	}
	if cause := context.Cause(dctx); errors.Is(cause, oob.ErrModeMismatch) {
		return nil, cause
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("rdma_cm connection to %v: %v (%v)", p.peer, lastErr, context.Cause(ctx))
	}
	if errors.Is(lastErr, rdmacm.ErrRefused) || errors.Is(lastErr, rdmacm.ErrTimeout) || errors.Is(lastErr, rdmacm.ErrUnreachable) ||
		errors.Is(lastErr, context.DeadlineExceeded) {
		return nil, fmt.Errorf("couldn't connect through rdma_cm to %v within %v (is `%s -R` running there as a server?): %v",
			p.peer, patience, p.c.test, lastErr)
	}
	return nil, fmt.Errorf("rdma_cm connection to %v: %w", p.peer, lastErr)
}

// tcpListens reports whether a server without -R listens on TCP at ap:
// something accepts there and does not answer at once with
// oob.RDMACMVersion, as a rocev2d server with -R does (a perftest server
// waits for the client's version).
func tcpListens(ctx context.Context, ap netip.AddrPort) bool {
	d := net.Dialer{Timeout: 500 * time.Millisecond}
	conn, err := d.DialContext(ctx, "tcp", ap.String())
	if err != nil {
		return false
	}
	defer conn.Close()
	// A -R server answers at once, but on a loaded machine "at once" took
	// over 300 ms (CI: TestIPv6LinkLocal/write-bw_-R took a busy -R
	// server for one without -R); a server without -R says nothing until
	// the client speaks, so the wait only delays naming a real mismatch.
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	var b [oob.VersionSize]byte
	if _, err := io.ReadFull(conn, b[:]); err == nil {
		if v, _, _ := oob.ParseVersion(b[:]); v == oob.RDMACMVersion {
			return false
		}
	}
	return true
}

// refuseTCPClients listens on TCP port (where a perftest server without
// -R would) while a -R server waits for its first rdma_cm connection, and
// answers every connection with oob.RDMACMVersion: a client that then
// sends its version runs without -R, and fail ends the wait with the
// reason; one that hangs up without a word was a rocev2d -R client
// looking for a server without -R. If the port cannot be had, nothing is
// refused. stop closes the listener.
func refuseTCPClients(port int, fail context.CancelCauseFunc) (stop func()) {
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		return func() {}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				var v [oob.VersionSize]byte
				oob.EncodeVersion(v[:], oob.RDMACMVersion)
				conn.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := conn.Write(v[:]); err != nil {
					return
				}
				if n, _ := conn.Read(v[:]); n > 0 {
					fail(fmt.Errorf("%w: a client (%v) connected over TCP: it runs without -R (perftest's TCP exchange); run both sides with -R or neither",
						oob.ErrModeMismatch, conn.RemoteAddr()))
				}
			}()
		}
	}()
	return func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// connect connects the test QPs through rdma_cm (the plan's CMConnect
// step), one connection per QP as perftest -R -q does, and returns this
// side's QP data for each with the QPN and send PSN the CM gave it. The
// server accepts the client's requests in the order they come, for its QPs
// in order; the client dials for its QPs in order.
func (p *perfCM) connect(ctx context.Context, neg oob.Params) ([]oob.PerfDest, error) {
	s := p.s
	mtu, ok := transport.MTUFromBytes(neg.MTU.Bytes())
	if !ok {
		return nil, fmt.Errorf("negotiated MTU %d is invalid", neg.MTU)
	}
	rd := uint8(min(max(s.local.OutReads, 1), 16))
	nq := len(s.qps)
	optsFor := func(i int) *rdmacm.Options {
		return &rdmacm.Options{QP: s.qps[i].qp, Access: s.Access, PathMTU: mtu, ResponderResources: rd, InitiatorDepth: rd,
			Retry:           &transport.Retry{Timeout: uint8(p.c.qpTimeout), RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12},
			ResponseTimeout: perfCMTimeout, SelectiveRepeat: p.c.sr}
	}
	what := func(i int) string {
		if nq == 1 {
			return "the test QP's"
		}
		return fmt.Sprintf("QP %d's (of %d)", i+1, nq)
	}
	if p.ln != nil {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for len(p.tests) < nq {
			i := len(p.tests)
			r, err := p.ln.Next(actx)
			if err != nil {
				err = fmt.Errorf("waiting for the client's rdma_cm connection of %s: %w", strings.TrimSuffix(what(i), "'s"), err)
				if i > 0 {
					err = fmt.Errorf("%w (it connected %d: does it run fewer QPs? this side runs -q %d, both sides need the same -q)", err, i, nq)
				}
				return nil, err
			}
			if from := r.RemoteAddr().Addr(); from != p.comm.RemoteAddr().Addr() {
				r.Reject(nil) // not our client
				continue
			}
			conn, err := r.Accept(actx, optsFor(i))
			if err != nil {
				return nil, fmt.Errorf("accepting %s rdma_cm connection: %w", what(i), err)
			}
			p.tests = append(p.tests, conn)
		}
		// perftest's server stops listening once its QPs are connected.
		p.ln.Close()
	} else {
		for i := range nq {
			conn, err := p.dial(ctx, optsFor(i), max(p.c.connTimeout, 2*time.Second), false)
			if err != nil {
				if i > 0 {
					return nil, fmt.Errorf("QP %d of %d: %w (the server accepted %d: does it run fewer QPs? this side runs -q %d, both sides need the same -q)", i+1, nq, err, i, nq)
				}
				return nil, fmt.Errorf("test QP: %w", err)
			}
			p.tests = append(p.tests, conn)
		}
	}
	locals := make([]oob.PerfDest, nq)
	for i, q := range s.qps {
		a, err := q.qp.Query()
		if err != nil {
			return nil, err
		}
		q.local.QPN, q.local.PSN = q.qp.QPN(), a.SQPSN
		locals[i] = q.local
	}
	s.local.QPN, s.local.PSN = locals[0].QPN, locals[0].PSN
	if perfTweakLocal != nil {
		perfTweakLocal(&s.local)
	}
	locals[0] = s.local
	return locals, nil
}

// checkRemote compares the peer's QP data with the rdma_cm connections:
// the QPNs it announces must be those the CM connected these QPs to (in
// any order: a perftest client connects its QPs at once, and the server
// takes them as they come; each QP still sends to the address the peer
// announced for its index, as perftest).
func (p *perfCM) checkRemote(remotes []oob.PerfDest) error {
	connected := map[uint32]bool{}
	for _, q := range p.s.qps {
		a, err := q.qp.Query()
		if err != nil {
			return err
		}
		connected[a.DestQPN] = true
	}
	for _, r := range remotes {
		if !connected[r.QPN] {
			if len(remotes) == 1 {
				a, _ := p.s.QP.Query()
				return fmt.Errorf("%w: the peer's QP data names QPN %#x, but its rdma_cm connection connected QPN %#x: the peer's QP is not the one it connected through rdma_cm",
					oob.ErrModeMismatch, r.QPN, a.DestQPN)
			}
			return fmt.Errorf("%w: the peer's QP data names QPN %#x, which none of the %d rdma_cm connections connected: the peer's QPs are not those it connected through rdma_cm",
				oob.ErrModeMismatch, r.QPN, len(remotes))
		}
		delete(connected, r.QPN)
	}
	return nil
}

// close disconnects both connections (DREQ, bounded wait for the DREP) and
// stops listening.
func (p *perfCM) close() { p.once.Do(p.closeOnce) }

func (p *perfCM) closeOnce() {
	if p.msgs != nil {
		p.msgs.Close()
	}
	var wg sync.WaitGroup
	for _, c := range append(slices.Clone(p.tests), p.comm) {
		if c != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Close()
			}()
		}
	}
	wg.Wait()
	if p.ln != nil {
		p.ln.Close()
	}
}

// cmMsgMax bounds one message of the exchange over rdma_cm (the largest is
// the 56-byte QP data; perftest receives into 56 bytes).
const cmMsgMax = 256

// cmMsgConn carries perftest's exchange over the rdma_cm connection's QP
// as a net.Conn: each Write is one signalled SEND, each Read one received
// message (which must have the length the reader asks for: the two sides'
// exchanges would differ otherwise). One receive is posted at a time and
// re-posted as soon as its message is read, as perftest does; the
// lock-step exchange never has two messages in flight one way.
type cmMsgConn struct {
	conn     *rdmacm.Conn
	qp       *transport.QP
	scq, rcq *transport.CQ
	mr       *memreg.MR
	buf      []byte // [0, cmMsgMax) receive, [cmMsgMax, 2*cmMsgMax) send

	mu       sync.Mutex
	deadline time.Time
	wake     chan struct{} // closed (and replaced) when the deadline changes
	closed   bool
}

func (m *cmMsgConn) postRecv() error {
	return m.qp.PostRecv(transport.RecvWR{WRID: 5, SGEs: []memreg.SGE{m.mr.SGE(0, cmMsgMax)}})
}

// wait waits for one completion on cq until the deadline.
func (m *cmMsgConn) wait(cq *transport.CQ) (transport.WC, error) {
	var wc [1]transport.WC
	for {
		m.mu.Lock()
		dl, wake, closed := m.deadline, m.wake, m.closed
		m.mu.Unlock()
		if closed {
			return wc[0], net.ErrClosed
		}
		if !dl.IsZero() && !time.Now().Before(dl) {
			return wc[0], os.ErrDeadlineExceeded
		}
		ctx, cancel := context.WithCancel(context.Background())
		if !dl.IsZero() {
			ctx, cancel = context.WithDeadline(context.Background(), dl)
		}
		go func() {
			select {
			case <-wake:
				cancel()
			case <-ctx.Done():
			}
		}()
		n, err := cq.Wait(ctx, wc[:])
		cancel()
		if err == nil && n == 1 && wc[0].QPN != m.qp.QPN() {
			// The flushed receive of an earlier attempt's QP (Dial
			// tries again when the server is not up yet, and every
			// attempt's QP uses these CQs): not this connection's.
			continue
		}
		if err == nil && n == 1 {
			return wc[0], nil
		}
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return wc[0], err
		}
		// The deadline passed or changed: look again.
	}
}

// Read returns the next message; b must be its exact length.
func (m *cmMsgConn) Read(b []byte) (int, error) {
	wc, err := m.wait(m.rcq)
	if err != nil {
		return 0, err
	}
	if wc.Status != transport.WCSuccess {
		if wc.Status == transport.WCWRFlushErr {
			return 0, io.EOF // the connection ended
		}
		return 0, cli.WCError(wc, "receive")
	}
	n := int(wc.ByteLen)
	if n != len(b) {
		// Re-post anyway: the error ends the run.
		m.postRecv()
		return 0, fmt.Errorf("%w: the peer sent a %d-byte message where perftest -R's exchange has a %d-byte one (the two sides run different exchanges)",
			oob.ErrModeMismatch, n, len(b))
	}
	copy(b, m.buf[:n])
	if err := m.postRecv(); err != nil {
		return 0, fmt.Errorf("couldn't post receive: %w", err)
	}
	return n, nil
}

// Write sends b as one message and waits for its completion.
func (m *cmMsgConn) Write(b []byte) (int, error) {
	if len(b) > cmMsgMax {
		return 0, fmt.Errorf("message of %d bytes, at most %d", len(b), cmMsgMax)
	}
	copy(m.buf[cmMsgMax:], b)
	wr := transport.SendWR{WRID: 5, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{m.mr.SGE(cmMsgMax, uint32(len(b)))}}
	if err := m.qp.PostSend(wr); err != nil {
		return 0, err
	}
	wc, err := m.wait(m.scq)
	if err != nil {
		return 0, err
	}
	if wc.Status != transport.WCSuccess {
		if wc.Status == transport.WCWRFlushErr {
			return 0, io.ErrClosedPipe
		}
		return 0, cli.WCError(wc, "send")
	}
	return len(b), nil
}

// Close marks the conn closed (the rdma_cm connection is closed by perfCM).
func (m *cmMsgConn) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.wake)
		m.wake = make(chan struct{})
	}
	return nil
}

// cmAddr is an rdma_cm endpoint as a net.Addr.
type cmAddr netip.AddrPort

func (a cmAddr) Network() string { return "rdma_cm" }
func (a cmAddr) String() string  { return netip.AddrPort(a).String() + " (rdma_cm)" }

func (m *cmMsgConn) LocalAddr() net.Addr  { return cmAddr(m.conn.LocalAddr()) }
func (m *cmMsgConn) RemoteAddr() net.Addr { return cmAddr(m.conn.RemoteAddr()) }

func (m *cmMsgConn) SetDeadline(t time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deadline = t
	close(m.wake)
	m.wake = make(chan struct{})
	return nil
}

func (m *cmMsgConn) SetReadDeadline(t time.Time) error  { return m.SetDeadline(t) }
func (m *cmMsgConn) SetWriteDeadline(t time.Time) error { return m.SetDeadline(t) }
