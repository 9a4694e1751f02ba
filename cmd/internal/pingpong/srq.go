package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"

	"github.com/gorocev2/rocev2/cmd/internal/cli"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// The side of srq-pingpong: several RC QPs that share one SRQ (the
// endpoint, cli.EndpointConfig.SRQWR, carries the SRQ and every QP), the
// exchange oob.SRQPingpongClient/Server, and ibv_srq_pingpong's loop.

// checkSRQPingpong applies ibv_srq_pingpong's checks of -q, with its
// messages (it exits 1 on them).
func checkSRQPingpong(c *pingpongConfig) error {
	if c.numQP > c.rxDepth {
		return fmt.Errorf("rx_depth %d is too small for %d QPs -- must have at least one receive per QP.", c.rxDepth, c.numQP)
	}
	if c.numQP >= oob.SRQPingpongMaxQP {
		return fmt.Errorf("num_qp %d must be less than %d", c.numQP, oob.SRQPingpongMaxQP)
	}
	return nil
}

// srqContext is one side of an SRQ ping-pong: an endpoint (endpoint) with the SRQ,
// num-qp QPs on one CQ, and the message buffer every QP sends from and
// every receive lands in.
type srqContext struct {
	*cli.Endpoint
	qps   []*transport.QP
	psns  []uint32
	index map[uint32]int // QPN → index in qps (the tool's find_qp)
	buf   []byte
	mr    *memreg.MR
	routs int // receives in the SRQ
}

func (sc *srqContext) device() *transport.Device { return sc.Dev }

// exchange swaps the address lines of every QP with the peer
// (ibv_srq_pingpong's 256 messages each way) and connects the QPs, QP i to
// the peer's QP i: the server before it answers, the client once it has
// printed the server's lines.
func (sc *srqContext) exchange(ctx context.Context, c *pingpongConfig, conn net.Conn, stdout io.Writer) error {
	mine := make([]oob.PingpongDest, c.numQP)
	for i, qp := range sc.qps {
		mine[i] = oob.PingpongDest{QPN: qp.QPN(), PSN: sc.psns[i], GID: sc.Dev.GID()}
		fmt.Fprintf(stdout, "  local address:  %s\n", ppDestString(mine[i]))
	}
	var rem []oob.PingpongDest
	var err error
	if c.server != "" {
		rem, err = oob.SRQPingpongClient(ctx, conn, mine)
		if err == nil {
			err = srqCheckPeer(c, rem)
		}
	} else {
		rem, err = oob.SRQPingpongServer(ctx, conn, func(r []oob.PingpongDest) ([]oob.PingpongDest, error) {
			if err := srqCheckPeer(c, r); err != nil {
				return nil, err
			}
			return mine, sc.connectAll(c, r)
		})
	}
	if err != nil {
		if c.server != "" && errors.Is(err, oob.ErrPeerClosed) {
			// The server closes without replying when it refuses
			// what this side announced (srqCheckPeer, its -q).
			err = fmt.Errorf("%w (the server refuses a client whose -q differs from its own, this side has -q %d: its message says why)", err, c.numQP)
		}
		return oobErr(ctx, conn, err)
	}
	conn.Close()
	for _, d := range rem[:c.numQP] {
		fmt.Fprintf(stdout, "  remote address: %s\n", ppDestString(d))
	}
	if c.server != "" {
		return sc.connectAll(c, rem)
	}
	return nil
}

// check is -c: ibv_srq_pingpong zeroes its buffer and the client's -c
// marks (i / page_size % sizeof(char)) are 0 too, so every message of
// either side is all zeros: so must the buffer be.
func (sc *srqContext) check(c *pingpongConfig) error {
	for i, b := range sc.buf {
		if b != 0 {
			return fmt.Errorf("data validation failed at byte %d: got %#x, want 0", i, b)
		}
	}
	return nil
}

// srqInit creates the endpoint with the SRQ (rx-depth WRs), one CQ of
// rx-depth + num-qp entries and num-qp RC QPs in INIT with one send WR
// each, registers the zeroed buffer and posts rx-depth receives to the
// SRQ (the tool's pp_init_ctx and pp_post_recv).
func srqInit(local netip.Addr, c *pingpongConfig) (*srqContext, error) {
	link, err := cli.ListenSocket(local, c.sock.Options(!c.events, cli.DefaultBusyPoll), "pick another address with --bind")
	if err != nil {
		return nil, err
	}
	cfg := cli.EndpointConfig{SendCQ: c.rxDepth + c.numQP, MaxSendWR: 1, SigAll: true, SRQWR: c.rxDepth, CC: c.sock.CC.Config()}
	e, err := cli.NewEndpoint(link, cfg)
	if err != nil {
		return nil, err
	}
	sc := &srqContext{Endpoint: e, qps: []*transport.QP{e.QP}, psns: []uint32{e.PSN}, index: map[uint32]int{e.QP.QPN(): 0}}
	for i := 1; i < c.numQP; i++ {
		qp, err := e.NewQP(cfg)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("QP[%d]: %w", i, err)
		}
		sc.index[qp.QPN()] = len(sc.qps)
		sc.qps = append(sc.qps, qp)
		sc.psns = append(sc.psns, rand.Uint32()&0xffffff)
	}
	// cli.MapMemory's pages are zero: the tool's memset(buf, 0, size).
	if sc.buf, sc.mr, err = e.Alloc(c.size, memreg.AccessLocalWrite); err != nil {
		e.Close()
		return nil, err
	}
	if sc.routs = sc.postRecv(c.rxDepth); sc.routs < c.rxDepth {
		e.Close()
		return nil, fmt.Errorf("couldn't post receive (%d)", sc.routs)
	}
	return sc, nil
}

// srqCheckPeer checks that the peer announced as many QPs as this side has:
// the tool connects QP i to the peer's entry i whatever it holds, so a
// different -q would leave QPs talking to QP 0.
func srqCheckPeer(c *pingpongConfig, rem []oob.PingpongDest) error {
	if n := oob.SRQPingpongUsed(rem); n != c.numQP {
		return fmt.Errorf("the peer announced %d QPs, this side has %d: -q must be the same on both sides", n, c.numQP)
	}
	return nil
}

// connectAll takes every QP to RTS towards the peer's QP of the same
// index, with ibv_srq_pingpong's attributes (its pp_connect_ctx: one
// READ/atomic outstanding, timeout 14, retries 7; every QP towards the
// GID of the peer's first entry).
func (sc *srqContext) connectAll(c *pingpongConfig, rem []oob.PingpongDest) error {
	peer, err := cli.PeerFromGID(rem[0].GID, "-g")
	if err != nil {
		return err
	}
	for i, qp := range sc.qps {
		if err := sc.ConnectQP(qp, sc.psns[i], peer, rem[i].QPN, rem[i].PSN, c.mtu, 1, uint8(c.qpTimeout)); err != nil {
			return fmt.Errorf("failed to modify QP[%d] to RTR/RTS: %w", i, err)
		}
	}
	return nil
}

// postRecv posts up to n receives of the whole buffer to the SRQ and
// returns how many were posted.
func (sc *srqContext) postRecv(n int) int {
	wr := transport.RecvWR{WRID: ppRecvWRID, SGEs: []memreg.SGE{sc.mr.SGE(0, uint32(len(sc.buf)))}}
	for i := 0; i < n; i++ {
		if sc.SRQ.PostRecv(wr) != nil {
			return i
		}
	}
	return n
}

// postSend posts one signalled SEND of the buffer on QP i.
func (sc *srqContext) postSend(i int) error {
	return sc.qps[i].PostSend(transport.SendWR{WRID: ppSendWRID, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{sc.mr.SGE(0, uint32(len(sc.buf)))}})
}

// loop is ibv_srq_pingpong's main loop: the client sends first on every
// QP; a QP posts its next send once both its previous send and the peer's
// message on it have completed, until iters sends have completed in all;
// the SRQ is refilled to rx-depth when at most num-qp receives are left.
func (sc *srqContext) loop(ctx context.Context, c *pingpongConfig) error {
	pending := make([]int, len(sc.qps))
	for i := range pending {
		pending[i] = ppRecvWRID
		if c.server != "" {
			// (-c: the client would set each page's first byte to
			// i / page_size % sizeof(char) = 0; the buffer is zero.)
			if err := sc.postSend(i); err != nil {
				return fmt.Errorf("couldn't post send: %w", err)
			}
			pending[i] |= ppSendWRID
		}
	}
	wcs := make([]transport.WC, c.rxDepth+c.numQP)
	rcnt, scnt := 0, 0
	for rcnt < c.iters || scnt < c.iters {
		n, err := sc.SCQ.Wait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("waiting for completions after %d sends and %d receives of %d: %w", scnt, rcnt, c.iters, ppWaitErr(ctx, err))
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return wcError(c, wc, sc.Dev, true)
			}
			qi, ok := sc.index[wc.QPN]
			if !ok {
				return fmt.Errorf("couldn't find QPN %06x", wc.QPN)
			}
			switch wc.WRID {
			case ppSendWRID:
				scnt++
			case ppRecvWRID:
				sc.routs--
				if sc.routs <= c.numQP {
					sc.routs += sc.postRecv(c.rxDepth - sc.routs)
					if sc.routs < c.rxDepth {
						return fmt.Errorf("couldn't post receive (%d)", sc.routs)
					}
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", wc.WRID)
			}
			pending[qi] &^= int(wc.WRID)
			if scnt < c.iters && pending[qi] == 0 {
				if err := sc.postSend(qi); err != nil {
					return fmt.Errorf("couldn't post send on QP[%d]: %w", qi, err)
				}
				pending[qi] = ppRecvWRID | ppSendWRID
			}
		}
	}
	return nil
}
