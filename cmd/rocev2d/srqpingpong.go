package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// srq-pingpong is pingpong (pingpong.go: its flags with -q, runPPCmd,
// the result lines) on several RC QPs that share one SRQ: the endpoint
// (endpoint.go, srqWR) carries the SRQ and every QP, the exchange is
// oob.SRQPingpongClient/Server, and the loop is ibv_srq_pingpong's.

func init() {
	register("srq-pingpong", "RC ping-pong on several QPs sharing one SRQ, flag- and wire-compatible with ibv_srq_pingpong",
		srqPingpongUsage, runSRQPingpong)
}

const srqPingpongUsage = `usage: rocev2d srq-pingpong [options] [server]

A ping-pong on num-qp RC QPs that take their receives from one shared
receive queue, compatible with rdma-core's ibv_srq_pingpong: the same flags,
the same out-of-band exchange on TCP (default port 18515: 256
"LID:QPN:PSN:GID" messages each way, one per QP and zero entries after) and
the same output, so either side may be rocev2d or the real tool. Without a
server argument it waits for a client; with one it connects to it.

rx-depth receives are posted to the SRQ (and reposted when at most num-qp
are left); every QP's messages land in the one buffer. The client sends
first on every QP, then each QP alternates: send size bytes, receive size
bytes. The run ends when iters sends and iters receives have completed in
all (iters counts across the QPs, as in the tool, whose usage text says
"per QP").

options:
  -p, --port=PORT        out-of-band TCP port (default 18515)
  -d, --ib-dev=DEV       device name (accepted for compatibility; rocev2d has one device per address)
  -i, --ib-port=PORT     port of the device (accepted, must be 1)
  -s, --size=SIZE        message size in bytes (default 4096)
  -m, --mtu=MTU          path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)
  -q, --num-qp=NUM       QPs (default 16; 1..255, at most rx-depth; both sides
                         must use the same number)
  -r, --rx-depth=DEP     receives in the SRQ (default 500)
  -n, --iters=ITERS      iterations, summed over the QPs (default 1000)
  -l, --sl=SL            service level (accepted, not used by RoCEv2)
  -e, --events           sleep until packets arrive; without it rocev2d polls its
                         socket for up to 100 µs per wait (--busy-poll sets how
                         long), as ibv_srq_pingpong polls its CQ
  -g, --gid-idx=IDX      local GID index (accepted; the GID is the --bind
                         address). The real tool needs it on RoCE: without -g
                         it sends a zero GID, which rocev2d refuses
  -c, --chk              validate the received buffer: ibv_srq_pingpong's buffer
                         is all zeros and so is every message; rocev2d checks
                         every byte (the tool, as server, the first of each page)
  -o, --odp              accepted and ignored
      --bind=IP          local IP address for RoCEv2 (UDP 4791). Default: the address
                         of the out-of-band TCP connection's local end; a server
                         with --bind opens it before it waits for a client
      --timeout=DUR      give up when the whole run takes longer (default 0 = no limit)
  -v                     print the device counters (rxe's names) at the end; SIGUSR1
                         prints them while running
` + socketUsage + `
Output: one local address line per QP, after the exchange one remote address
line per QP, then
  N bytes in S seconds = M Mbit/sec     (N = 2 × size × iters)
  N iters in S seconds = U usec/iter
Exit status: 0 done; 1 failed, also for the tool's own refusals ("rx_depth R
is too small for Q QPs", "num_qp Q must be less than 256"); 2 bad usage.
`

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

func runSRQPingpong(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runPPCmd(ctx, args, ppSRQ, stdout, stderr)
}

// srqContext is one side of an SRQ ping-pong: an endpoint with the SRQ,
// num-qp QPs on one CQ, and the message buffer every QP sends from and
// every receive lands in.
type srqContext struct {
	*endpoint
	qps   []*transport.QP
	psns  []uint32
	index map[uint32]int // QPN → index in qps (the tool's find_qp)
	buf   []byte
	mr    *memreg.MR
	routs int // receives in the SRQ
}

// srqPingpong runs one SRQ ping-pong as server (c.server empty) or client.
func srqPingpong(ctx context.Context, c *pingpongConfig, stdout io.Writer, usr1 *usr1Watch) error {
	if err := checkSRQPingpong(c); err != nil {
		return err
	}
	var sc *srqContext
	var err error
	if ppEarlyInit(c) {
		if sc, err = srqInit(c.bind, c); err != nil {
			return err
		}
	}
	conn, local, end, err := ppSession(ctx, c)
	if err != nil {
		if sc != nil {
			sc.Close()
		}
		return err
	}
	defer end()
	if sc == nil {
		if sc, err = srqInit(local, c); err != nil {
			return err
		}
	}
	if c.verbose {
		// Printed after close: the counters then include everything the
		// device did, not a moment while it still answers the peer.
		defer printCounters(stdout, local.String(), sc.Dev)
	}
	defer sc.Close()
	usr1.Add(local.String(), sc.Dev)

	mine := make([]oob.PingpongDest, c.numQP)
	for i, qp := range sc.qps {
		mine[i] = oob.PingpongDest{QPN: qp.QPN(), PSN: sc.psns[i], GID: sc.Dev.GID()}
		fmt.Fprintf(stdout, "  local address:  %s\n", ppDestString(mine[i]))
	}
	var rem []oob.PingpongDest
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
		return ppCtxErr(ctx, fmt.Errorf("out-of-band exchange with %s: %w", conn.RemoteAddr(), err))
	}
	conn.Close()
	for _, d := range rem[:c.numQP] {
		fmt.Fprintf(stdout, "  remote address: %s\n", ppDestString(d))
	}
	if c.server != "" {
		if err := sc.connectAll(c, rem); err != nil {
			return err
		}
	}

	start := time.Now()
	if err := sc.loop(ctx, c); err != nil {
		return ppCtxErr(ctx, err)
	}
	printPingpongResult(stdout, c, time.Since(start))
	if c.chk {
		// ibv_srq_pingpong zeroes its buffer and the client's -c marks
		// (i / page_size % sizeof(char)) are 0 too, so every message of
		// either side is all zeros: so must the buffer be.
		for i, b := range sc.buf {
			if b != 0 {
				return fmt.Errorf("data validation failed at byte %d: got %#x, want 0", i, b)
			}
		}
	}
	return nil
}

// srqInit creates the endpoint with the SRQ (rx-depth WRs), one CQ of
// rx-depth + num-qp entries and num-qp RC QPs in INIT with one send WR
// each, registers the zeroed buffer and posts rx-depth receives to the
// SRQ (the tool's pp_init_ctx and pp_post_recv).
func srqInit(local netip.Addr, c *pingpongConfig) (*srqContext, error) {
	link, err := listenSocket(local, c.sock.Options(!c.events, defaultBusyPoll), "pick another address with --bind")
	if err != nil {
		return nil, err
	}
	cfg := endpointConfig{SendCQ: c.rxDepth + c.numQP, MaxSendWR: 1, SigAll: true, SRQWR: c.rxDepth, CC: c.sock.CC.Config()}
	e, err := newEndpoint(link, cfg)
	if err != nil {
		return nil, err
	}
	sc := &srqContext{endpoint: e, qps: []*transport.QP{e.QP}, psns: []uint32{e.PSN}, index: map[uint32]int{e.QP.QPN(): 0}}
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
	// mapMemory's pages are zero: the tool's memset(buf, 0, size).
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
	peer, err := peerFromGID(rem[0].GID, "-g")
	if err != nil {
		return err
	}
	for i, qp := range sc.qps {
		if err := sc.ConnectQP(qp, sc.psns[i], peer, rem[i].QPN, rem[i].PSN, c.mtu, 1, 14); err != nil {
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
			return fmt.Errorf("waiting for completions after %d sends and %d receives of %d: %w", scnt, rcnt, c.iters, err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return fmt.Errorf("failed status %s (%d) for wr_id %d on QP 0x%06x", wc.Status, uint8(wc.Status), wc.WRID, wc.QPN)
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
