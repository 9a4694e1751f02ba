//go:build linux

package udp

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestSocketGSOSendIovecLimit: a GSO Send of zero-copy packets whose
// iovecs cannot merge (3 per packet) fills sendmmsg only as far as the
// iovecs hold whole groups and sends the rest in further calls; the
// datagrams (and so the segments' IPv4 identifications, i mod BatchSize
// for equal packets) are those of BatchSize packets at a time, whatever
// the batch size.
func TestSocketGSOSendIovecLimit(t *testing.T) {
	for _, bs := range []int{64, 5} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) { testSocketGSOSendIovecLimit(t, bs) })
	}
}

func testSocketGSOSendIovecLimit(t *testing.T, bs int) {
	{
		a, b := listenPairOpts(t, &SocketOptions{GSO: true, BatchSize: bs}, &SocketOptions{})
		const n, hdr, pay, tail = 512, 12, 64, 4
		pkts := make([]Packet, n)
		want := make([][]byte, n)
		for i := range pkts {
			full := testPayload(make([]byte, hdr+pay+tail), uint32(i), hdr+pay+tail)
			want[i] = full
			buf := make([]byte, hdr+tail) // its own allocation: no iovec merges
			copy(buf[:hdr], full[:hdr])
			copy(buf[hdr:], full[hdr+pay:])
			pkts[i] = Packet{Buf: buf, Payload: bytes.Clone(full[hdr : hdr+pay]), Addr: sockB}
		}
		var gotIDs []uint16
		testHookIPv4ID = func(id uint16) { gotIDs = append(gotIDs, id) }
		calls := a.send.calls
		if err := a.Send(pkts); err != nil {
			t.Fatal(err)
		}
		// 64 packets per group x 3 iovecs = 192; iovecs: 768 (bs 64).
		wantCalls := uint64(2)
		if bs == 5 {
			wantCalls = (n + 24) / 25 // 5 groups of 5 per call
		}
		if c := a.send.calls - calls; c != wantCalls {
			t.Errorf("batch %d: %d sendmmsg calls, want %d", bs, c, wantCalls)
		}
		if s := a.Stats(); s.SentPkts != n {
			t.Errorf("batch %d: SentPkts %d, want %d", bs, s.SentPkts, n)
		}
		got := recvN(t, b, n, 10*time.Second)
		testHookIPv4ID = nil
		for i, p := range got {
			w := want[i]
			// The ICRC was filled into Buf's tail by Send.
			copy(w[hdr+pay:], pkts[i].Buf[hdr:])
			if !bytes.Equal(p.Buf, w) {
				t.Fatalf("batch %d: packet %d: seq %d len %d, want seq %d", bs, i, seqOf(p.Buf), len(p.Buf), i)
			}
		}
		var wantIDs []uint16
		for i := range n {
			wantIDs = append(wantIDs, uint16(i%bs))
		}
		if !slices.Equal(gotIDs, wantIDs) {
			t.Errorf("batch %d: IDs %v, want %v", bs, gotIDs, wantIDs)
		}
	}
}
