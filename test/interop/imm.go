//go:build linux

package interop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"math/rand/v2"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// immPort is rv2imm's out-of-band TCP port.
const immPort = 18516

// immMsgLen is the size of rv2imm's NUL-padded address message.
const immMsgLen = 96

// immBase is the immediate of message 0; message i carries immBase+i.
const immBase = 0x11220000

// immConfig is one rv2imm run on the rocev2 side.
type immConfig struct {
	write     bool // RDMA WRITE with immediate, else SEND with immediate
	size      int
	iters     int
	requester bool // the client, which sends; else the server, which receives and verifies
	// mw runs rv2imm -o mw instead (mw.go): size is the window length,
	// iters is not used; the server owns the windows, the client is the
	// requester.
	mw bool
}

// immPeer is rv2imm's address message.
type immPeer struct {
	qpn, psn, rkey uint32
	vaddr          uint64
	gid            [16]byte
}

func (p immPeer) encode() []byte {
	b := make([]byte, immMsgLen)
	copy(b, fmt.Sprintf("RV2IMM1 %06x %06x %08x %016x %x", p.qpn, p.psn, p.rkey, p.vaddr, p.gid[:]))
	return b
}

func parseImmPeer(b []byte) (immPeer, error) {
	var p immPeer
	f := strings.Fields(strings.TrimRight(string(b), "\x00"))
	if len(f) != 6 || f[0] != "RV2IMM1" || len(f[5]) != 32 {
		return p, fmt.Errorf("rv2imm message %q: want \"RV2IMM1 qpn psn rkey vaddr gid\"", strings.TrimRight(string(b), "\x00"))
	}
	var err error
	parse := func(s string, bits int) uint64 {
		v, e := strconv.ParseUint(s, 16, bits)
		if e != nil && err == nil {
			err = fmt.Errorf("rv2imm message field %q: %w", s, e)
		}
		return v
	}
	p.qpn = uint32(parse(f[1], 24))
	p.psn = uint32(parse(f[2], 24))
	p.rkey = uint32(parse(f[3], 32))
	p.vaddr = parse(f[4], 64)
	for i := range p.gid {
		p.gid[i] = byte(parse(f[5][2*i:2*i+2], 8))
	}
	return p, err
}

func immPattern(i, k int) byte { return byte(7*i + k) }

// runImm is the rocev2 side of rv2imm, built directly on the transport
// package over a UDP socket in the lab namespace (HostIP:4791). As the
// server it reports on ready once its out-of-band listener is up.
func runImm(ctx context.Context, lab *Lab, c immConfig, out io.Writer, ready chan<- error) (err error) {
	fail := func(e error) error {
		if !c.requester {
			select {
			case ready <- e:
			default:
			}
		}
		return e
	}
	var link *udp.SocketLink
	var ln net.Listener
	if err := lab.InNS(func() (err error) {
		if link, err = udp.ListenSocket(netip.MustParseAddr(HostIP), nil); err != nil {
			return err
		}
		if !c.requester {
			var lc net.ListenConfig
			ln, err = lc.Listen(ctx, "tcp", ":"+strconv.Itoa(immPort))
		}
		return err
	}); err != nil {
		if link != nil {
			link.Close()
		}
		return fail(err)
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		link.Close()
		return fail(err)
	}
	defer dev.Close()
	// The counters in rocev2d -v's format, so that the harness reads this
	// side's retransmissions the same way.
	defer func() {
		fmt.Fprintf(out, "counters %s:\n", HostIP)
		for _, kv := range dev.Counters().List() {
			fmt.Fprintf(out, "  %-24s %d\n", kv.Name, kv.Value)
		}
	}()
	if ln != nil {
		defer ln.Close()
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return fail(err)
	}
	// The QP's remote rights, and the region's: -o mw reads too, and
	// binds windows to the region.
	qpAccess, mrAccess := memreg.AccessRemoteWrite, memreg.AccessLocalWrite|memreg.AccessRemoteWrite
	if c.mw {
		c.iters = mwSlots
		qpAccess |= memreg.AccessRemoteRead
		mrAccess |= memreg.AccessRemoteRead | memreg.AccessMWBind
	}
	buf := make([]byte, c.size*c.iters)
	mr, err := pd.RegisterMR(buf, mrAccess)
	if err != nil {
		return fail(err)
	}
	cq, err := dev.CreateCQ(2*c.iters + 4)
	if err != nil {
		return fail(err)
	}
	qp, err := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		MaxSendWR: c.iters, MaxRecvWR: c.iters, MaxSGE: 1})
	if err != nil {
		return fail(err)
	}
	if err := qp.Init(qpAccess); err != nil {
		return fail(err)
	}
	sge := func(i int) []memreg.SGE {
		return []memreg.SGE{{Addr: mr.IOVA() + uint64(i*c.size), Length: uint32(c.size), LKey: mr.LKey()}}
	}
	if !c.requester && !c.mw {
		for i := 0; i < c.iters; i++ {
			if err := qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: sge(i)}); err != nil {
				return fail(err)
			}
		}
	}
	me := immPeer{qpn: qp.QPN(), psn: rand.Uint32() & 0xffffff, rkey: mr.RKey(), vaddr: mr.IOVA(), gid: dev.GID()}
	connect := func(rem immPeer) error {
		// rv2imm's attributes: MTU 1024, one READ/atomic each way,
		// rdma-core's retry values (transport.DefaultRetry).
		return qp.Connect(transport.ConnParams{Peer: netip.AddrFrom16(rem.gid).Unmap(), DestQPN: rem.qpn, RQPSN: rem.psn,
			SQPSN: me.psn, PathMTU: transport.MTU1024, Access: qpAccess, MaxRdAtomic: 1, MaxDestRdAtomic: 1})
	}
	var conn net.Conn
	var rem immPeer
	msg := make([]byte, immMsgLen)
	if c.requester {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err = lab.dialNS(dctx, net.JoinHostPort(VMIP, strconv.Itoa(immPort)))
		cancel()
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := conn.Write(me.encode()); err != nil {
			return err
		}
		if _, err := io.ReadFull(conn, msg); err != nil {
			return fmt.Errorf("reading rv2imm's address: %w", err)
		}
		if rem, err = parseImmPeer(msg); err != nil {
			return err
		}
		if err := connect(rem); err != nil {
			return err
		}
	} else {
		ready <- nil
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		conn, err = ln.Accept()
		if err != nil {
			return fmt.Errorf("waiting for rv2imm on TCP %d: %w", immPort, err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := io.ReadFull(conn, msg); err != nil {
			return fmt.Errorf("reading rv2imm's address: %w", err)
		}
		if rem, err = parseImmPeer(msg); err != nil {
			return err
		}
		if err := connect(rem); err != nil {
			return err
		}
		if _, err := conn.Write(me.encode()); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "local  QPN 0x%06x PSN 0x%06x RKey 0x%08x VAddr 0x%016x\n", me.qpn, me.psn, me.rkey, me.vaddr)
	fmt.Fprintf(out, "remote QPN 0x%06x PSN 0x%06x RKey 0x%08x VAddr 0x%016x\n", rem.qpn, rem.psn, rem.rkey, rem.vaddr)

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if c.mw {
		m := &mwSide{ctx: wctx, qp: qp, cq: cq, pd: pd, mr: mr, buf: buf, n: c.size, conn: conn, out: out}
		t0 := time.Now()
		if c.requester {
			err = m.user()
		} else {
			err = m.owner()
		}
		if err == nil && len(m.problems) > 0 {
			err = errors.New(strings.Join(m.problems, "; "))
		}
		if err == nil {
			fmt.Fprintf(out, "%.3f seconds\n", time.Since(t0).Seconds())
		}
		return err
	}
	wcs := make([]transport.WC, 16)
	opName := map[bool]string{true: "RDMA_WRITE_WITH_IMM", false: "SEND_WITH_IMM"}[c.write]
	t0 := time.Now()
	if c.requester {
		for i := 0; i < c.iters; i++ {
			for k := 0; k < c.size; k++ {
				buf[i*c.size+k] = immPattern(i, k)
			}
			wr := transport.SendWR{WRID: uint64(i), Opcode: transport.WRSendImm, Flags: transport.SendSignaled,
				SGEs: sge(i), Imm: immBase + uint32(i)}
			if c.write {
				wr.Opcode = transport.WRWriteImm
				wr.RemoteAddr = rem.vaddr + uint64(i*c.size)
				wr.RKey = rem.rkey
			}
			if err := qp.PostSend(wr); err != nil {
				return err
			}
		}
		for done := 0; done < c.iters; {
			n, err := cq.Wait(wctx, wcs)
			if err != nil {
				return fmt.Errorf("after %d of %d send completions: %w", done, c.iters, err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != transport.WCSuccess {
					return fmt.Errorf("wr %d: %s", wc.WRID, wc.Status)
				}
				done++
			}
		}
		verdict := make([]byte, 4)
		if _, err := io.ReadFull(conn, verdict); err != nil {
			return fmt.Errorf("reading rv2imm's verdict: %w", err)
		}
		v := strings.TrimRight(string(verdict), "\x00")
		fmt.Fprintf(out, "%d %s of %d bytes: server says %s\n", c.iters, opName, c.size, v)
		if !strings.HasPrefix(v, "ok") {
			return errors.New("rv2imm (the receiver) reports a mismatch")
		}
	} else {
		var problems []string
		want := transport.WCRecv
		if c.write {
			want = transport.WCRecvRDMAImm
		}
		for done := 0; done < c.iters; {
			n, err := cq.Wait(wctx, wcs)
			if err != nil {
				return fmt.Errorf("after %d of %d receive completions: %w", done, c.iters, err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != transport.WCSuccess {
					return fmt.Errorf("recv %d: %s", wc.WRID, wc.Status)
				}
				if wc.Opcode != want || wc.Flags&transport.WCWithImm == 0 || wc.Imm != immBase+uint32(done) ||
					wc.ByteLen != uint32(c.size) || wc.WRID != uint64(done) {
					problems = append(problems, fmt.Sprintf("completion %d: opcode %v (want %v) flags %#x imm %#x (want %#x) byte_len %d (want %d) wr_id %d",
						done, wc.Opcode, want, wc.Flags, wc.Imm, immBase+uint32(done), wc.ByteLen, c.size, wc.WRID))
				}
				done++
			}
		}
		wrong := 0
		for i := 0; i < c.iters; i++ {
			for k := 0; k < c.size; k++ {
				if b := buf[i*c.size+k]; b != immPattern(i, k) {
					if wrong == 0 {
						problems = append(problems, fmt.Sprintf("message %d byte %d: %#x, want %#x", i, k, b, immPattern(i, k)))
					}
					wrong++
				}
			}
		}
		if wrong > 0 {
			problems = append(problems, fmt.Sprintf("%d wrong bytes", wrong))
		}
		verdict := []byte("ok\n\x00")
		if len(problems) > 0 {
			verdict = []byte("bad\x00")
		}
		conn.Write(verdict)
		fmt.Fprintf(out, "%d %s of %d bytes received and verified: %s\n", c.iters, opName, c.size,
			map[bool]string{true: "ok", false: "MISMATCH"}[len(problems) == 0])
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "; "))
		}
	}
	fmt.Fprintf(out, "%.3f seconds\n", time.Since(t0).Seconds())
	return nil
}
