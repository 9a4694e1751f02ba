//go:build linux

package netns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestDocumentation(t *testing.T) {
	for _, c := range []struct {
		a  string
		ok bool
	}{
		{"192.0.2.1", true}, {"198.51.100.3", true}, {"203.0.113.254", true}, {"2001:db8::1", true},
		{"::ffff:192.0.2.2", true}, {"192.0.3.1", false}, {"10.0.0.1", false}, {"127.0.0.1", false},
		{"2001:db9::1", false},
	} {
		if got := Documentation(netip.MustParseAddr(c.a)); got != c.ok {
			t.Errorf("Documentation(%s) = %v", c.a, got)
		}
	}
	if _, err := NewPair(PairConfig{Prefix: "nstest", IfPrefix: "n", AddrA: netip.MustParseAddr("10.1.1.1"),
		AddrB: netip.MustParseAddr("192.0.2.2")}); err == nil || !strings.Contains(err.Error(), "documentation") {
		t.Errorf("NewPair with 10.1.1.1: %v", err)
	}
}

// TestPairTraffic: a datagram from a socket opened in A (by Do) reaches a
// socket opened in B, on both addresses of A; the MTU and the permanent
// neighbour entries are as configured; Close removes both namespaces.
func TestPairTraffic(t *testing.T) {
	Require(t)
	a, b := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2")
	extra := netip.MustParseAddr("203.0.113.3")
	p, err := NewPair(PairConfig{Prefix: "nstest", IfPrefix: "nt", AddrA: a, AddrB: b, ExtraA: []netip.Addr{extra},
		MTU: 9000, MACA: "02:00:5e:00:73:01", MACB: "02:00:5e:00:73:02"})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			p.Close()
		}
	}()
	rx := MustGet(t, p.NsB, func() (*net.UDPConn, error) {
		return net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b, 4791)))
	})
	defer rx.Close()
	for _, src := range []netip.Addr{a, extra} {
		tx := MustGet(t, p.NsA, func() (*net.UDPConn, error) {
			return net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		})
		// A veth that has just come up may drop the first datagrams (its
		// carrier settles asynchronously): send until one arrives, for at
		// most 5 s.
		buf := make([]byte, 64)
		var n int
		var from netip.AddrPort
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if _, err := tx.WriteToUDPAddrPort([]byte("hello"), netip.AddrPortFrom(b, 4791)); err != nil {
				t.Fatal(err)
			}
			rx.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
			// Skip late copies sent from the previous source.
			for n, from, err = rx.ReadFromUDPAddrPort(buf); err == nil && from.Addr() != src; n, from, err = rx.ReadFromUDPAddrPort(buf) {
			}
			if err == nil {
				break
			}
		}
		tx.Close()
		if err != nil || string(buf[:n]) != "hello" || from.Addr() != src {
			t.Fatalf("from %v: got %q from %v, %v", src, buf[:n], from, err)
		}
	}
	out, err := exec.Command("ip", "-n", p.NsA, "link", "show", p.IfA).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "mtu 9000") {
		t.Errorf("ip link show: %s %v", out, err)
	}
	out, err = exec.Command("ip", "-n", p.NsA, "neigh", "show", "dev", p.IfA).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "203.0.113.2 lladdr 02:00:5e:00:73:02 PERMANENT") {
		t.Errorf("ip neigh show: %s %v", out, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	for _, ns := range []string{p.NsA, p.NsB} {
		if _, err := os.Stat(Path(ns)); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Close: %v", ns, err)
		}
	}
}

// TestRemoveStale: a namespace named for a process that is gone is
// removed by the next New with its prefix; one of a live process is not.
func TestRemoveStale(t *testing.T) {
	Require(t)
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	dead := c.Process.Pid
	stale := fmt.Sprintf("nsstale-%d-1-a", dead)
	live := fmt.Sprintf("nsstale-%d-1", os.Getppid())
	for _, ns := range []string{stale, live} {
		if err := ip("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		defer Delete(ns)
	}
	ns := TestNew(t, "nsstale")
	if _, err := os.Stat(Path(stale)); !os.IsNotExist(err) {
		t.Errorf("stale %s not removed: %v", stale, err)
	}
	if _, err := os.Stat(Path(live)); err != nil {
		t.Errorf("%s of a live process removed: %v", live, err)
	}
	if err := Do(ns, func() error {
		_, err := net.InterfaceByName("lo")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := Do("no-such-namespace-"+fmt.Sprint(os.Getpid()), func() error { return nil }); err == nil {
		t.Error("Do in a missing namespace succeeded")
	}
}
