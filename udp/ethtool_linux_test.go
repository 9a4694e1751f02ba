//go:build linux

package udp_test

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/internal/netns"
	"github.com/gorocev2/rocev2/udp"
)

// ethtoolSays returns what `ethtool -k` reports for tx-udp-segmentation
// on ifname in namespace ns ("" for the current one), or "" when the tool
// is absent.
func ethtoolSays(t *testing.T, ns, ifname string) string {
	t.Helper()
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Logf("ethtool not installed: the netlink answer is not cross-checked")
		return ""
	}
	args := []string{"ethtool", "-k", ifname}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "tx-udp-segmentation:"); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatalf("%v printed no tx-udp-segmentation:\n%s", args, out)
	return ""
}

func checkAgainstEthtool(t *testing.T, ns string, o udp.DeviceOffload) {
	t.Helper()
	want := ethtoolSays(t, ns, o.Name)
	if want == "" {
		return
	}
	if got := map[bool]string{true: "on", false: "off"}[o.TxUDPSegmentation]; got != want {
		t.Errorf("%s: netlink says tx-udp-segmentation %s, ethtool -k %s", o.Name, got, want)
	}
}

// TestDeviceOffloadLoopback: 127.0.0.1, an address inside lo's /8 that no
// device holds, and ::1 all map to lo, which is virtual and segments in
// software, so GSO is on by default.
func TestDeviceOffloadLoopback(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "127.0.0.61", "::1"} {
		o, err := udp.DeviceOffloadFor(netip.MustParseAddr(a))
		if err != nil {
			if a == "::1" {
				if _, serr := os.Stat("/proc/net/if_inet6"); serr != nil {
					t.Logf("%s: no IPv6 here: %v", a, err)
					continue
				}
			}
			t.Fatalf("%s: %v", a, err)
		}
		if o.Name != "lo" || !o.Virtual || o.HardwareSegmentation() || !o.GSODefault() {
			t.Errorf("%s: %+v (%v), want lo, virtual, software segmentation", a, o, o)
		}
		checkAgainstEthtool(t, "", o)
	}
	if _, err := udp.DeviceOffloadFor(netip.MustParseAddr("203.0.113.77")); err == nil {
		t.Errorf("an address of no device: no error")
	}
	if _, err := udp.DeviceOffloadOf(1 << 30); err == nil {
		t.Errorf("ifindex 2^30: no error")
	}
}

// TestDeviceOffloadVeth asks about both ends of a veth pair in namespaces
// of the test's own: virtual, tx-udp-segmentation as ethtool -k says, GSO
// on by default; and a physical device of the host, if there is one,
// agrees with ethtool too.
func TestDeviceOffloadVeth(t *testing.T) {
	np := netns.TestPair(t, netns.PairConfig{Prefix: "hbeth", IfPrefix: "he",
		AddrA: netip.MustParseAddr("192.0.2.81"), AddrB: netip.MustParseAddr("192.0.2.82")})
	for _, end := range []struct {
		ns, ifname string
		addr       netip.Addr
	}{{np.NsA, np.IfA, np.AddrA}, {np.NsB, np.IfB, np.AddrB}} {
		o := netns.MustGet(t, end.ns, func() (udp.DeviceOffload, error) { return udp.DeviceOffloadFor(end.addr) })
		if o.Name != end.ifname || !o.Virtual || o.HardwareSegmentation() || !o.GSODefault() {
			t.Errorf("%v in %s: %+v (%v), want %s, virtual, software segmentation", end.addr, end.ns, o, o, end.ifname)
		}
		checkAgainstEthtool(t, end.ns, o)
	}
	// A device with a parent (a NIC, virtio or real) of the host, if any.
	ents, _ := os.ReadDir("/sys/class/net")
	for _, e := range ents {
		if _, err := os.Stat("/sys/class/net/" + e.Name() + "/device"); err != nil {
			continue
		}
		b, err := os.ReadFile("/sys/class/net/" + e.Name() + "/ifindex")
		if err != nil {
			continue
		}
		var idx int
		for _, c := range strings.TrimSpace(string(b)) {
			idx = idx*10 + int(c-'0')
		}
		o, err := udp.DeviceOffloadOf(idx)
		if err != nil {
			t.Errorf("%s: %v", e.Name(), err)
			continue
		}
		if o.Name != e.Name() || o.Virtual || o.GSODefault() == o.TxUDPSegmentation {
			t.Errorf("%s: %+v (%v): want physical, GSO default = !tx-udp-segmentation", e.Name(), o, o)
		}
		checkAgainstEthtool(t, "", o)
	}
}

// TestListenSocketGSOAuto: GSOAuto on loopback turns GSO on (lo segments in
// software), overriding GSO: false; without GSOAuto, GSO is as given.
func TestListenSocketGSOAuto(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.83")
	for _, c := range []struct {
		o    udp.SocketOptions
		want bool
	}{
		{udp.SocketOptions{GSOAuto: true}, true},
		{udp.SocketOptions{}, false},
		{udp.SocketOptions{GSO: true}, true},
	} {
		l, err := udp.ListenSocket(addr, &c.o)
		if err != nil {
			t.Fatalf("%+v: %v", c.o, err)
		}
		if l.GSO() != c.want {
			t.Errorf("%+v: GSO() = %v, want %v", c.o, l.GSO(), c.want)
		}
		l.Close()
	}
}
