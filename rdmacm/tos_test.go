package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// tosLink records the traffic class (ECN bits masked) of every packet
// sent through it: "MAD" for those to QP1, else "QP".
type tosLink struct {
	udp.Wrap
	mu  sync.Mutex
	tos map[string]map[uint8]int
}

func (l *tosLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	for _, p := range pkts {
		var pk packet.Packet
		if pk.Parse(p.Buf) != nil {
			continue
		}
		kind := "QP"
		if pk.BTH.DestQP() == 1 {
			kind = "MAD"
		}
		if l.tos[kind] == nil {
			l.tos[kind] = map[uint8]int{}
		}
		l.tos[kind][p.TOS&^3]++
	}
	l.mu.Unlock()
	return l.Link.Send(pkts)
}

func (l *tosLink) seen() map[string]map[uint8]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]map[uint8]int{}
	for k, m := range l.tos {
		out[k] = map[uint8]int{}
		for t, n := range m {
			out[k][t] = n
		}
	}
	return out
}

// TestPassiveTakesREQTrafficClass: a requester that asks for a traffic
// class (rdma_set_option TOS, ucmatose -t 32) gets every answer of a
// passive side without one of its own in that class — the REP, the ACKs
// of its QP, the DREP, a REJ —, as Linux's CM takes the passive path from
// the REQ (seen in the lab: rxe's ucmatose server answered a -t 32
// client all in TOS 0x20, rocev2d's in 0). A listener's own traffic
// class still wins.
func TestPassiveTakesREQTrafficClass(t *testing.T) {
	for _, tc := range []struct {
		name        string
		listenTC    uint8
		want        uint8
		rejectFirst bool
	}{{"follows the REQ", 0, 0x20, false}, {"listener's own", 0x40, 0x40, false}, {"REJ follows the REQ", 0, 0x20, true}} {
		t.Run(tc.name, func(t *testing.T) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			rec := &tosLink{tos: map[string]map[uint8]int{}}
			da := newDev(t, n, addrA, nil)
			db := newDev(t, n, addrB, func(l udp.Link) udp.Link { rec.Link = l; return rec })
			lo := ListenOptions{Options: fast}
			lo.TrafficClass = tc.listenTC
			l, err := Listen(db, 7471, &lo)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			o := fast
			o.TrafficClass = 0x20
			if tc.rejectFirst {
				go func() {
					if r, err := l.Next(ctxT(t, 5*time.Second)); err == nil {
						r.Reject(nil)
					}
				}()
				if _, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7471), &o); !errors.Is(err, ErrRejected) {
					t.Fatalf("Dial: %v, want a REJ", err)
				}
				if got := rec.seen(); len(got["MAD"]) != 1 || got["MAD"][tc.want] == 0 {
					t.Errorf("the server's MADs by traffic class: %v, want all %#x", got, tc.want)
				}
				return
			}
			acc := make(chan *Conn, 1)
			go func() {
				c, _ := l.Accept(ctxT(t, 5*time.Second))
				acc <- c
			}()
			ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7471), &o)
			if err != nil {
				t.Fatal(err)
			}
			cb := <-acc
			if cb == nil {
				t.Fatal("no connection accepted")
			}
			a, err := cb.QP().Query()
			if err != nil || a.AV.TrafficClass&^3 != tc.want {
				t.Errorf("the passive QP's traffic class %#x (%v), want %#x", a.AV.TrafficClass, err, tc.want)
			}
			// A SEND the passive QP ACKs, then the disconnect.
			if err := probeSend(ca, cb); err != nil {
				t.Fatal(err)
			}
			ca.Close()
			<-cb.Done()
			cb.Close()
			got := rec.seen()
			for _, kind := range []string{"MAD", "QP"} {
				if len(got[kind]) != 1 || got[kind][tc.want] == 0 {
					t.Errorf("the server's %s packets by traffic class: %v, want all %#x", kind, got[kind], tc.want)
				}
			}
			if got["MAD"][tc.want] < 2 { // REP, DREP
				t.Errorf("the server sent %d MADs, want the REP and the DREP", got["MAD"][tc.want])
			}
		})
	}
}

// probeSend RDMA-WRITEs 8 bytes from a to b and waits for its completion
// (b's QP ACKs it).
func probeSend(a, b *Conn) error {
	src, dst := make([]byte, 8), make([]byte, 8)
	smr, err := a.PD().RegisterMR(src, memreg.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer smr.Deregister()
	dmr, err := b.PD().RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		return err
	}
	defer dmr.Deregister()
	if err := a.QP().PostSend(transport.SendWR{WRID: 1, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{smr.SGE(0, 8)}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		return err
	}
	var wc [1]transport.WC
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := a.SendCQ().Wait(ctx, wc[:]); err != nil {
		return err
	}
	return wc[0].Err()
}
