//go:build linux

package interop

import (
	"context"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
)

// The rocev2 side of rv2imm -o mw (memory windows; the protocol is in
// vmtools/rv2imm.c's header): runImm sets up the device, QP and
// out-of-band connection as for the immediate modes, then owner (the
// server: binds a type 1 window with QP.BindMW and a type 2 window with a
// WRBindMW work request, LOCAL_INV, rebind, takes a SEND with Invalidate)
// or user (the client: READ and WRITE through both windows, WRITE through
// the rebound window, SEND with Invalidate, and a WRITE after it that
// must fail with the remote access NAK) runs the steps.

// mwSlots is the buffer of an -o mw run in window lengths: the owner's
// two windows and its receive slot; the user's two READ targets and the
// sources of patterns 3..7.
const mwSlots = 7

// Pattern numbers (immPattern's i) of the -o mw steps.
const (
	mwPatWin1      = 1 // the owner's type 1 window, READ by the user
	mwPatWin2      = 2 // the owner's type 2 window, READ by the user
	mwPatWrite1    = 3 // WRITE through the type 1 window
	mwPatWrite2    = 4 // WRITE through the type 2 window
	mwPatRebound   = 5 // WRITE through the rebound type 2 window
	mwPatSendInv   = 6 // the SEND with Invalidate
	mwPatForbidden = 7 // the WRITE after the invalidate (refused)
)

// mwRefusedLen is the length of the WRITE after the invalidate: one
// packet, because rxe drops the packets that follow the refused one
// without counting them in rcvd_pkts (its responder is in ERR by then).
const mwRefusedLen = 64

// mwRights are the remote rights both windows grant.
const mwRights = memreg.AccessRemoteRead | memreg.AccessRemoteWrite

// mwSide is one side of an -o mw run.
type mwSide struct {
	ctx  context.Context
	qp   *transport.QP
	cq   *transport.CQ
	pd   *memreg.PD
	mr   *memreg.MR
	buf  []byte
	n    int // window length
	conn net.Conn
	out  io.Writer
	// problems are mismatches that let the run go on to its end.
	problems []string
}

// slot is the i-th window-length piece of the buffer.
func (m *mwSide) slot(i int) []byte { return m.buf[i*m.n : (i+1)*m.n] }

// sge is slot i as a local SGE.
func (m *mwSide) sge(i int) []memreg.SGE { return []memreg.SGE{m.mr.SGE(uint64(i*m.n), uint32(m.n))} }

func (m *mwSide) fill(i, pat int) {
	for k, b := 0, m.slot(i); k < len(b); k++ {
		b[k] = immPattern(pat, k)
	}
}

// check notes the first byte of b that is not immPattern(pat, .).
func (m *mwSide) check(what string, b []byte, pat int) {
	for k := range b {
		if b[k] != immPattern(pat, k) {
			m.problems = append(m.problems, fmt.Sprintf("%s: byte %d is %#x, want %#x (pattern %d)", what, k, b[k], immPattern(pat, k), pat))
			return
		}
	}
}

// send writes one 96-byte NUL-padded step message.
func (m *mwSide) send(format string, args ...any) error {
	b := make([]byte, immMsgLen)
	copy(b, fmt.Sprintf(format, args...))
	m.conn.SetDeadline(time.Now().Add(60 * time.Second))
	_, err := m.conn.Write(b)
	return err
}

// recv reads the next step message, which must start with tag and not
// say "bad".
func (m *mwSide) recv(tag string) (string, error) {
	b := make([]byte, immMsgLen)
	m.conn.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadFull(m.conn, b); err != nil {
		return "", fmt.Errorf("waiting for rv2imm's %q: %w", tag, err)
	}
	msg := strings.TrimRight(string(b), "\x00")
	// "bad" is a word of its own: a hex address may hold the letters
	// (0x00002719bad5a000 once failed a run).
	if !strings.HasPrefix(msg, tag) || slices.Contains(strings.Fields(msg), "bad") {
		return "", fmt.Errorf("rv2imm says %q, want %q", msg, tag)
	}
	return msg, nil
}

// next waits for one completion.
func (m *mwSide) next() (transport.WC, error) {
	var wcs [1]transport.WC
	if _, err := m.cq.Wait(m.ctx, wcs[:]); err != nil {
		return transport.WC{}, err
	}
	return wcs[0], nil
}

// expect waits for a successful completion of wrid with opcode op.
func (m *mwSide) expect(what string, wrid uint64, op transport.WCOpcode) error {
	wc, err := m.next()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if wc.Status != transport.WCSuccess || wc.WRID != wrid || wc.Opcode != op {
		return fmt.Errorf("%s: wr_id %d (want %d) status %v opcode %v (want %v)", what, wc.WRID, wrid, wc.Status, wc.Opcode, op)
	}
	return nil
}

// bind2 binds the type 2 window mw over slot 1 with a WRBindMW work
// request, key byte + 1, and returns the new rkey.
func (m *mwSide) bind2(mw *memreg.MW, wrid uint64) (uint32, error) {
	key := (mw.RKey() + 1) & 0xff
	err := m.qp.PostSend(transport.SendWR{WRID: wrid, Opcode: transport.WRBindMW, Flags: transport.SendSignaled, MW: mw, RKey: key,
		Bind: transport.MWBindInfo{MR: m.mr, Addr: m.mr.IOVA() + uint64(m.n), Length: uint64(m.n), Access: mwRights}})
	if err != nil {
		return 0, err
	}
	if err := m.expect("type 2 bind (BIND_MW work request)", wrid, transport.WCBindMW); err != nil {
		return 0, err
	}
	return mw.RKey(), nil
}

// owner is the server of -o mw: it owns the windows (slots 0 and 1) and
// receives the SEND with Invalidate in slot 2.
func (m *mwSide) owner() error {
	m.fill(0, mwPatWin1)
	m.fill(1, mwPatWin2)
	mw1, err := m.pd.AllocMW(memreg.MWType1)
	if err != nil {
		return err
	}
	mw2, err := m.pd.AllocMW(memreg.MWType2)
	if err != nil {
		return err
	}
	rkey1, err := m.qp.BindMW(101, mw1, transport.MWBindInfo{MR: m.mr, Addr: m.mr.IOVA(), Length: uint64(m.n), Access: mwRights}, transport.SendSignaled)
	if err != nil {
		return err
	}
	if err := m.expect("type 1 bind (QP.BindMW)", 101, transport.WCBindMW); err != nil {
		return err
	}
	rkey2, err := m.bind2(mw2, 102)
	if err != nil {
		return err
	}
	va1, va2 := m.mr.IOVA(), m.mr.IOVA()+uint64(m.n)
	fmt.Fprintf(m.out, "windows: type 1 rkey 0x%08x va 0x%016x, type 2 rkey 0x%08x va 0x%016x, length %d\n", rkey1, va1, rkey2, va2, m.n)
	if err := m.send("RV2MW1 %08x %016x %08x %016x %x", rkey1, va1, rkey2, va2, m.n); err != nil {
		return err
	}

	if _, err := m.recv("RV2MW2 ok"); err != nil {
		return err
	}
	m.check("type 1 window after the peer's WRITE", m.slot(0), mwPatWrite1)
	m.check("type 2 window after the peer's WRITE", m.slot(1), mwPatWrite2)
	if err := m.qp.PostSend(transport.SendWR{WRID: 103, Opcode: transport.WRLocalInv, Flags: transport.SendSignaled, InvRKey: rkey2}); err != nil {
		return err
	}
	if err := m.expect("local invalidate (LOCAL_INV work request)", 103, transport.WCLocalInv); err != nil {
		return err
	}
	if mw2.Bound() {
		m.problems = append(m.problems, "the type 2 window is still bound after LOCAL_INV")
	}
	rkey2b, err := m.bind2(mw2, 104)
	if err != nil {
		return err
	}
	if err := m.qp.PostRecv(transport.RecvWR{WRID: 201, SGEs: m.sge(2)}); err != nil {
		return err
	}
	fmt.Fprintf(m.out, "type 2 window invalidated locally and bound again: rkey 0x%08x\n", rkey2b)
	bad := ""
	if len(m.problems) > 0 {
		bad = " bad"
	}
	if err := m.send("RV2MW3 %08x%s", rkey2b, bad); err != nil {
		return err
	}

	wc, err := m.next()
	if err != nil {
		return fmt.Errorf("waiting for the SEND with Invalidate: %w", err)
	}
	if wc.Status != transport.WCSuccess || wc.WRID != 201 || wc.Opcode != transport.WCRecv || wc.Flags&transport.WCWithInv == 0 ||
		wc.InvalidatedRKey != rkey2b || wc.ByteLen != uint32(m.n) {
		m.problems = append(m.problems, fmt.Sprintf("SEND_WITH_INV receive: status %v wr_id %d opcode %v flags %#x invalidated_rkey %#x (want %#x) byte_len %d (want %d)",
			wc.Status, wc.WRID, wc.Opcode, wc.Flags, wc.InvalidatedRKey, rkey2b, wc.ByteLen, m.n))
	}
	if mw2.Bound() {
		m.problems = append(m.problems, "the type 2 window is still bound after the SEND with Invalidate")
	}
	m.check("SEND_WITH_INV data", m.slot(2), mwPatSendInv)
	m.check("type 2 window after the WRITE through its new rkey", m.slot(1), mwPatRebound)
	fmt.Fprintf(m.out, "SEND_WITH_INV received: invalidated rkey 0x%08x, wc_flags %#x\n", wc.InvalidatedRKey, uint8(wc.Flags))
	verdict := "ok"
	if len(m.problems) > 0 {
		verdict = "bad"
	}
	if err := m.send("RV2MW5 %s", verdict); err != nil {
		return err
	}

	if _, err := m.recv("RV2MW6 ok"); err != nil {
		return err
	}
	m.check("type 2 window after the refused WRITE", m.slot(1), mwPatRebound)
	if st := m.qp.State(); st != transport.QPSErr {
		m.problems = append(m.problems, fmt.Sprintf("QP state %v after the remote access error, want ERR", st))
	}
	verdict = "ok\n\x00"
	if len(m.problems) > 0 {
		verdict = "bad\x00"
	}
	m.conn.Write([]byte(verdict))
	fmt.Fprintf(m.out, "memory windows (responder, rkeys 0x%08x 0x%08x 0x%08x): bind type 1, bind type 2, LOCAL_INV, rebind, SEND_WITH_INV, remote access error: %s\n",
		rkey1, rkey2, rkey2b, map[bool]string{true: "ok", false: "MISMATCH"}[len(m.problems) == 0])
	return nil
}

// rdma posts a signalled READ or WRITE of slot i (its first n bytes) at
// va through rkey.
func (m *mwSide) rdma(wrid uint64, op transport.WROpcode, i, n int, rkey uint32, va uint64) error {
	return m.qp.PostSend(transport.SendWR{WRID: wrid, Opcode: op, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{m.mr.SGE(uint64(i*m.n), uint32(n))}, RemoteAddr: va, RKey: rkey})
}

// user is the client of -o mw: the requester, through the peer's windows.
// Slots 0 and 1 take the READs; slots 2..6 hold patterns 3..7.
func (m *mwSide) user() error {
	msg, err := m.recv("RV2MW1 ")
	if err != nil {
		return err
	}
	var rkey1, rkey2, rkey2b uint32
	var va1, va2 uint64
	var n int
	if k, err := fmt.Sscanf(msg, "RV2MW1 %x %x %x %x %x", &rkey1, &va1, &rkey2, &va2, &n); k != 5 || n != m.n {
		return fmt.Errorf("window message %q (want length %#x): %v", msg, m.n, err)
	}
	fmt.Fprintf(m.out, "windows: type 1 rkey 0x%08x va 0x%016x, type 2 rkey 0x%08x va 0x%016x, length %d\n", rkey1, va1, rkey2, va2, n)
	for pat := mwPatWrite1; pat <= mwPatForbidden; pat++ {
		m.fill(pat-1, pat)
	}
	for _, r := range []struct {
		wrid uint64
		op   transport.WROpcode
		slot int
		rkey uint32
		va   uint64
	}{
		{1, transport.WRRead, 0, rkey1, va1},
		{2, transport.WRRead, 1, rkey2, va2},
		{3, transport.WRWrite, 2, rkey1, va1},
		{4, transport.WRWrite, 3, rkey2, va2},
	} {
		if err := m.rdma(r.wrid, r.op, r.slot, m.n, r.rkey, r.va); err != nil {
			return err
		}
	}
	for _, e := range []struct {
		what string
		wrid uint64
		op   transport.WCOpcode
	}{
		{"READ through the type 1 window", 1, transport.WCRDMARead},
		{"READ through the type 2 window", 2, transport.WCRDMARead},
		{"WRITE through the type 1 window", 3, transport.WCRDMAWrite},
		{"WRITE through the type 2 window", 4, transport.WCRDMAWrite},
	} {
		if err := m.expect(e.what, e.wrid, e.op); err != nil {
			return err
		}
	}
	m.check("READ through the type 1 window", m.slot(0), mwPatWin1)
	m.check("READ through the type 2 window", m.slot(1), mwPatWin2)
	verdict := "ok"
	if len(m.problems) > 0 {
		verdict = "bad"
	}
	if err := m.send("RV2MW2 %s", verdict); err != nil {
		return err
	}

	if msg, err = m.recv("RV2MW3 "); err != nil {
		return err
	}
	if _, err := fmt.Sscanf(msg, "RV2MW3 %x", &rkey2b); err != nil {
		return fmt.Errorf("message %q: %w", msg, err)
	}
	if err := m.rdma(5, transport.WRWrite, mwPatRebound-1, m.n, rkey2b, va2); err != nil {
		return err
	}
	if err := m.qp.PostSend(transport.SendWR{WRID: 6, Opcode: transport.WRSendInv, Flags: transport.SendSignaled,
		SGEs: m.sge(mwPatSendInv - 1), InvRKey: rkey2b}); err != nil {
		return err
	}
	if err := m.expect("WRITE through the rebound type 2 window", 5, transport.WCRDMAWrite); err != nil {
		return err
	}
	if err := m.expect("SEND_WITH_INV", 6, transport.WCSend); err != nil {
		return err
	}
	if _, err := m.recv("RV2MW5 ok"); err != nil {
		return err
	}

	if err := m.rdma(7, transport.WRWrite, mwPatForbidden-1, min(m.n, mwRefusedLen), rkey2b, va2); err != nil {
		return err
	}
	wc, err := m.next()
	if err != nil {
		return fmt.Errorf("WRITE after the invalidate: %w", err)
	}
	fmt.Fprintf(m.out, "WRITE through the invalidated rkey 0x%08x: %v\n", rkey2b, wc.Status)
	if wc.WRID != 7 || wc.Status != transport.WCRemAccessErr {
		m.problems = append(m.problems, fmt.Sprintf("WRITE after the invalidate: wr_id %d status %v, want 7 and %v", wc.WRID, wc.Status, transport.WCRemAccessErr))
	}
	verdict = "ok"
	if len(m.problems) > 0 {
		verdict = "bad"
	}
	if err := m.send("RV2MW6 %s", verdict); err != nil {
		return err
	}
	res := make([]byte, 4)
	if _, err := io.ReadFull(m.conn, res); err != nil {
		return fmt.Errorf("reading rv2imm's verdict: %w", err)
	}
	v := strings.TrimRight(string(res), "\x00\n")
	if !strings.HasPrefix(v, "ok") {
		m.problems = append(m.problems, "rv2imm (the window owner) reports a mismatch")
	}
	fmt.Fprintf(m.out, "memory windows (requester, rkeys 0x%08x 0x%08x 0x%08x): READ+WRITE type 1, READ+WRITE type 2, WRITE after rebind, SEND_WITH_INV, WRITE refused (%v); server says %s: %s\n",
		rkey1, rkey2, rkey2b, wc.Status, v, map[bool]string{true: "ok", false: "MISMATCH"}[len(m.problems) == 0])
	return nil
}

// reMWResult matches the last line of either side of an -o mw run that
// found nothing wrong (rv2imm's and mwSide's are the same).
var reMWResult = regexp.MustCompile(`(?m)^memory windows \((requester|responder), rkeys 0x[0-9a-f]{8} 0x[0-9a-f]{8} 0x[0-9a-f]{8}\): .*: ok$`)
