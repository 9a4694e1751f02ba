//go:build linux

package udp

import "testing"

// BenchmarkTryRecvOne is one 32-byte datagram sent and taken with TryRecv
// into 8 slots, as a polling transport's ping-pong receives it (in place,
// ICRC verified by the caller with VerifyICRC): the receive wrapper's
// per-call work above recvmmsg, for counting with callgrind (the kernel's
// part is not counted there).
func BenchmarkTryRecvOne(b *testing.B) {
	a, c := listenPair(b)
	c.SetRecvInPlace(true)
	c.SetDeferVerify(true)
	out := testPackets(1, 32, sockB, 0)
	in := recvBufs(8)
	own := in[0].Buf
	for b.Loop() {
		if err := a.Send(out); err != nil {
			b.Fatal(err)
		}
		n := 0
		for i := 0; n == 0; i++ {
			var err error
			if n, err = c.TryRecv(in); err != nil || i > 1<<20 {
				b.Fatal("TryRecv:", n, err)
			}
		}
		if n != 1 || !c.VerifyICRC(&in[0]) {
			b.Fatal("bad receive", n)
		}
		in[0].Buf = own // the transport's prefix restore (freshPkts)
	}
}
