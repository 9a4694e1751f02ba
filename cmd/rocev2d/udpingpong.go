package main

import (
	"context"
	"io"
)

// ud-pingpong is pingpong (pingpong.go) on a UD QP: parsePPFlags, ppInit,
// connectTo, loop and the result lines take the ud branch.

func init() {
	register("ud-pingpong", "UD ping-pong, flag- and wire-compatible with ibv_ud_pingpong", udPingpongUsage, runUDPingpong)
}

// udQKey is ibv_ud_pingpong's Q_Key: its QP's own, and the one its sends
// carry.
const udQKey = 0x11111111

const udPingpongUsage = `usage: rocev2d ud-pingpong [options] [server]

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
  -p, --port=PORT        out-of-band TCP port (default 18515)
  -d, --ib-dev=DEV       device name (accepted for compatibility; rocev2d has one device per address)
  -i, --ib-port=PORT     port of the device (accepted, must be 1)
  -s, --size=SIZE        message size in bytes (default 1024); at most the
                         port MTU, like ibv_ud_pingpong
  -m, --mtu=MTU          port MTU: 256, 512, 1024, 2048 or 4096 (default 1024,
                         rxe's on a 1500-byte Ethernet link; ibv_ud_pingpong
                         has no such flag, it queries the port)
  -r, --rx-depth=DEP     receives to post (default 500)
  -n, --iters=ITERS      iterations (default 1000)
  -l, --sl=SL            service level (accepted, not used by RoCEv2)
  -e, --events           sleep until packets arrive; without it rocev2d polls its
                         socket for up to 100 µs per wait (--busy-poll sets how
                         long), as ibv_ud_pingpong polls its CQ
  -g, --gid-idx=IDX      local GID index (accepted; the GID is the --bind
                         address). The real tool needs it on RoCE: without -g
                         it sends a zero GID, which rocev2d refuses
  -c, --chk              validate the received buffer like ibv_ud_pingpong -c
                         (rocev2d also checks that the last GRH names the peer)
  -o, --odp              accepted and ignored
      --bind=IP          local IP address for RoCEv2 (UDP 4791). Default: the address
                         of the out-of-band connection's local end; a server
                         with --bind opens it before it waits for a client
      --timeout=DUR      give up when the whole run takes longer (default 0 = no limit)
  -v                     print the device counters (rxe's names) at the end; SIGUSR1
                         prints them while running
` + socketUsage + `
Output: the local and remote address lines, then
  N bytes in S seconds = M Mbit/sec
  N iters in S seconds = U usec/iter
Exit status: 0 done, 1 failed (also: size larger than the port MTU), 2 bad usage.
`

func runUDPingpong(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runPPCmd(ctx, args, ppUD, stdout, stderr)
}
