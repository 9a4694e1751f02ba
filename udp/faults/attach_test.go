//go:build linux

package faults

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/internal/netns"
)

// netnsPair creates two namespaces joined by a veth pair, 203.0.113.1 (a)
// and 203.0.113.2 (b) with fixed MACs and permanent neighbour entries (no
// ARP to wait for), removed at cleanup.
func netnsPair(t *testing.T, tag string) (nsA, nsB, ifA, ifB string) {
	t.Helper()
	needRoot(t)
	p := netns.TestPair(t, netns.PairConfig{Prefix: "flt" + tag, IfPrefix: "f" + tag,
		AddrA: netip.MustParseAddr("203.0.113.1"), AddrB: netip.MustParseAddr("203.0.113.2"),
		MACA: "02:00:5e:00:71:01", MACB: "02:00:5e:00:71:02"})
	return p.NsA, p.NsB, p.IfA, p.IfB
}

// udpIn opens a UDP socket bound to addr inside namespace ns.
func udpIn(t *testing.T, ns, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := netns.Do(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(mustAddrPort(addr)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// bthPayload is a UDP payload: a BTH with the PSN, 8 bytes, an ICRC slot.
func bthPayload(psn uint32) []byte {
	b := make([]byte, 12+8+4)
	b[0] = 0x0a
	binary.BigEndian.PutUint16(b[2:], 0xffff)
	binary.BigEndian.PutUint32(b[4:], 0x11)
	binary.BigEndian.PutUint32(b[8:], psn)
	return b
}

// exchange sends n datagrams with PSNs 0..n-1 from a to b:4791 and returns
// the PSNs received, in order.
func exchange(t *testing.T, a, b *net.UDPConn, n int) []uint32 {
	t.Helper()
	dst := &net.UDPAddr{IP: net.IPv4(203, 0, 113, 2), Port: 4791}
	for i := range n {
		if _, err := a.WriteToUDP(bthPayload(uint32(i)), dst); err != nil {
			t.Fatal(err)
		}
		if i%16 == 15 {
			time.Sleep(time.Millisecond)
		}
	}
	var got []uint32
	buf := make([]byte, 2048)
	wait := 3 * time.Second // the first packet, on a loaded machine
	for {
		b.SetReadDeadline(time.Now().Add(wait))
		wait = 300 * time.Millisecond
		k, err := b.Read(buf)
		if err != nil {
			return got
		}
		if k >= 12 {
			got = append(got, binary.BigEndian.Uint32(buf[8:12])&0xffffff)
		}
	}
}

func TestVethAttach(t *testing.T) {
	for _, mode := range []Mode{ModeTCX, ModeTC} {
		t.Run(mode.String(), func(t *testing.T) {
			if mode == ModeTC {
				netns.Require(t, "tc")
			}
			tag := "x"
			if mode == ModeTC {
				tag = "t"
			}
			nsA, nsB, ifA, _ := netnsPair(t, tag)
			a := udpIn(t, nsA, "203.0.113.1:4791")
			b := udpIn(t, nsB, "203.0.113.2:4791")
			inj, err := AttachWith(ifA, Config{DropEveryN: 4}, &Options{Netns: nsA, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer inj.Close()

			got := exchange(t, a, b, 100)
			if len(got) != 75 {
				t.Fatalf("every 4th dropped: received %d of 100", len(got))
			}
			for _, psn := range got {
				if psn%4 == 3 {
					t.Fatalf("PSN %d received, should be dropped", psn)
				}
			}
			c, _ := inj.Counters()
			if c.DropNth != 25 || c.Seen != 100 {
				t.Fatalf("counters %v", c)
			}

			// At run time: duplicate everything.
			inj.Set(Config{DupRate: 1})
			got = exchange(t, a, b, 50)
			if len(got) != 100 {
				t.Fatalf("duplicated: received %d, want 100", len(got))
			}
			for i := range 50 {
				if got[2*i] != uint32(i) || got[2*i+1] != uint32(i) {
					t.Fatalf("duplicates out of place: %v", got)
				}
			}

			// Reorder: every odd packet is held and released behind the next.
			inj.Set(Config{ReorderRate: 1})
			got = exchange(t, a, b, 20)
			if len(got) != 20 {
				t.Fatalf("reorder: received %d, want 20: %v", len(got), got)
			}
			for i := 0; i < 20; i += 2 {
				if got[i] != uint32(i+1) || got[i+1] != uint32(i) {
					t.Fatalf("reorder: got %v, want pairs swapped", got)
				}
			}
			c, _ = inj.Counters()
			if c.Held != 10 || c.Released != 10 || c.Duplicated != 50 || c.Errors != 0 {
				t.Fatalf("counters %v", c)
			}

			// Ingress of b's side is not attached: the reverse direction is clean.
			if err := inj.Close(); err != nil {
				t.Fatalf("detach: %v", err)
			}
			if got := exchange(t, a, b, 10); len(got) != 10 {
				t.Fatalf("after detach: received %d of 10", len(got))
			}
		})
	}
}

// TestIngressHook faults packets arriving on an interface.
func TestIngressHook(t *testing.T) {
	nsA, nsB, _, ifB := netnsPair(t, "i")
	a := udpIn(t, nsA, "203.0.113.1:4791")
	b := udpIn(t, nsB, "203.0.113.2:4791")
	inj, err := AttachWith(ifB, Config{DropPSN: &PSNRange{First: 5, Last: 9}, DupRate: 1}, &Options{Netns: nsB, Ingress: true})
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close()
	got := exchange(t, a, b, 20)
	if len(got) != 30 {
		t.Fatalf("received %d, want 30 (15 kept, each twice): %v", len(got), got)
	}
	c, _ := inj.HookCounters(Ingress)
	if c.DropPSN != 5 || c.Duplicated != 15 {
		t.Fatalf("counters %v", c)
	}
}

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
