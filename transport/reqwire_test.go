package transport

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// wireLogLink records every packet a device sends, a zero-copy packet's
// payload put in place (Buf[:PayloadAt()] + Payload + Buf[PayloadAt():]),
// into a hash and, when dump is set, as text; it sends nothing (a silent
// peer). zc makes it a zero-copy link.
type wireLogLink struct {
	udp.Wrap
	zc   bool
	mu   sync.Mutex
	h    hash.Hash
	dump *strings.Builder
}

func (l *wireLogLink) Capabilities() udp.Capabilities {
	c := udp.CapabilitiesOf(l.Link) &^ udp.CapZeroCopy
	if l.zc {
		c |= udp.CapZeroCopy
	}
	return c
}

func (l *wireLogLink) ZeroCopy() bool { return l.zc }

func (l *wireLogLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pkts {
		b := p.Buf
		if p.Payload != nil {
			at := p.PayloadAt()
			b = append(append(append([]byte(nil), p.Buf[:at]...), p.Payload...), p.Buf[at:]...)
		}
		line := fmt.Sprintf("%s %x zc=%v\n", p.Addr, b, p.Payload != nil)
		l.h.Write([]byte(line))
		if l.dump != nil {
			l.dump.WriteString(line)
		}
	}
	return nil
}

// TestRequestWire pins the bytes of every request packet the requester
// builds — sendData writes SEND and WRITE headers itself, READ and atomic
// requests go through packet.Build — against those of main at d84258b,
// before the send side's per-message trims (session 29): every opcode
// (immediate, invalidate), lengths 0 to 5 (pad 0-3), MTU-1, MTU, MTU+1,
// 2×MTU+3, 1023 to 5000 (zero-copy from 1024 on a zero-copy link), a
// two-SGE gather list, flags SIGNALED, SOLICITED, NoAckReq and FENCE, RC,
// UC and RC with selective repeat, MTU 256 and 4096, with and without a
// zero-copy link, and three rounds of retransmissions to a silent peer
// (ManualClock: the packets and their order are deterministic). A digest
// per case; ROCEV2_REQWIRE_DUMP=file writes the packets for a diff
// against the old commit's.
func TestRequestWire(t *testing.T) {
	// Computed at d84258b; unchanged since.
	want := map[string]string{
		"RC/mtu256/zc=false":     "34b5a36a416e8fe468794b2d70f3dbbaf1aee81181adc88646df34690f3793a4",
		"RC/mtu256/zc=true":      "34b5a36a416e8fe468794b2d70f3dbbaf1aee81181adc88646df34690f3793a4",
		"RC/mtu4096/zc=false":    "629545df67cec550ab0e6f83252216697d16df206b409d9a46c36cc0f2486e08",
		"RC/mtu4096/zc=true":     "45ab28f600a572f9327f028bb8bfb10762c751aad3a4a1b7a28c55abf440812b",
		"UC/mtu256/zc=false":     "702d6df3ed13e90b8140d55870fa03a0696df2687145fb8356814907c3ca3f3e",
		"UC/mtu256/zc=true":      "702d6df3ed13e90b8140d55870fa03a0696df2687145fb8356814907c3ca3f3e",
		"UC/mtu4096/zc=false":    "09882a7171595da7faab26dcbf2a30b1c29b7a1f8e62e30b1b683c965d2a74e5",
		"UC/mtu4096/zc=true":     "09882a7171595da7faab26dcbf2a30b1c29b7a1f8e62e30b1b683c965d2a74e5",
		"RC-SR/mtu256/zc=false":  "79257f2d28d33eaae066c00595d7adcd90264b7d7cce241730ed29ee4314f391",
		"RC-SR/mtu256/zc=true":   "79257f2d28d33eaae066c00595d7adcd90264b7d7cce241730ed29ee4314f391",
		"RC-SR/mtu4096/zc=false": "84c555de0a8486ea1587e721607401fc4056b59eb0f8692353056fff2f54b374",
		"RC-SR/mtu4096/zc=true":  "36435bccfedd5db8caf368cc7a398fc907fb6d8aa24ffe79df81674c7dc03a13",
	}
	var dumpAll strings.Builder
	dumpFile := os.Getenv("ROCEV2_REQWIRE_DUMP")
	for _, kind := range []string{"RC", "UC", "RC-SR"} {
		for _, mtu := range []MTU{MTU256, MTU4096} {
			for _, zc := range []bool{false, true} {
				name := fmt.Sprintf("%s/mtu%d/zc=%v", kind, mtu.Bytes(), zc)
				l := &wireLogLink{zc: zc, h: sha256.New()}
				if dumpFile != "" {
					l.dump = &dumpAll
					fmt.Fprintf(&dumpAll, "== %s\n", name)
				}
				requestWireCase(t, l, kind, mtu)
				got := fmt.Sprintf("%x", l.h.Sum(nil))
				if w, ok := want[name]; !ok || got != w {
					t.Errorf("%s: request packets digest %s, want %s", name, got, w)
				}
			}
		}
	}
	if dumpFile != "" {
		if err := os.WriteFile(dumpFile, []byte(dumpAll.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func requestWireCase(t *testing.T, l *wireLogLink, kind string, mtu MTU) {
	t.Helper()
	ml, err := memnet.NewMemNetwork(memnet.Faults{}).Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	l.Wrap = udp.Wrap{Link: ml}
	clk := manual()
	dev, err := NewDevice(l, DeviceConfig{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(4096)
	src := make([]byte, 1<<16)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	mr, err := pd.RegisterMR(src, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	typ := QPTypeRC
	if kind == "UC" {
		typ = QPTypeUC
	}
	ops := []WROpcode{WRSend, WRSendImm, WRWrite, WRWriteImm}
	if typ == QPTypeRC {
		ops = append(ops, WRSendInv, WRRead, WRCompareSwap, WRFetchAdd)
	}
	m := mtu.Bytes()
	lens := []int{0, 1, 2, 3, 4, 5, m - 1, m, m + 1, 2*m + 3, 1023, 1024, 1500, 5000}
	for oi, op := range ops {
		for fi, fl := range []SendFlags{SendSignaled, SendSignaled | SendSolicited, SendNoAckReq, SendFence | SendSignaled} {
			qp, err := dev.CreateQP(pd, QPInitAttr{Type: typ, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 4, MaxSGE: 4})
			if err != nil {
				t.Fatal(err)
			}
			if err := qp.Connect(ConnParams{Peer: addrB, DestQPN: 0x77 + uint32(oi*8+fi), RQPSN: 5, SQPSN: 0xfffff0, PathMTU: mtu,
				MaxRdAtomic: 16, MaxDestRdAtomic: 16, Retry: &Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 7},
				SelectiveRepeat: kind == "RC-SR"}); err != nil {
				t.Fatal(err)
			}
			for li, n := range lens {
				off := uint64(li * 3000)
				sges := []memreg.SGE{{Addr: mr.IOVA() + off, Length: uint32(n), LKey: mr.LKey()}}
				if op == WRCompareSwap || op == WRFetchAdd {
					sges[0].Length = 8
				} else if n >= 2 {
					h := n / 2
					sges = []memreg.SGE{{Addr: mr.IOVA() + off, Length: uint32(h), LKey: mr.LKey()},
						{Addr: mr.IOVA() + off + uint64(h) + 17, Length: uint32(n - h), LKey: mr.LKey()}}
				}
				wr := SendWR{WRID: uint64(li), Opcode: op, Flags: fl, SGEs: sges, RemoteAddr: 0x1000_0000 + uint64(li)*0x10008,
					RKey: 0xabc00 + uint32(li), Imm: 0x11223300 + uint32(li), InvRKey: 0x55667700 + uint32(li),
					CompareAdd: 0x0102030405060708 + uint64(li), Swap: 0x1112131415161718}
				if err := qp.PostSend(wr); err != nil {
					t.Fatalf("%v %v length %d: %v", op, fl, n, err)
				}
			}
		}
	}
	// No ACK comes: the RC QPs resend from their oldest PSN.
	for range 3 {
		clk.Advance(200 * time.Millisecond)
	}
}
