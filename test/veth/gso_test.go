//go:build linux

package veth

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/faults"
)

// gsoCases run with UDP GSO on both links (as rocev2d and GSOAuto do on a
// veth): the injector's GSO path must fault the segments of each datagram.
var gsoCases = []vethCase{
	{name: "clean", mtu: transport.MTU4096},
	{name: "ce3%", cfg: faults.Config{CERate: 0.03}, mtu: transport.MTU1024},
	{name: "drop1%", cfg: faults.Config{DropRate: 0.01}, mtu: transport.MTU4096},
	// PSNs 100-119 of A's requests: inside the first WRITE of the mix (a
	// READ's PSNs are its responses', sent by B).
	{name: "psn-range", mtu: transport.MTU1024, psnDrop: 100},
	{name: "dup2%", cfg: faults.Config{DupRate: 0.02}, mtu: transport.MTU4096},
	// Only single packets are held (ACKs, READ requests, short messages);
	// GSO datagrams release them.
	{name: "reorder5%", cfg: faults.Config{ReorderRate: 0.05}, mtu: transport.MTU4096},
	// A queue deep enough for both flows' windows (128 packets of 4 KiB
	// arrive as a few GSO datagrams at once): it marks from 32 KiB and
	// drops only when the senders outrun 400 Mb/s for long. (With a 1 MiB
	// limit, under the race detector, tail drops of whole retransmitted
	// flights exhausted a QP's retries.)
	{name: "congestion", cfg: faults.Config{Congestion: &faults.Congestion{Rate: 400e6, Limit: 4 << 20, Kmin: 32 << 10, Kmax: 1 << 20, Pmax: 0.2}},
		mtu: transport.MTU4096},
}

// TestVethGSO is TestVethLoss with UDP GSO on both links: mixed RC
// operations both ways, every byte and completion checked, with the
// injector on both hooks of A's veth. Each case checks that GSO datagrams
// were really sent (the injector's GSO counters) and that the injector
// counts segments exactly: seen = the links' sent packets, received = sent
// − dropped + duplicated. With CE marks (a rate, or the congestion point)
// the receivers count the marked packets, send CNPs, and the senders'
// DCQCN cuts its rate. Before the injector looked into GSO datagrams it
// passed them whole: no drop, no mark, seen=0.
func TestVethGSO(t *testing.T) {
	nsA, nsB, ifA, ifB := vethPair(t)
	inj, err := faults.AttachWith(ifA, faults.Config{}, &faults.Options{Netns: nsA, Egress: true, Ingress: true})
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close()
	total := caseBytes() / 2
	for i, c := range gsoCases {
		t.Run(c.name, func(t *testing.T) {
			if err := inj.Set(faults.Config{}); err != nil {
				t.Fatal(err)
			}
			capture(t, nsB, ifB, "gso/"+t.Name())
			la := listenWith(t, nsA, addrA, &udp.SocketOptions{GSO: true})
			lb := listenWith(t, nsB, addrB, &udp.SocketOptions{GSO: true})
			if !la.GSO() || !lb.GSO() {
				t.Fatalf("links without GSO: %v %v", la.GSO(), lb.GSO())
			}
			a, b := newSideOn(t, la), newSideOn(t, lb)
			psnA, psnB := uint32(0xffe000+i*16), uint32(0x200000*uint32(i+1))
			// The ACK timeout 4x TestVethLoss's: on a machine loaded
			// far beyond its 2 cores (load average 22 seen), with the race
			// detector, 7 timeouts in a row without any injected loss
			// exhausted a QP's retries (the 64 KiB GSO bursts each way
			// take the slow receive loops longer to drain).
			connectTimeout(t, a, b, psnA, psnB, c.mtu, ackTimeout+2)
			connectTimeout(t, b, a, psnB, psnA, c.mtu, ackTimeout+2)
			ab, ba := newDirection(t, a, b), newDirection(t, b, a)
			if c.psnDrop != 0 {
				first := (psnA + c.psnDrop) & 0xffffff
				c.cfg.DropPSN = &faults.PSNRange{First: first, Last: (first + 19) & 0xffffff, Limit: 20}
			}
			if err := inj.ResetCounters(); err != nil {
				t.Fatal(err)
			}
			if err := inj.Set(c.cfg); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for k, d := range []*direction{ab, ba} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[k] = d.run(ctx, total/2)
				}()
			}
			wg.Wait()
			el := time.Since(start)
			ca, cb, eg, in, sa, sb := settle(a, b, inj)
			inj.Set(faults.Config{})
			qa, qb := a.qp.Congestion(), b.qp.Congestion()
			for _, err := range errs {
				if err != nil {
					t.Fatalf("after %v: %v\nA %+v\nB %+v\ninjector egress %v\ninjector ingress %v\nlinks A %+v B %+v",
						el, err, ca, cb, eg, in, sa, sb)
				}
			}
			moved := ab.bytes + ba.bytes
			t.Logf("%s: %d MiB in %v = %.1f MiB/s; injector: egress %v | ingress %v",
				c.name, moved>>20, el.Round(time.Millisecond), float64(moved)/(1<<20)/el.Seconds(), eg, in)
			t.Logf("%s: retransmitted %d, ecn_marked A/B %d/%d, cnp_sent A/B %d/%d, cnp_handled A/B %d/%d, DCQCN cuts A/B %d/%d; sent A/B %d/%d",
				c.name, ca.RetransmittedPkts+cb.RetransmittedPkts, ca.NPECNMarkedRocePackets, cb.NPECNMarkedRocePackets,
				ca.NPCNPSent, cb.NPCNPSent, ca.RPCNPHandled, cb.RPCNPHandled, qa.Cuts, qb.Cuts, sa.SentPkts, sb.SentPkts)
			if moved < total {
				t.Fatalf("moved %d bytes, want %d", moved, total)
			}
			checkCountersGSO(t, c, true, ca, cb, eg, in, sa, sb)
			// Most packets of a bulk transfer leave in GSO datagrams.
			if segs, seen := eg.GSOSegs+in.GSOSegs, eg.Seen+in.Seen; segs*2 < seen {
				t.Errorf("only %d of %d packets in GSO datagrams", segs, seen)
			}
			if c.cfg.CERate > 0 || c.cfg.Congestion != nil {
				checkECN(t, ca, cb, eg, in, qa, qb)
			}
		})
	}
}

// checkECN: every CE mark the injector made on a data or ACK packet
// reached a receiver, which answered with CNPs that the senders' DCQCN
// acted on.
func checkECN(t *testing.T, ca, cb transport.Counters, eg, in faults.Counters, qa, qb transport.CongestionState) {
	t.Helper()
	marked := eg.CEMarked + in.CEMarked
	if marked == 0 || eg.GSOMarked+in.GSOMarked == 0 {
		t.Fatalf("injector marked %d packets (%d GSO datagrams)", marked, eg.GSOMarked+in.GSOMarked)
	}
	// B receives what the egress hook marked, A what the ingress hook
	// marked. CNPs (sent Not-ECT) are never marked, so each mark is on a
	// packet of an RC QP.
	if ca.NPECNMarkedRocePackets != in.CEMarked || cb.NPECNMarkedRocePackets != eg.CEMarked {
		t.Errorf("receivers counted CE on A %d B %d packets, injector marked ingress %d egress %d",
			ca.NPECNMarkedRocePackets, cb.NPECNMarkedRocePackets, in.CEMarked, eg.CEMarked)
	}
	if ca.NPCNPSent+cb.NPCNPSent == 0 || ca.RPCNPHandled+cb.RPCNPHandled == 0 || qa.Cuts+qb.Cuts == 0 {
		t.Errorf("no congestion reaction: cnp_sent %d/%d, cnp_handled %d/%d, cuts %d/%d",
			ca.NPCNPSent, cb.NPCNPSent, ca.RPCNPHandled, cb.RPCNPHandled, qa.Cuts, qb.Cuts)
	}
	// A CNP goes back to the sender of the marked packets: B's CNPs are
	// handled by A and A's by B (all of them unless the injector dropped
	// some: the congestion point's tail drops take CNPs too).
	lost := func(n, want uint64) bool { return n > want || (eg.Dropped()+in.Dropped() == 0 && n != want) }
	if lost(ca.RPCNPHandled+ca.RPCNPIgnored, cb.NPCNPSent) || lost(cb.RPCNPHandled+cb.RPCNPIgnored, ca.NPCNPSent) {
		t.Errorf("CNPs sent A %d B %d, handled+ignored A %d B %d", ca.NPCNPSent, cb.NPCNPSent,
			ca.RPCNPHandled+ca.RPCNPIgnored, cb.RPCNPHandled+cb.RPCNPIgnored)
	}
}
