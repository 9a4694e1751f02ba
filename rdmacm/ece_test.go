package rdmacm

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// madLog records the ECE fields of the REQs and REPs a link sends.
type madLog struct {
	udp.Wrap // forwards the wrapped link's capabilities
	mu       sync.Mutex
	seen     []string // "REQ vendor 0x... mod 0x..."
}

func (l *madLog) Send(pkts []udp.Packet) error {
	for _, p := range pkts {
		var pk packet.Packet
		if pk.Parse(p.Buf) != nil || pk.BTH.DestQP() != 1 {
			continue
		}
		h, msg, err := cm.Decode(pk.Payload)
		if err != nil {
			continue
		}
		var v uint32
		switch f := msg.(type) {
		case *cm.REQFields:
			v = f.VendorID
		case *cm.REPFields:
			v = f.VendorID
		default:
			continue
		}
		l.mu.Lock()
		l.seen = append(l.seen, fmt.Sprintf("%v vendor %#x mod %#x", h.AttributeID, v, h.AttributeModifier))
		l.mu.Unlock()
	}
	return l.Link.Send(pkts)
}

func (l *madLog) log() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// TestECESelectiveRepeat: selective repeat runs only when both sides ask
// for it; a side that does not gets (and sends) no ECE, so a REQ without
// our vendor ID (rxe's) is answered with a REP without one, byte for byte
// as before.
func TestECESelectiveRepeat(t *testing.T) {
	for _, c := range []struct {
		client, server bool
		want           bool
		req, rep       string
	}{
		{false, false, false, "REQ vendor 0x0 mod 0x0", "REP vendor 0x0 mod 0x0"},
		{true, false, false, "REQ vendor 0x5a5352 mod 0x1", "REP vendor 0x0 mod 0x0"},
		{false, true, false, "REQ vendor 0x0 mod 0x0", "REP vendor 0x0 mod 0x0"},
		{true, true, true, "REQ vendor 0x5a5352 mod 0x1", "REP vendor 0x5a5352 mod 0x1"},
	} {
		t.Run(fmt.Sprintf("client=%v,server=%v", c.client, c.server), func(t *testing.T) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			var la, lb *madLog
			da := newDev(t, n, addrA, func(l udp.Link) udp.Link { la = &madLog{Wrap: udp.Wrap{Link: l}}; return la })
			db := newDev(t, n, addrB, func(l udp.Link) udp.Link { lb = &madLog{Wrap: udp.Wrap{Link: l}}; return lb })
			// The test counts the REQs and REPs sent: a response timeout
			// long enough that none is resent on a loaded machine
			// (fast's 20 ms resent the REP under -race now and then).
			slow := fast
			slow.ResponseTimeout = 2 * time.Second
			lo := ListenOptions{Options: slow}
			lo.SelectiveRepeat = c.server
			l, err := Listen(db, 7200, &lo)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			acc := make(chan *Conn, 1)
			go func() {
				cb, err := l.Accept(ctxT(t, 5*time.Second))
				if err != nil {
					t.Error(err)
				}
				acc <- cb
			}()
			o := slow
			o.SelectiveRepeat = c.client
			ca, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 7200), &o)
			if err != nil {
				t.Fatal(err)
			}
			defer ca.Close()
			cb := <-acc
			if cb == nil {
				t.FailNow()
			}
			defer cb.Close()
			if ca.SelectiveRepeat() != c.want || cb.SelectiveRepeat() != c.want {
				t.Errorf("selective repeat client %v server %v, want %v", ca.SelectiveRepeat(), cb.SelectiveRepeat(), c.want)
			}
			if got := la.log(); len(got) != 1 || got[0] != c.req {
				t.Errorf("client sent %q, want [%q]", got, c.req)
			}
			if got := lb.log(); len(got) != 1 || got[0] != c.rep {
				t.Errorf("server sent %q, want [%q]", got, c.rep)
			}
			if c.want && (ca.RemoteECE().String() != "vendor 0x5a5352 options 0x1 (selective repeat)" || cb.LocalECE() != ca.RemoteECE()) {
				t.Errorf("ECE client remote %v server local %v", ca.RemoteECE(), cb.LocalECE())
			}
			if !c.want && ca.RemoteECE() != (ECE{}) {
				t.Errorf("client saw ECE %v from a server that was not asked", ca.RemoteECE())
			}
		})
	}
}
