package cli

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// PrintCounters always prints link_drop_kernel (its 0 tells, with the
// ACK timeout counters, why a QP retried) and leaves out other zero link
// drops.
func TestPrintCountersLinkDrops(t *testing.T) {
	l, err := memnet.NewMemNetwork(memnet.Faults{}).Link(netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := transport.NewDevice(l, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	var b strings.Builder
	PrintCounters(&b, "test", dev)
	out := b.String()
	for _, want := range []string{"link_sent_pkts", "link_rcvd_pkts", "link_drop_kernel"} {
		if !strings.Contains(out, want+" ") {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	for _, no := range []string{"link_drop_bad_icrc", "link_icmp_errors"} {
		if strings.Contains(out, no) {
			t.Errorf("zero %s printed:\n%s", no, out)
		}
	}
}
