package transport

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// tapLink records every packet sent through it; with silent set it drops
// them instead of forwarding.
type tapLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	mu       sync.Mutex
	silent   bool
	pkts     [][]byte
}

func (l *tapLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	for _, p := range pkts {
		l.pkts = append(l.pkts, bytes.Clone(p.Buf))
	}
	silent := l.silent
	l.mu.Unlock()
	if silent {
		return nil
	}
	return l.Link.Send(pkts)
}

func (l *tapLink) sent() []packet.Packet {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]packet.Packet, len(l.pkts))
	for i, b := range l.pkts {
		if err := out[i].Parse(b); err != nil {
			panic(err)
		}
	}
	return out
}

// tapPair connects a (sending through a tapLink) with b.
func tapPair(t *testing.T, o pairOpts, silent bool) (a, b *side, tap *tapLink) {
	t.Helper()
	o.defaults()
	n := memnet.NewMemNetwork(o.faults)
	la, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	tap = &tapLink{Wrap: udp.Wrap{Link: la}, silent: silent}
	a = sideOn(t, tap, &o)
	b = newSide(t, n, addrB, &o)
	connect(t, a, b, addrB, 0xfffffe, 0x10, &o)
	connect(t, b, a, addrA, 0x10, 0xfffffe, &o)
	return a, b, tap
}

// TestWireSegmentation checks a multi-packet WRITE on the wire: opcodes,
// consecutive PSNs across the 24-bit wrap, RETH only on the first packet,
// payload sizes, AckReq on every 64th and on the last packet.
func TestWireSegmentation(t *testing.T) {
	a, b, tap := tapPair(t, pairOpts{mtu: MTU256}, false)
	const size = 100*256 - 10
	src, smr := a.buffer(t, size, 0)
	fill(src, 3)
	dst, dmr := b.buffer(t, size, memreg.AccessRemoteWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, 1, 5*time.Second)
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	pk := tap.sent()
	if len(pk) != 100 {
		t.Fatalf("%d packets, want 100", len(pk))
	}
	for i, p := range pk {
		wantOp := bth.RCWriteMiddle
		switch i {
		case 0:
			wantOp = bth.RCWriteFirst
		case 99:
			wantOp = bth.RCWriteLast
		}
		if p.BTH.Opcode() != wantOp || p.BTH.PSN() != bth.PSN(0xfffffe).Add(i) || p.BTH.DestQP() != b.qp.QPN() {
			t.Fatalf("packet %d: %v psn %v", i, p.BTH.Opcode(), p.BTH.PSN())
		}
		if (p.RETH != nil) != (i == 0) || i == 0 && p.RETH.DMALength() != size {
			t.Fatalf("packet %d: RETH %v", i, p.RETH)
		}
		wantLen := 256
		if i == 99 {
			wantLen = 246
		}
		if len(p.Payload) != wantLen || p.BTH.PadCount() != bth.PadFor(wantLen) {
			t.Fatalf("packet %d: payload %d pad %d", i, len(p.Payload), p.BTH.PadCount())
		}
		if want := i == 63 || i == 99; p.BTH.AckReq() != want {
			t.Fatalf("packet %d: AckReq %v", i, p.BTH.AckReq())
		}
	}
}

// TestWireWindow: against a silent peer the requester sends at most
// MaxUnackedPSNs PSNs.
func TestWireWindow(t *testing.T) {
	for _, w := range []int{0, 16} {
		a, _, tap := tapPair(t, pairOpts{mtu: MTU256, clock: manual(), window: w}, true)
		_, smr := a.buffer(t, 1<<20, 0)
		if err := a.qp.PostSend(SendWR{Opcode: WRWrite, SGEs: sge(smr, 0, 1<<20), RemoteAddr: 0x1000, RKey: 5}); err != nil {
			t.Fatal(err)
		}
		want := w
		if w == 0 {
			want = 128
		}
		if n := len(tap.sent()); n != want {
			t.Fatalf("window %d: sent %d packets, want %d", w, n, want)
		}
	}
}

// TestWireSmallWindow: against a silent peer, packets of at most
// SmallPacketPayload bytes go while fewer than MaxUnackedSmallPSNs PSNs
// are unacknowledged (default 4 × MaxUnackedPSNs, -1: MaxUnackedPSNs);
// a bigger packet behind them waits for MaxUnackedPSNs.
func TestWireSmallWindow(t *testing.T) {
	cases := []struct {
		name          string
		window, small int
		sizes         []int // WRITE sizes, posted in order
		want          int   // packets sent
	}{
		{"default 64 B", 0, 0, rep(64, 600), 512},
		{"off", 0, -1, rep(64, 600), 128},
		{"window 16", 16, 0, rep(64, 100), 64},
		{"set 300", 0, 300, rep(64, 600), 300},
		{"128 B is small", 0, 0, rep(128, 600), 512},
		{"129 B is not", 0, 0, rep(129, 600), 128},
		{"big waits behind small", 0, 0, append(rep(64, 200), 1000, 64), 200},
		{"small last packet", 0, 0, append(rep(1024+64, 100), 64), 128},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, _, tap := tapPair(t, pairOpts{mtu: MTU1024, clock: manual(), window: c.window, small: c.small, sqDepth: 1024}, true)
			_, smr := a.buffer(t, 1<<16, 0)
			for i, n := range c.sizes {
				if err := a.qp.PostSend(SendWR{Opcode: WRWrite, SGEs: sge(smr, 0, n), RemoteAddr: 0x1000, RKey: 5}); err != nil {
					t.Fatalf("WR %d: %v", i, err)
				}
			}
			if n := len(tap.sent()); n != c.want {
				t.Fatalf("sent %d packets, want %d", n, c.want)
			}
		})
	}
	l, err := memnet.NewMemNetwork(memnet.Faults{}).Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := NewDevice(l, DeviceConfig{MaxUnackedSmallPSNs: 1<<22 + 1}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxUnackedSmallPSNs") {
		t.Fatalf("MaxUnackedSmallPSNs 2^22+1: %v", err)
	}
}

// rep returns n copies of v.
func rep(v, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// TestWireReadAtomicLimit: at most max_rd_atomic READ/atomic requests are
// outstanding; a fenced WR waits for them; a READ request consumes one PSN
// per response packet.
func TestWireReadAtomicLimit(t *testing.T) {
	a, _, tap := tapPair(t, pairOpts{mtu: MTU1024, clock: manual(), maxRd: 2}, true)
	_, mr := a.buffer(t, 1<<16, 0)
	for i := 0; i < 3; i++ {
		if err := a.qp.PostSend(SendWR{Opcode: WRRead, SGEs: sge(mr, i*5000, 5000), RemoteAddr: 0x1000, RKey: 5}); err != nil {
			t.Fatal(err)
		}
	}
	pk := tap.sent()
	if len(pk) != 2 || pk[0].BTH.PSN() != 0xfffffe || pk[1].BTH.PSN() != bth.PSN(0xfffffe).Add(5) {
		t.Fatalf("%d packets", len(pk))
	}
	if !pk[0].BTH.AckReq() || pk[0].RETH.DMALength() != 5000 {
		t.Fatal("READ request without AckReq or wrong length")
	}

	// The READ's response takes 50 ms, so the check below sees the
	// fenced WRITE still waiting however loaded the machine is.
	a, b, tap := tapPair(t, pairOpts{mtu: MTU1024, timeout: 18, retry: 3, faults: memnet.Faults{Delay: 50 * time.Millisecond}}, false)
	_, lmr := a.buffer(t, 64, 0)
	_, rmr := b.buffer(t, 64, memreg.AccessRemoteRead|memreg.AccessRemoteWrite)
	if err := a.qp.PostSend(
		SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{WRID: 2, Opcode: WRWrite, Flags: SendSignaled | SendFence, SGEs: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA() + 8, RKey: rmr.RKey()},
	); err != nil {
		t.Fatal(err)
	}
	if n := len(tap.sent()); n != 1 {
		t.Fatalf("fenced WRITE went out before the READ completed (%d packets)", n)
	}
	wcs := waitWC(t, a.scq, 2, 5*time.Second)
	if wcs[0].WRID != 1 || wcs[1].WRID != 2 || wcs[1].Status != WCSuccess {
		t.Fatalf("%+v", wcs)
	}
}

// TestUnsignaled: only signaled WRs complete (unless SigAll); completions
// come in posting order.
func TestUnsignaled(t *testing.T) {
	a, b, tap := tapPair(t, pairOpts{}, false)
	_, smr := a.buffer(t, 64, 0)
	_, dmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	if err := b.qp.PostRecv(RecvWR{WRID: 50, SGEs: sge(dmr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(
		SendWR{WRID: 1, Opcode: WRWrite, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		SendWR{WRID: 2, Opcode: WRWrite, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		SendWR{WRID: 3, Opcode: WRSend, Flags: SendSignaled | SendSolicited, SGEs: sge(smr, 0, 8)},
	); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 1, 5*time.Second)
	if wcs[0].WRID != 3 {
		t.Fatalf("%+v", wcs)
	}
	waitWC(t, b.rcq, 1, 5*time.Second)
	time.Sleep(10 * time.Millisecond)
	noWC(t, a.scq)
	pk := tap.sent()
	if !pk[2].BTH.SolicitedEvent() || pk[0].BTH.SolicitedEvent() {
		t.Fatal("solicited event bit")
	}
}

// TestDuplicateWriteReACK: a duplicated WRITE is re-acknowledged with the
// PSN before the expected one and not written twice (counted).
func TestDuplicateRequestsReplay(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{faults: memnet.Faults{Dup: 1, Seed: 1}})
	_, smr := a.buffer(t, 64, 0)
	target, tmr := b.buffer(t, 64, memreg.AccessRemoteWrite|memreg.AccessRemoteAtomic|memreg.AccessRemoteRead)
	for i := 0; i < 10; i++ {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRFetchAdd, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: tmr.IOVA(), RKey: tmr.RKey(), CompareAdd: 1}); err != nil {
			t.Fatal(err)
		}
	}
	wcs := waitWC(t, a.scq, 10, 5*time.Second)
	for i, wc := range wcs {
		if wc.WRID != uint64(i) || wc.Status != WCSuccess {
			t.Fatalf("%+v", wc)
		}
	}
	if got := nativeGet(target); got != 10 {
		t.Fatalf("counter %d after 10 fetch-adds with every packet duplicated", got)
	}
	if c := b.dev.Counters(); c.DuplicateRequest < 10 {
		t.Fatalf("duplicate_request %d", c.DuplicateRequest)
	}
}

// TestSQDrain: in SQD no new WR starts; back in RTS the queued WR goes out.
func TestSQDrain(t *testing.T) {
	a, b, tap := tapPair(t, pairOpts{}, false)
	_, smr := a.buffer(t, 64, 0)
	_, dmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	if err := a.qp.Modify(&QPAttr{State: QPSSQD}, AttrState); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if n := len(tap.sent()); n != 0 {
		t.Fatalf("%d packets sent in SQD", n)
	}
	if err := a.qp.Modify(&QPAttr{State: QPSRTS}, AttrState); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != 1 {
		t.Fatalf("%+v", wc)
	}
}

// TestCountersList: the counters list with rxe's names.
func TestCountersList(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	l := a.dev.Counters().List()
	want := []string{"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err", "send_rnr_err",
		"rcvd_seq_err", "ack_deferred", "retry_exceeded_err", "retry_rnr_exceeded_err", "completer_retry_err"}
	for i, w := range want {
		if l[i].Name != w {
			t.Fatalf("counter %d is %q, want %q", i, l[i].Name, w)
		}
	}
	if g := a.dev.GID(); g[10] != 0xff || g[11] != 0xff || g[12] != 192 || g[15] != 1 {
		t.Fatalf("GID % x", g)
	}
}
