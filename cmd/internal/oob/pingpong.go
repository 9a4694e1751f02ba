package oob

import (
	"context"
	"fmt"
	"net"
)

// PingpongDestSize is the length of an ibv_*_pingpong address message:
// sizeof "0000:000000:000000:00000000000000000000000000000000".
const PingpongDestSize = 52

// Offsets in the pingpong message "%04x:%06x:%06x:%s\0".
const (
	ppLIDOff  = 0  // 4 hex digits
	ppQPNOff  = 5  // 6 hex digits
	ppPSNOff  = 12 // 6 hex digits
	ppGIDOff  = 19 // 32 hex digits, GID bytes in order
	ppNulOff  = 51
	ppLIDLen  = 4
	ppQPNLen  = 6
	ppPSNLen  = 6
	ppGIDLen  = 32
	ppMsgName = "pingpong dest"
)

// PingpongDest is what ibv_{rc,uc,ud}_pingpong tell each other: LID, QP
// number, first PSN and GID (struct pingpong_dest in rdma-core's examples).
type PingpongDest struct {
	LID uint16
	QPN uint32 // 24 bits
	PSN uint32 // 24 bits
	GID [16]byte
}

// Validate reports whether d fits the message format (QPN and PSN are 24-bit).
func (d PingpongDest) Validate() error {
	if d.QPN > 0xffffff {
		return &ParseError{Message: ppMsgName, Field: "qpn", Detail: fmt.Sprintf("%#x does not fit 24 bits", d.QPN)}
	}
	if d.PSN > 0xffffff {
		return &ParseError{Message: ppMsgName, Field: "psn", Detail: fmt.Sprintf("%#x does not fit 24 bits", d.PSN)}
	}
	return nil
}

// Encode writes the 52-byte message "%04x:%06x:%06x:%s\0" (lid:qpn:psn:gid,
// the GID as 32 lower-case hex digits in byte order, as rdma-core's
// gid_to_wire_gid produces) into b, which must be at least PingpongDestSize
// long. QPN and PSN are truncated to 24 bits; see Validate.
func (d PingpongDest) Encode(b []byte) {
	b = b[:PingpongDestSize]
	putHex(b[ppLIDOff:ppLIDOff+ppLIDLen], uint64(d.LID))
	b[ppQPNOff-1] = ':'
	putHex(b[ppQPNOff:ppQPNOff+ppQPNLen], uint64(d.QPN))
	b[ppPSNOff-1] = ':'
	putHex(b[ppPSNOff:ppPSNOff+ppPSNLen], uint64(d.PSN))
	b[ppGIDOff-1] = ':'
	for i, c := range d.GID {
		b[ppGIDOff+2*i] = hexDigits[c>>4]
		b[ppGIDOff+2*i+1] = hexDigits[c&0xf]
	}
	b[ppNulOff] = 0
}

// Marshal returns the 52-byte message for d.
func (d PingpongDest) Marshal() []byte {
	b := make([]byte, PingpongDestSize)
	d.Encode(b)
	return b
}

// String formats d like the tools' "local address:" line.
func (d PingpongDest) String() string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", d.LID, d.QPN, d.PSN, net.IP(d.GID[:]))
}

// ParsePingpongDest parses a 52-byte pingpong address message. It is strict
// about the layout the tools produce (fixed field widths, ':' separators,
// trailing NUL) and accepts hex digits of either case.
func ParsePingpongDest(b []byte) (PingpongDest, error) {
	var d PingpongDest
	if len(b) != PingpongDestSize {
		return d, &ParseError{Message: ppMsgName, Field: "length",
			Detail: fmt.Sprintf("%d bytes, want %d", len(b), PingpongDestSize)}
	}
	for _, sep := range [...]struct {
		off   int
		field string
	}{{ppQPNOff - 1, "qpn"}, {ppPSNOff - 1, "psn"}, {ppGIDOff - 1, "gid"}} {
		if err := expectByte(ppMsgName, sep.field, " separator", b, sep.off, ':'); err != nil {
			return d, err
		}
	}
	if err := expectByte(ppMsgName, "terminator", "", b, ppNulOff, 0); err != nil {
		return d, err
	}
	v, err := parseHex(ppMsgName, "lid", b[ppLIDOff:ppLIDOff+ppLIDLen])
	if err != nil {
		return d, err
	}
	d.LID = uint16(v)
	if v, err = parseHex(ppMsgName, "qpn", b[ppQPNOff:ppQPNOff+ppQPNLen]); err != nil {
		return d, err
	}
	d.QPN = uint32(v)
	if v, err = parseHex(ppMsgName, "psn", b[ppPSNOff:ppPSNOff+ppPSNLen]); err != nil {
		return d, err
	}
	d.PSN = uint32(v)
	for i := range d.GID {
		v, err := parseHex(ppMsgName, "gid", b[ppGIDOff+2*i:ppGIDOff+2*i+2])
		if err != nil {
			return d, err
		}
		d.GID[i] = byte(v)
	}
	return d, nil
}

// Pingpong step names, as they appear in StepErrors.
const (
	PingpongStepClientDest = "client dest"
	PingpongStepServerDest = "server dest"
	PingpongStepConnect    = "connect"
	PingpongStepDone       = "done"
)

// PingpongClient runs the client side of the ibv_*_pingpong exchange on
// conn, exactly as pp_client_exch_dest does: write local (52 bytes), read the
// server's 52-byte reply, write "done\0". The server has already brought its
// QP to RTR/RTS when it replies; the caller brings its own QP up after
// PingpongClient returns (the real client also does it after writing "done"),
// then closes conn.
func PingpongClient(ctx context.Context, conn net.Conn, local PingpongDest) (PingpongDest, error) {
	c := stepConn{conn: conn, proto: "pingpong"}
	var remote PingpongDest
	if err := local.Validate(); err != nil {
		return remote, &StepError{Protocol: c.proto, Step: PingpongStepClientDest, Op: "check", Err: err}
	}
	var out [PingpongDestSize]byte
	local.Encode(out[:])
	err := c.run(ctx, PingpongStepClientDest, func() (string, error) {
		return "write", c.write(out[:])
	})
	if err != nil {
		return remote, err
	}
	if remote, err = c.readPingpongDest(ctx, PingpongStepServerDest); err != nil {
		return remote, err
	}
	return remote, c.writeDone(ctx)
}

// writeDone sends the last message of the ibv_*_pingpong exchanges, the
// client's "done\0", as the wire step PingpongStepDone.
func (c *stepConn) writeDone(ctx context.Context) error {
	return c.run(ctx, PingpongStepDone, func() (string, error) {
		return "write", c.write(doneMsg[:])
	})
}

// readDone reads the last message of the ibv_*_pingpong exchanges on the
// server side: the client's "done\0", as the wire step PingpongStepDone.
func (c *stepConn) readDone(ctx context.Context) error {
	return c.run(ctx, PingpongStepDone, func() (string, error) {
		var in [len(doneMsg)]byte
		if err := c.read(in[:]); err != nil {
			return "read", err
		}
		if in != doneMsg {
			return "parse", &ParseError{Message: "pingpong done", Field: "payload",
				Detail: fmt.Sprintf("got %q, want \"done\\0\"", printable(in[:]))}
		}
		return "", nil
	})
}

// readPingpongDest reads and parses the peer's 52-byte address message as
// the wire step named step.
func (c *stepConn) readPingpongDest(ctx context.Context, step string) (PingpongDest, error) {
	var remote PingpongDest
	var buf [PingpongDestSize]byte
	err := c.run(ctx, step, func() (string, error) {
		if err := c.read(buf[:]); err != nil {
			return "read", err
		}
		var err error
		if remote, err = ParsePingpongDest(buf[:]); err != nil {
			return "parse", err
		}
		return "", nil
	})
	return remote, err
}

// PingpongServer runs the server side of the ibv_*_pingpong exchange on conn
// (an accepted connection), exactly as pp_server_exch_dest does: read the
// client's 52-byte message; call localFunc with it — the caller brings its QP
// to RTR and RTS there and returns its own address; write that address; read
// the client's "done\0". If localFunc fails, nothing is written (the real
// server closes the connection) and its error is returned. The caller closes
// conn. PingpongServer returns the client's address.
func PingpongServer(ctx context.Context, conn net.Conn, localFunc func(remote PingpongDest) (PingpongDest, error)) (PingpongDest, error) {
	c := stepConn{conn: conn, proto: "pingpong"}
	remote, err := c.readPingpongDest(ctx, PingpongStepClientDest)
	if err != nil {
		return remote, err
	}
	local, err := localFunc(remote)
	if err != nil {
		return remote, &StepError{Protocol: c.proto, Step: PingpongStepConnect, Op: "local", Err: err}
	}
	if err := local.Validate(); err != nil {
		return remote, &StepError{Protocol: c.proto, Step: PingpongStepServerDest, Op: "check", Err: err}
	}
	var buf [PingpongDestSize]byte
	local.Encode(buf[:])
	err = c.run(ctx, PingpongStepServerDest, func() (string, error) {
		return "write", c.write(buf[:])
	})
	if err != nil {
		return remote, err
	}
	return remote, c.readDone(ctx)
}
