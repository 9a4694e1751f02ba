package transport

import (
	"bytes"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
)

// TestSendNoAckReq: a WRITE flagged SendNoAckReq leaves its last packet
// without AckReq only when a WRITE or SEND is posted right behind it (the
// response of an NVMe-oF read); alone, or followed by a READ, it asks as
// usual. Every request completes and the data arrives either way.
func TestSendNoAckReq(t *testing.T) {
	cases := []struct {
		name string
		next string // what is posted behind the WRITE

		wantReq bool // AckReq in the WRITE's last packet
	}{
		{"send behind", "send", false},
		{"write behind", "write", false},
		{"alone", "", true},
		{"read behind", "read", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b, tap := tapPair(t, pairOpts{mtu: MTU1024}, false)
			const size = 4096
			src, smr := a.buffer(t, 2*size, 0)
			fill(src, 9)
			dst, dmr := b.buffer(t, 2*size, memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
			fill(dst[size:], 10)
			_, rmr := b.buffer(t, 64, 0)
			if err := b.qp.PostRecv(RecvWR{WRID: 7, SGEs: sge(rmr, 0, 64)}); err != nil {
				t.Fatal(err)
			}
			wrs := []SendWR{{WRID: 1, Opcode: WRWrite, Flags: SendSignaled | SendNoAckReq, SGEs: sge(smr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}}
			switch c.next {
			case "send":
				wrs = append(wrs, SendWR{WRID: 2, Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, 16)})
			case "write":
				wrs = append(wrs, SendWR{WRID: 2, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, size, 16), RemoteAddr: dmr.IOVA() + size, RKey: dmr.RKey()})
			case "read":
				wrs = append(wrs, SendWR{WRID: 2, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, size, 16), RemoteAddr: dmr.IOVA() + size, RKey: dmr.RKey()})
			}
			if err := a.qp.PostSend(wrs...); err != nil {
				t.Fatal(err)
			}
			for _, wc := range waitWC(t, a.scq, len(wrs), 5*time.Second) {
				if wc.Status != WCSuccess {
					t.Fatalf("completion %+v", wc)
				}
			}
			if !bytes.Equal(dst[:size], src[:size]) {
				t.Fatal("WRITE data differs")
			}
			if c.next == "read" && !bytes.Equal(src[size:size+16], dst[size:size+16]) {
				t.Fatal("READ data differs")
			}
			pk := tap.sent()
			if len(pk) < 4 {
				t.Fatalf("%d packets sent", len(pk))
			}
			if p := pk[3]; p.BTH.Opcode() != bth.RCWriteLast || p.BTH.AckReq() != c.wantReq {
				t.Fatalf("WRITE's last packet: %v AckReq %v, want AckReq %v", p.BTH.Opcode(), p.BTH.AckReq(), c.wantReq)
			}
			for i, p := range pk[4:] {
				if !p.BTH.AckReq() {
					t.Fatalf("packet %d behind the WRITE (%v) without AckReq", 4+i, p.BTH.Opcode())
				}
			}
		})
	}
}
