package oob

import (
	"context"
	"fmt"
	"net"
)

// SRQPingpongMaxQP is ibv_srq_pingpong's MAX_QP. Its exchange always
// carries this many address messages each way, whatever -q says: the
// first num_qp describe its QPs, the rest are zero
// ("0000:000000:000000:0000…"). The tool refuses -q 256 and more, so at
// most SRQPingpongMaxQP-1 are used.
const SRQPingpongMaxQP = 256

// SRQPingpongUsed returns how many leading entries of an
// ibv_srq_pingpong address list describe QPs: those before the first
// with QP number 0 (QP0 is never an RC QP).
func SRQPingpongUsed(d []PingpongDest) int {
	for i := range d {
		if d[i].QPN == 0 {
			return i
		}
	}
	return len(d)
}

// srqPingpongBlock encodes local, padded with zero entries, as the
// SRQPingpongMaxQP messages the tool writes. They go out in one Write:
// the tool writes one message per write(2) but reads each in a loop until
// it has 52 bytes, so the segmentation does not matter to it.
func srqPingpongBlock(local []PingpongDest) ([]byte, error) {
	if len(local) > SRQPingpongMaxQP {
		return nil, &ParseError{Message: ppMsgName, Field: "count",
			Detail: fmt.Sprintf("%d QPs, at most %d", len(local), SRQPingpongMaxQP)}
	}
	b := make([]byte, SRQPingpongMaxQP*PingpongDestSize)
	var zero PingpongDest
	for i := 0; i < SRQPingpongMaxQP; i++ {
		d := zero
		if i < len(local) {
			d = local[i]
			if err := d.Validate(); err != nil {
				return nil, fmt.Errorf("entry %d: %w", i, err)
			}
		}
		d.Encode(b[i*PingpongDestSize:])
	}
	return b, nil
}

// readSRQPingpongDests reads and parses the peer's SRQPingpongMaxQP
// address messages as the wire step named step.
func (c *stepConn) readSRQPingpongDests(ctx context.Context, step string) ([]PingpongDest, error) {
	buf := make([]byte, SRQPingpongMaxQP*PingpongDestSize)
	remote := make([]PingpongDest, SRQPingpongMaxQP)
	err := c.run(ctx, step, func() (string, error) {
		if err := c.read(buf); err != nil {
			return "read", err
		}
		for i := range remote {
			d, err := ParsePingpongDest(buf[i*PingpongDestSize : (i+1)*PingpongDestSize])
			if err != nil {
				return "parse", fmt.Errorf("entry %d: %w", i, err)
			}
			remote[i] = d
		}
		return "", nil
	})
	return remote, err
}

// SRQPingpongClient runs the client side of ibv_srq_pingpong's exchange
// on conn, as its pp_client_exch_dest does: write SRQPingpongMaxQP
// address messages (local, then zero entries), read as many from the
// server, write "done\0". It returns all SRQPingpongMaxQP remote entries
// (SRQPingpongUsed counts the server's QPs). The server has brought its
// QPs up when it replies; the caller brings its own up afterwards.
func SRQPingpongClient(ctx context.Context, conn net.Conn, local []PingpongDest) ([]PingpongDest, error) {
	c := stepConn{conn: conn, proto: "srq pingpong"}
	out, err := srqPingpongBlock(local)
	if err != nil {
		return nil, &StepError{Protocol: c.proto, Step: PingpongStepClientDest, Op: "check", Err: err}
	}
	err = c.run(ctx, PingpongStepClientDest, func() (string, error) {
		return "write", c.write(out)
	})
	if err != nil {
		return nil, err
	}
	remote, err := c.readSRQPingpongDests(ctx, PingpongStepServerDest)
	if err != nil {
		return nil, err
	}
	return remote, c.writeDone(ctx)
}

// SRQPingpongServer runs the server side of ibv_srq_pingpong's exchange
// on conn, as its pp_server_exch_dest does: read the client's
// SRQPingpongMaxQP address messages; call localFunc with them (all of
// them: SRQPingpongUsed counts the client's QPs) — the caller brings its
// QPs to RTS there and returns its own addresses; write those, padded
// with zero entries; read "done\0". If localFunc fails, nothing is
// written and its error is returned. The caller closes conn.
func SRQPingpongServer(ctx context.Context, conn net.Conn, localFunc func(remote []PingpongDest) ([]PingpongDest, error)) ([]PingpongDest, error) {
	c := stepConn{conn: conn, proto: "srq pingpong"}
	remote, err := c.readSRQPingpongDests(ctx, PingpongStepClientDest)
	if err != nil {
		return nil, err
	}
	local, err := localFunc(remote)
	if err != nil {
		return remote, &StepError{Protocol: c.proto, Step: PingpongStepConnect, Op: "local", Err: err}
	}
	out, err := srqPingpongBlock(local)
	if err != nil {
		return remote, &StepError{Protocol: c.proto, Step: PingpongStepServerDest, Op: "check", Err: err}
	}
	err = c.run(ctx, PingpongStepServerDest, func() (string, error) {
		return "write", c.write(out)
	})
	if err != nil {
		return remote, err
	}
	return remote, c.readDone(ctx)
}
