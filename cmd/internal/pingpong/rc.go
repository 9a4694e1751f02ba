package pingpong

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// The side of pingpong, uc-pingpong and ud-pingpong: one QP (RC, UC or UD)
// on one CQ, ibv_{rc,uc,ud}_pingpong's exchange and loop.

// ppContext is one side of a ping-pong: an endpoint (endpoint) with one CQ and the
// message buffer.
type ppContext struct {
	*cli.Endpoint
	// buf is what receives land in: for UD the GRH space (grh bytes,
	// transport.GRHSize) and then the message; sends take buf[grh:].
	buf   []byte
	grh   int
	mr    *memreg.MR
	routs int // receives posted
	// UD: the peer's address handle and QP number.
	ah        *transport.AH
	remoteQPN uint32
}

const ppPageSize = 4096

// out-of-band connection: a server with --bind does, as the tools create
// their context before they wait for a client, so that UDP 4791 taken on
// the address, or an address this host does not have, fails at once and a
// client on the same address finds the port taken rather than taking it.
// Without --bind the address is the connection's local end.
func ppEarlyInit(c *pingpongConfig) bool { return c.server == "" && c.bind.IsValid() }

// ppInit creates the endpoint on local with one CQ, registers the buffer
// and posts rx-depth receives (pp_init_ctx + pp_post_recv).
func ppInit(local netip.Addr, c *pingpongConfig) (*ppContext, error) {
	link, err := cli.ListenSocket(local, c.sock.Options(!c.events, cli.DefaultBusyPoll), "pick another address with --bind")
	if err != nil {
		return nil, err
	}
	cfg := cli.EndpointConfig{SendCQ: c.rxDepth + 1, MaxSendWR: 1, MaxRecvWR: c.rxDepth, SigAll: true, CC: c.sock.CC.Config()}
	pc := &ppContext{}
	switch c.kind {
	case ppUD:
		cfg.UD, cfg.QKey, cfg.PortMTU = true, udQKey, c.mtu
		pc.grh = transport.GRHSize
	case ppUC:
		cfg.UC = true
	}
	e, err := cli.NewEndpoint(link, cfg)
	if err != nil {
		return nil, err
	}
	pc.Endpoint = e
	if pc.buf, pc.mr, err = e.Alloc(pc.grh+c.size, memreg.AccessLocalWrite); err != nil {
		e.Close()
		return nil, err
	}
	for i := range pc.buf {
		pc.buf[i] = 0x7b // as ibv_rc_pingpong
	}
	if pc.routs = pc.postRecv(c.rxDepth); pc.routs < c.rxDepth {
		e.Close()
		return nil, fmt.Errorf("couldn't post receive (%d)", pc.routs)
	}
	return pc, nil
}

// postRecv posts up to n receives of the whole buffer and returns how many
// were posted.
func (pc *ppContext) postRecv(n int) int {
	wr := transport.RecvWR{WRID: ppRecvWRID, SGEs: []memreg.SGE{{Addr: pc.mr.IOVA(), Length: uint32(len(pc.buf)), LKey: pc.mr.LKey()}}}
	for i := 0; i < n; i++ {
		if pc.QP.PostRecv(wr) != nil {
			return i
		}
	}
	return n
}

// postSend posts one signalled SEND of the message (the buffer after the
// GRH space); on UD to the peer's AH, QP and the Q_Key udQKey.
func (pc *ppContext) postSend() error {
	return pc.QP.PostSend(transport.SendWR{WRID: ppSendWRID, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{{Addr: pc.mr.IOVA() + uint64(pc.grh), Length: uint32(len(pc.buf) - pc.grh), LKey: pc.mr.LKey()}},
		AH:   pc.ah, RemoteQPN: pc.remoteQPN, RemoteQKey: udQKey})
}

// connectTo takes the QP to RTS towards rem with ibv_rc_pingpong's
// attributes (pp_connect_ctx: one READ/atomic outstanding, timeout 14,
// which --qp-timeout changes);
// a UC QP takes the same path, and Connect sets only what
// ibv_uc_pingpong's pp_connect_ctx does (path, MTU, peer QPN, PSNs); a
// UD QP goes to RTS and gets an address handle for rem, as
// ibv_ud_pingpong's pp_connect_ctx.
func (pc *ppContext) connectTo(c *pingpongConfig, rem oob.PingpongDest) error {
	peer, err := cli.PeerFromGID(rem.GID, "-g")
	if err != nil {
		return err
	}
	if c.kind != ppUD {
		return pc.Connect(peer, rem.QPN, rem.PSN, c.mtu, 1, uint8(c.qpTimeout))
	}
	if err := pc.QP.ReadyUD(udQKey, pc.PSN); err != nil {
		return err
	}
	if pc.ah, err = pc.Dev.CreateAH(transport.AHAttr{Addr: peer}); err != nil {
		return fmt.Errorf("failed to create AH: %w", err)
	}
	pc.remoteQPN = rem.QPN
	return nil
}

// loop is ibv_rc_pingpong's main loop: the client sends first; a side posts
// its next send once both its previous send and the peer's message have
// completed; receives are reposted when at most one is left.
func (pc *ppContext) loop(ctx context.Context, c *pingpongConfig) error {
	pending := ppRecvWRID
	if c.server != "" {
		if c.chk {
			for i := 0; i < c.size; i += ppPageSize {
				pc.buf[pc.grh+i] = 0
			}
		}
		if err := pc.postSend(); err != nil {
			return fmt.Errorf("couldn't post send: %w", err)
		}
		pending |= ppSendWRID
	}
	var wcs [2]transport.WC
	rcnt, scnt := 0, 0
	for rcnt < c.iters || scnt < c.iters {
		n, err := pc.SCQ.Wait(ctx, wcs[:])
		if err != nil {
			return fmt.Errorf("waiting for completions after %d sends and %d receives of %d: %w", scnt, rcnt, c.iters, ppWaitErr(ctx, err))
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return wcError(c, wc, pc.Dev, false)
			}
			switch wc.WRID {
			case ppSendWRID:
				scnt++
			case ppRecvWRID:
				pc.routs--
				if pc.routs <= 1 {
					pc.routs += pc.postRecv(c.rxDepth - pc.routs)
					if pc.routs < c.rxDepth {
						return fmt.Errorf("couldn't post receive (%d)", pc.routs)
					}
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", wc.WRID)
			}
			pending &^= int(wc.WRID)
			if scnt < c.iters && pending == 0 {
				if err := pc.postSend(); err != nil {
					return fmt.Errorf("couldn't post send: %w", err)
				}
				pending = ppRecvWRID | ppSendWRID
			}
		}
	}
	return nil
}

func (pc *ppContext) device() *transport.Device { return pc.Dev }

// exchange swaps the address lines with the peer (ibv_*_pingpong's
// "LID:QPN:PSN:GID" message) and connects the QP: the client once it has
// the server's line, the server before it answers.
func (pc *ppContext) exchange(ctx context.Context, c *pingpongConfig, conn net.Conn, stdout io.Writer) error {
	me := oob.PingpongDest{QPN: pc.QP.QPN(), PSN: pc.PSN, GID: pc.Dev.GID()}
	line := ppDestString(me)
	if c.kind == ppUD {
		// ibv_ud_pingpong's local line has "PSN 0x...: GID".
		line = strings.Replace(line, ", GID ", ": GID ", 1)
	}
	fmt.Fprintf(stdout, "  local address:  %s\n", line)
	var rem oob.PingpongDest
	var err error
	if c.server != "" {
		rem, err = oob.PingpongClient(ctx, conn, me)
		if err == nil {
			err = pc.connectTo(c, rem)
		}
	} else {
		rem, err = oob.PingpongServer(ctx, conn, func(r oob.PingpongDest) (oob.PingpongDest, error) {
			return me, pc.connectTo(c, r)
		})
	}
	if err != nil {
		return oobErr(ctx, conn, err)
	}
	conn.Close()
	fmt.Fprintf(stdout, "  remote address: %s\n", ppDestString(rem))
	return nil
}

// check is -c: ibv_rc_pingpong's client marks every page's first byte with
// i/page_size % sizeof(char), i.e. 0, and the message bounces back and
// forth, so both buffers must hold 0 there at the end; on UD the GRH of
// the last datagram must name the peer.
func (pc *ppContext) check(c *pingpongConfig) error {
	msg := pc.buf[pc.grh:]
	for i := 0; i < c.size; i += ppPageSize {
		if msg[i] != 0 {
			return fmt.Errorf("data validation failed at byte %d: got %#x, want 0", i, msg[i])
		}
	}
	if c.kind == ppUD {
		// The GRH of the last datagram names the peer.
		a, err := transport.AHFromGRH(pc.buf[:pc.grh])
		if err != nil || a.Addr != pc.ah.Addr() {
			return fmt.Errorf("data validation failed: the GRH of the last datagram (% x) does not name the peer %v (%v)",
				pc.buf[:pc.grh], pc.ah.Addr(), err)
		}
	}
	return nil
}
