package pingpong

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// The help texts of the four commands. Their options are the tools'
// (getopt_long's short and long names) and mostly the same; the shared
// lines are written once below.

// Option lines every ping-pong has.
const (
	optPort = `  -p, --port=PORT        out-of-band TCP port (default 18515)
  -d, --ib-dev=DEV       device name (accepted for compatibility; rocev2d has one device per address)
  -i, --ib-port=PORT     port of the device (accepted, must be 1)
`
	optSizeMTU = `  -s, --size=SIZE        message size in bytes (default 4096)
  -m, --mtu=MTU          path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)
`
	optRxIters = `  -r, --rx-depth=DEP     receives to post (default 500)
  -n, --iters=ITERS      iterations (default 1000)
`
	optSL     = "  -l, --sl=SL            service level (accepted, not used by RoCEv2)\n"
	optGIDIdx = `  -g, --gid-idx=IDX      local GID index (accepted; the GID is the --bind
                         address). The real tool needs it on RoCE: without -g
                         it sends a zero GID, which rocev2d refuses
`
	optODP  = "  -o, --odp              accepted and ignored\n"
	optTail = `      --timeout=DUR      give up when the whole run takes longer (default 0 = no limit)
      --idle-timeout=DUR give up when nothing has arrived from the peer for DUR
                         during the run (default 10s, longer with a large
                         --qp-timeout; 0 waits for ever, as the tool): a peer
                         with a smaller -n, another -s or ping-pong, or that
                         died, otherwise leaves this side waiting
      --qp-timeout=T     RC/UC QP local ACK timeout, 4.096 µs × 2^T (default 14, the
                         tool's; 7 retries): raise it for a peer that may stall
  -v                     print the device counters (rxe's names) at the end; SIGUSR1
                         prints them while running
` + cli.SocketUsage
	outputLines = `  N bytes in S seconds = M Mbit/sec
  N iters in S seconds = U usec/iter
`
	outputAddrLines = "Output: the local and remote address lines, then\n" + outputLines
)

// optEvents is the -e option of the ping-pong of the tool.
func optEvents(tool string) string {
	return `  -e, --events           sleep until packets arrive; without it rocev2d polls its
                         socket for up to 100 µs per wait (--busy-poll sets how
                         long), as ` + tool + ` polls its CQ
`
}

// optBind is the --bind option; exchange names the out-of-band connection.
func optBind(exchange string) string {
	return `      --bind=IP          local IP address for RoCEv2 (UDP 4791). Default: the address
                         of the ` + exchange + ` local end; a server
                         with --bind opens it before it waits for a client
`
}

var pingpongUsage = `usage: rocev2d pingpong [options] [server]

An RC ping-pong compatible with rdma-core's ibv_rc_pingpong: the same flags,
the same out-of-band exchange on TCP (default port 18515) and the same result
lines, so either side may be rocev2d or the real tool. Without a server
argument it waits for a client; with one it connects to it.

Both sides post rx-depth receives; the client sends first and then each side
alternates: send size bytes, receive size bytes, iters times.

options:
` + optPort + optSizeMTU + optRxIters + optSL + optEvents("ibv_rc_pingpong") +
	`  -g, --gid-idx=IDX      local GID index (accepted; the GID is the --bind address)
  -c, --chk              validate the received buffer like ibv_rc_pingpong -c
` + optBind("out-of-band TCP connection's") + optTail + `
` + outputAddrLines

var ucPingpongUsage = `usage: rocev2d uc-pingpong [options] [server]

A UC (unreliable connected) ping-pong compatible with rdma-core's
ibv_uc_pingpong: the same flags, the same out-of-band exchange on TCP
(default port 18515: "LID:QPN:PSN:GID") and the same result lines, so either
side may be rocev2d or the real tool. Without a server argument it waits for
a client; with one it connects to it.

Both sides post rx-depth receives; the client sends first and then each side
alternates: send size bytes (UC SEND_ONLY, or SEND_FIRST/MIDDLE/LAST above
the path MTU), receive size bytes, iters times. UC has no acknowledgements
and no retransmission: a send completes once it is on the wire, and a message
with a lost packet is dropped by the receiver, which stalls both sides (see
--timeout; -v shows uc_msgs_dropped).

options:
` + optPort + optSizeMTU + optRxIters + optSL + optEvents("ibv_uc_pingpong") + optGIDIdx +
	`  -c, --chk              validate the received buffer like ibv_uc_pingpong -c
` + optBind("out-of-band TCP connection's") + optTail + `
` + outputAddrLines

var udPingpongUsage = `usage: rocev2d ud-pingpong [options] [server]

A UD ping-pong compatible with rdma-core's ibv_ud_pingpong: the same flags,
the same out-of-band exchange on TCP (default port 18515: "LID:QPN:PSN:GID"),
the same Q_Key (0x11111111) and the same result lines, so either side may be
rocev2d or the real tool. Without a server argument it waits for a client;
with one it connects to it.

Both sides post rx-depth receives of size + 40 bytes (the first 40 take the
GRH, as verbs delivers UD datagrams); the client sends first and then each
side alternates: send one datagram of size bytes, receive one, iters times.
UD does not retransmit: a lost datagram stalls both sides (see --timeout).

options:
` + optPort + `  -s, --size=SIZE        message size in bytes (default 1024); at most the
                         port MTU, like ibv_ud_pingpong
  -m, --mtu=MTU          port MTU: 256, 512, 1024, 2048 or 4096 (default 1024,
                         rxe's on a 1500-byte Ethernet link; ibv_ud_pingpong
                         has no such flag, it queries the port)
` + optRxIters + optSL + optEvents("ibv_ud_pingpong") + optGIDIdx +
	`  -c, --chk              validate the received buffer like ibv_ud_pingpong -c
                         (rocev2d also checks that the last GRH names the peer)
` + optODP + optBind("out-of-band connection's") + optTail + `
` + outputAddrLines + `Exit status: 0 done, 1 failed (also: size larger than the port MTU), 2 bad usage.
`

var srqPingpongUsage = `usage: rocev2d srq-pingpong [options] [server]

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
` + optPort + optSizeMTU + `  -q, --num-qp=NUM       QPs (default 16; 1..255, at most rx-depth; both sides
                         must use the same number)
  -r, --rx-depth=DEP     receives in the SRQ (default 500)
  -n, --iters=ITERS      iterations, summed over the QPs (default 1000)
` + optSL + optEvents("ibv_srq_pingpong") + optGIDIdx +
	`  -c, --chk              validate the received buffer: ibv_srq_pingpong's buffer
                         is all zeros and so is every message; rocev2d checks
                         every byte (the tool, as server, the first of each page)
` + optODP + optBind("out-of-band TCP connection's") + optTail + `
Output: one local address line per QP, after the exchange one remote address
line per QP, then
  N bytes in S seconds = M Mbit/sec     (N = 2 × size × iters)
  N iters in S seconds = U usec/iter
Exit status: 0 done; 1 failed, also for the tool's own refusals ("rx_depth R
is too small for Q QPs", "num_qp Q must be less than 256"); 2 bad usage.
`
