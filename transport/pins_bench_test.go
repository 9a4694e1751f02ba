package transport

import (
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
	"github.com/gorocev2/rocev2/udp"
)

// BenchmarkResponderWrite4KVsCopy feeds received batches of 64 RDMA WRITE
// packets with 4 KiB payloads (one 256 KiB WRITE per batch: FIRST, 62
// MIDDLE, LAST with AckReq) through the device's receive path and compares
// them, batch against batch in the same run, with a plain copy of the same
// 64 payloads. Layout and alternation as memreg's BenchmarkPlace4KVsCopy:
// one buffer split into two halves (the responder's region and the copy
// destination), L2-resident (2 x 256 KiB) and DRAM (2 x 64 MiB).
//
// The measures, each against its own copy batches:
//   - control: a plain copy into the responder's half (the layout's bias;
//     in DRAM the first half is measurably slower to write).
//   - place: what the responder does per packet to place its payload, on
//     the path it really takes inside a batch (BatchTarget.Write into the
//     batch's Pins, the Pins' Release at the end of the batch), isolated:
//     the calls responder.onWrite makes, with the target looked up per message.
//   - rx/batched: the whole receive handling: Device.inputBatch (parse,
//     QP lookup and lock, PSN/opcode/length checks, placement, counters,
//     pin release) plus the batch's wake and flush (one ACK), as the
//     receive goroutine runs it. Not included: Link.Recv and the ICRC.
//   - rx-per-packet-pin: the same packets through HandlePacket, the
//     unbatched input path (a pin and unpin per packet), for comparison.
//
// The bench goroutine stands in for the receive goroutine, which is idle
// (its link has nothing to deliver).
func BenchmarkResponderWrite4KVsCopy(b *testing.B) {
	const (
		batch = 64
		mtu   = 4096
		msg   = batch * mtu
	)
	for _, size := range []struct {
		name string
		half int
	}{{"L2", 256 << 10}, {"DRAM", 64 << 20}} {
		half := uint64(size.half)
		s, l := scriptedResponder(b, MTU4096, 0)
		l.discard = true
		buf := make([]byte, 2*half)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		mr, err := s.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
		if err != nil {
			b.Fatal(err)
		}
		payload := make([]byte, mtu)
		for i := range payload {
			payload[i] = byte(i)
		}
		// One message per batch: FIRST, MIDDLE..., LAST (AckReq).
		mkBatch := func(first, middle, last bth.Opcode) (pkts []udp.Packet, pls [][]byte) {
			pkts = make([]udp.Packet, batch)
			pls = make([][]byte, batch) // each packet's payload, inside its buffer
			for k := range pkts {
				f := reqOnly(middle, payload)
				f.BTH.AckReq = false
				switch k {
				case 0:
					f.BTH.Opcode = first
					f.RETH = reth.Fields{VA: mr.IOVA(), RKey: mr.RKey(), DMALength: msg}
				case batch - 1:
					f.BTH.Opcode = last
					f.BTH.AckReq = true
				}
				pkts[k] = udp.Packet{Buf: build(b, s.qp, 0, f), Addr: addrA}
				var p packet.Packet
				if err := p.Parse(pkts[k].Buf); err != nil {
					b.Fatal(err)
				}
				pls[k] = p.Payload
			}
			return pkts, pls
		}
		writes, wpls := mkBatch(bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteLast)
		sends, spls := mkBatch(bth.RCSendFirst, bth.RCSendMiddle, bth.RCSendLast)
		tg, err := s.qp.rv.Lookup(mr.RKey(), mr.IOVA(), uint32(half), memreg.AccessRemoteWrite)
		if err != nil {
			b.Fatal(err)
		}
		var pins memreg.Pins
		psn := bth.PSN(0) // the responder's expected PSN, across all runs
		var wc [4]WC
		sg := make([]memreg.SGE, 1) // the receive WQE / list of the next SEND
		for _, name := range []string{"control", "write/place", "write/rx", "write/rx-per-packet-pin",
			"send/place", "send/rx", "send/rx-per-packet-pin"} {
			send := strings.HasPrefix(name, "send/")
			pkts, pls := writes, wpls
			if send {
				pkts, pls = sends, spls
			}
			b.Run(size.name+"/"+name, func(b *testing.B) {
				var p packet.Packet
				var tCopy, tRx time.Duration
				bestCopy, bestRx := time.Hour, time.Hour
				var cur uint64
				copyBatch := func() time.Duration {
					t0 := time.Now()
					for k := range uint64(batch) {
						off := half + cur + k*mtu
						copy(buf[off:off+mtu], pls[k])
					}
					return time.Since(t0)
				}
				rxBatch := func() time.Duration {
					for k := range pkts { // the next message's headers (not timed)
						bth.BTH(pkts[k].Buf).SetPSN(psn.Add(k))
					}
					sg[0] = memreg.SGE{Addr: mr.IOVA() + cur, Length: msg, LKey: mr.LKey()}
					if send {
						if strings.HasSuffix(name, "/rx") || strings.HasSuffix(name, "-pin") {
							if err := s.qp.PostRecv(RecvWR{WRID: uint64(cur), SGEs: sg}); err != nil {
								b.Fatal(err)
							}
						}
					} else {
						reth.RETH(pkts[0].Buf[bth.Size:]).SetVA(mr.IOVA() + cur)
					}
					t0 := time.Now()
					switch name {
					case "control": // a plain copy into the responder's half: the layout's own bias
						for k := range uint64(batch) {
							off := cur + k*mtu
							copy(buf[off:off+mtu], pls[k])
						}
					case "write/place":
						bt := tg.Batched()
						for k := range uint64(batch) {
							if err := bt.Write(&pins, cur+k*mtu, pls[k]); err != nil {
								b.Fatal(err)
							}
						}
						pins.Release()
					case "send/place":
						sl := s.pd.ScatterList(sg)
						for k := range uint64(batch) {
							if err := sl.Scatter(&pins, k*mtu, pls[k]); err != nil {
								b.Fatal(err)
							}
						}
						pins.Release()
					case "write/rx", "send/rx":
						s.dev.inputBatch(&p, pkts)
						s.dev.wakePending()
						s.dev.flushPending()
					default: // the unbatched path: HandlePacket
						for k := range pkts {
							if err := s.dev.HandlePacket(pkts[k].Buf, addrA); err != nil {
								b.Fatal(err)
							}
						}
					}
					d := time.Since(t0)
					if strings.HasSuffix(name, "/rx") || strings.HasSuffix(name, "-pin") {
						psn = psn.Add(batch)
					}
					if send && s.rcq.Poll(wc[:]) != 0 && wc[0].Status != WCSuccess {
						b.Fatalf("receive completion %+v", wc[0])
					}
					return d
				}
				b.SetBytes(2 * mtu * batch)
				b.ReportAllocs()
				odd := false
				for b.Loop() {
					var cp, rx time.Duration
					if odd {
						rx = rxBatch()
						cp = copyBatch()
					} else {
						cp = copyBatch()
						rx = rxBatch()
					}
					odd = !odd
					tCopy += cp
					tRx += rx
					bestCopy, bestRx = min(bestCopy, cp), min(bestRx, rx)
					cur = (cur + msg) % half
				}
				// Every packet was in sequence and placed: no duplicate, no
				// sequence error, the QP is still in RTR expecting the next.
				a, _ := s.qp.Query()
				c := s.dev.Counters()
				if a.State != QPSRTR || bth.PSN(a.RQPSN) != psn || c.DuplicateRequest != 0 || c.OutOfSeqRequest != 0 {
					b.Fatalf("responder: %s; counters %+v", s.qp.debugState(), c)
				}
				b.ReportMetric(float64(tCopy.Nanoseconds())/float64(b.N*batch), "copy-ns/4KiB")
				b.ReportMetric(float64(tRx.Nanoseconds())/float64(b.N*batch), "ns/pkt")
				b.ReportMetric(100*float64(tCopy)/float64(tRx), "vs-copy-%")
				b.ReportMetric(100*float64(bestCopy)/float64(bestRx), "best-vs-copy-%")
			})
		}
	}
}
