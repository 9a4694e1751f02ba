package main

import (
	"context"
	"io"
)

// uc-pingpong is pingpong (pingpong.go) on a UC QP: parsePPFlags, ppInit,
// connectTo, loop and the result lines take the ppUC branch where UC
// differs (the QP type, the connection attributes).

func init() {
	register("uc-pingpong", "UC ping-pong, flag- and wire-compatible with ibv_uc_pingpong", ucPingpongUsage, runUCPingpong)
}

const ucPingpongUsage = `usage: rocev2d uc-pingpong [options] [server]

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
  -p, --port=PORT        out-of-band TCP port (default 18515)
  -d, --ib-dev=DEV       device name (accepted for compatibility; rocev2d has one device per address)
  -i, --ib-port=PORT     port of the device (accepted, must be 1)
  -s, --size=SIZE        message size in bytes (default 4096)
  -m, --mtu=MTU          path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)
  -r, --rx-depth=DEP     receives to post (default 500)
  -n, --iters=ITERS      iterations (default 1000)
  -l, --sl=SL            service level (accepted, not used by RoCEv2)
  -e, --events           sleep until packets arrive; without it rocev2d polls its
                         socket for up to 100 µs per wait (--busy-poll sets how
                         long), as ibv_uc_pingpong polls its CQ
  -g, --gid-idx=IDX      local GID index (accepted; the GID is the --bind
                         address). The real tool needs it on RoCE: without -g
                         it sends a zero GID, which rocev2d refuses
  -c, --chk              validate the received buffer like ibv_uc_pingpong -c
      --bind=IP          local IP address for RoCEv2 (UDP 4791). Default: the address
                         of the out-of-band TCP connection's local end; a server
                         with --bind opens it before it waits for a client
      --timeout=DUR      give up when the whole run takes longer (default 0 = no limit)
  -v                     print the device counters (rxe's names) at the end; SIGUSR1
                         prints them while running
` + socketUsage + `
Output: the local and remote address lines, then
  N bytes in S seconds = M Mbit/sec
  N iters in S seconds = U usec/iter
`

func runUCPingpong(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runPPCmd(ctx, args, ppUC, stdout, stderr)
}
