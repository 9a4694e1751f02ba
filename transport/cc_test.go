package transport

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/dcqcn"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// tapped is what a MemNetwork tap saw.
type tapped struct {
	src     netip.Addr
	tos     uint8
	payload []byte
}

type tapLog struct {
	mu   sync.Mutex
	pkts []tapped
}

func (l *tapLog) tap(src, dst netip.Addr, port uint16, tos uint8, payload []byte) {
	l.mu.Lock()
	l.pkts = append(l.pkts, tapped{src, tos, bytes.Clone(payload)})
	l.mu.Unlock()
}

func (l *tapLog) snapshot() []tapped {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]tapped(nil), l.pkts...)
}

// count returns how many packets from src had opcode op.
func (l *tapLog) count(src netip.Addr, op bth.Opcode) int {
	n := 0
	for _, p := range l.snapshot() {
		if p.src == src && bth.BTH(p.payload).Opcode() == op {
			n++
		}
	}
	return n
}

// writeN posts n signaled WRITEs of size bytes from a to b and waits for them.
func writeN(t *testing.T, a, b *side, n, size int) {
	t.Helper()
	_, lmr := a.buffer(t, size, 0)
	_, rmr := b.buffer(t, size, memreg.AccessRemoteWrite)
	for i := 0; i < n; i++ {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(lmr, 0, size),
			RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, wc := range waitWC(t, a.scq, n, 10*time.Second) {
		if wc.Status != WCSuccess {
			t.Fatalf("WRITE completed with %v", wc.Status)
		}
	}
}

func TestECNCodepoint(t *testing.T) {
	for _, tc := range []struct {
		mode ECNMode
		want uint8
	}{{ECNDefault, udp.ECNECT0}, {ECNECT0, udp.ECNECT0}, {ECNECT1, udp.ECNECT1}, {ECNNotECT, udp.ECNNotECT}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			a, b, n := newPair(t, pairOpts{retry: 7, cc: CongestionConfig{ECN: tc.mode}})
			var log tapLog
			n.SetTap(log.tap)
			writeN(t, a, b, 3, 3000)
			pkts := log.snapshot()
			if len(pkts) < 4 {
				t.Fatalf("tap saw %d packets", len(pkts))
			}
			for _, p := range pkts {
				if p.tos&udp.ECNMask != tc.want {
					t.Fatalf("%v packet from %v with TOS %#x, want ECN %d", bth.BTH(p.payload).Opcode(), p.src, p.tos, tc.want)
				}
			}
		})
	}
}

// TestCNPWire: a CE-marked WRITE makes the responder send a CNP whose
// bytes are what Annex A17 and ConnectX NICs send, and the requester's
// reaction point takes it.
func TestCNPWire(t *testing.T) {
	a, b, n := newPair(t, pairOpts{retry: 7, faults: memnet.Faults{CEMark: 1, Seed: 1}})
	var log tapLog
	n.SetTap(log.tap)
	writeN(t, a, b, 1, 100)
	deadline := time.Now().Add(5 * time.Second)
	for a.dev.Counters().RPCNPHandled == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var cnp *tapped
	for _, p := range log.snapshot() {
		if p.src == addrB && bth.BTH(p.payload).Opcode() == bth.CNP {
			cnp = &p
			break
		}
	}
	if cnp == nil {
		t.Fatalf("no CNP from the responder; counters %+v", b.dev.Counters())
	}
	want := make([]byte, 12+16)
	copy(want, []byte{0x81, 0x00, 0xff, 0xff, 0x40})
	want[5], want[6], want[7] = byte(a.qp.QPN()>>16), byte(a.qp.QPN()>>8), byte(a.qp.QPN())
	if len(cnp.payload) != 12+16+4 || !bytes.Equal(cnp.payload[:28], want) {
		t.Fatalf("CNP % x, want % x + ICRC", cnp.payload, want)
	}
	if cnp.tos != 48<<2 {
		t.Fatalf("CNP TOS %#x, want DSCP 48 Not-ECT (0xc0)", cnp.tos)
	}
	bc, ac := b.dev.Counters(), a.dev.Counters()
	if bc.NPECNMarkedRocePackets == 0 || bc.NPCNPSent == 0 {
		t.Fatalf("responder counters: marked %d cnp_sent %d", bc.NPECNMarkedRocePackets, bc.NPCNPSent)
	}
	if ac.RPCNPHandled == 0 || ac.RPCNPIgnored != 0 {
		t.Fatalf("requester counters: handled %d ignored %d", ac.RPCNPHandled, ac.RPCNPIgnored)
	}
	st := a.qp.Congestion()
	if !st.Limited || st.Cuts == 0 || st.Rate >= dcqcn.DefaultLineRate {
		t.Fatalf("requester not rate limited after a CNP: %+v", st)
	}
	var names []string
	for _, c := range ac.List() {
		names = append(names, c.Name)
	}
	for _, want := range []string{"np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored"} {
		if !bytes.Contains([]byte(" "+joinNames(names)+" "), []byte(" "+want+" ")) {
			t.Errorf("counter %s missing from List", want)
		}
	}
}

func joinNames(n []string) string {
	var b bytes.Buffer
	for i, s := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s)
	}
	return b.String()
}

// TestNPRateLimit: CE-marked packets arriving at one instant get one CNP;
// the next one goes once CNPInterval has passed (ManualClock).
func TestNPRateLimit(t *testing.T) {
	clk := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, b, _ := newPair(t, pairOpts{clock: clk, faults: memnet.Faults{CEMark: 1, Seed: 2},
		cc: CongestionConfig{CNPInterval: 50 * time.Microsecond}})
	step := func(advance time.Duration, wantCNPs uint64) {
		t.Helper()
		clk.Advance(advance)
		writeN(t, a, b, 10, 200)
		c := b.dev.Counters()
		if c.NPCNPSent != wantCNPs {
			t.Fatalf("after %v more: np_cnp_sent %d, want %d (marked %d)", advance, c.NPCNPSent, wantCNPs, c.NPECNMarkedRocePackets)
		}
	}
	step(0, 1)
	step(49*time.Microsecond, 1)
	step(time.Microsecond, 2)
	step(time.Millisecond, 3)
	if c := b.dev.Counters(); c.NPECNMarkedRocePackets != 40 {
		t.Fatalf("np_ecn_marked_roce_packets %d, want 40", c.NPECNMarkedRocePackets)
	}
}

func TestNPDisabled(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{retry: 7, faults: memnet.Faults{CEMark: 1, Seed: 3}, cc: CongestionConfig{DisableNP: true}})
	writeN(t, a, b, 5, 200)
	if c := b.dev.Counters(); c.NPECNMarkedRocePackets != 5 || c.NPCNPSent != 0 {
		t.Fatalf("marked %d cnp_sent %d, want 5 and 0", c.NPECNMarkedRocePackets, c.NPCNPSent)
	}
}

// cnpFrom builds the CNP a peer at src would send to qpn.
func cnpTo(qpn uint32) []byte {
	b := make([]byte, 12+16+4)
	copy(b, []byte{0x81, 0x00, 0xff, 0xff, 0x40})
	binary.BigEndian.PutUint32(b[4:8], 0x40<<24|qpn)
	return b
}

func TestCNPIgnored(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{cc: CongestionConfig{DCQCN: dcqcn.Config{Disable: true}}})
	if err := a.dev.HandlePacket(cnpTo(a.qp.QPN()), addrB); err != nil {
		t.Fatal(err)
	}
	if c := a.dev.Counters(); c.RPCNPIgnored != 1 || c.RPCNPHandled != 0 {
		t.Fatalf("DCQCN off: handled %d ignored %d", c.RPCNPHandled, c.RPCNPIgnored)
	}
	if a.qp.Congestion().Limited {
		t.Fatal("DCQCN off but the QP is limited")
	}
	// On: a CNP from an address other than the peer is ignored too.
	c, _, _ := newPair(t, pairOpts{})
	if err := c.dev.HandlePacket(cnpTo(c.qp.QPN()), netip.MustParseAddr("192.0.2.99")); err != nil {
		t.Fatal(err)
	}
	if err := c.dev.HandlePacket(cnpTo(c.qp.QPN()), addrB); err != nil {
		t.Fatal(err)
	}
	if cc := c.dev.Counters(); cc.RPCNPIgnored != 1 || cc.RPCNPHandled != 1 {
		t.Fatalf("handled %d ignored %d, want 1 and 1", cc.RPCNPHandled, cc.RPCNPIgnored)
	}
}

// TestPacing: after a CNP sets the rate to 100 Mb/s, the requester sends a
// 64 KiB WRITE at that rate in virtual time: at each instant it has sent
// no more than the rate allows plus the burst, and no less than the rate
// allows minus one packet.
func TestPacing(t *testing.T) {
	clk := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	const rate = 100e6
	a, b, n := newPair(t, pairOpts{clock: clk, cc: CongestionConfig{DCQCN: dcqcn.Config{
		LineRate: 10e9, RateOnFirstCNP: rate, TimeReset: time.Hour, ByteReset: -1}}})
	var log tapLog
	n.SetTap(log.tap)
	if err := a.dev.HandlePacket(cnpTo(a.qp.QPN()), addrB); err != nil {
		t.Fatal(err)
	}
	if st := a.qp.Congestion(); !st.Limited || st.Rate != rate {
		t.Fatalf("after the CNP: %+v", st)
	}
	const size = 64 << 10
	_, lmr := a.buffer(t, size, 0)
	_, rmr := b.buffer(t, size, memreg.AccessRemoteWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(lmr, 0, size),
		RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	sent := func() (pkts, total int) {
		for _, p := range log.snapshot() {
			if p.src == addrA && bth.BTH(p.payload).Opcode().Info().Request {
				pkts++
				total += len(p.payload) + 28
			}
		}
		return pkts, total
	}
	const pkt = 1024 + 12 + 4 + 28
	burst := int(rate * float64(dcqcn.DefaultBurst) / 1e9 / 8)
	step := 37 * time.Microsecond
	var elapsed time.Duration
	for i := 0; i < 400; i++ {
		if n, _ := sent(); n == size/1024 {
			break
		}
		clk.Advance(step)
		elapsed += step
		n, got := sent()
		allowed := int(rate * elapsed.Seconds() / 8)
		if got > allowed+burst+2*pkt || got < allowed-2*pkt && n < size/1024 {
			t.Fatalf("at %v: %d bytes sent, the rate allows %d (burst %d)", elapsed, got, allowed, burst)
		}
	}
	waitWC(t, a.scq, 1, 5*time.Second)
	if elapsed < 5*time.Millisecond {
		t.Fatalf("64 KiB at 100 Mb/s took %v of virtual time, want ≥ 5.2 ms", elapsed)
	}
}
