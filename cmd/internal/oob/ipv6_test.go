package oob

import (
	"bytes"
	"net/netip"
	"testing"
)

// TestIPv6GIDs: the exchanges carry a link-local IPv6 GID (rxe's default
// GID, index 0) as the tools write it — ibv_*_pingpong 32 hex digits,
// perftest "%02x:" per byte — and parse it back; the zone a user gives an
// address is not part of a GID.
func TestIPv6GIDs(t *testing.T) {
	gid := netip.MustParseAddr("fe80::5054:ff:fec0:202").As16()
	pp := PingpongDest{QPN: 0x11, PSN: 0x7e5ae7, GID: gid}
	wire := pp.Marshal()
	want := []byte("0000:000011:7e5ae7:fe80000000000000505400fffec00202\x00")
	if !bytes.Equal(wire, want) {
		t.Fatalf("pingpong dest %q, want %q", wire, want)
	}
	if got, err := ParsePingpongDest(wire); err != nil || got != pp {
		t.Fatalf("ParsePingpongDest: %+v %v", got, err)
	}

	pd := PerfDest{OutReads: 16, QPN: 0x13, PSN: 0xbd4a7e, RKey: 0x4a7, VAddr: 0x55e9a899d000, GID: gid}
	wire = pd.Marshal()
	if !bytes.Contains(wire, []byte(":fe:80:00:00:00:00:00:00:50:54:00:ff:fe:c0:02:02:")) {
		t.Fatalf("perftest dest %q lacks the GID bytes", wire)
	}
	if got, err := ParsePerfDest(wire); err != nil || got != pd {
		t.Fatalf("ParsePerfDest: %+v %v", got, err)
	}
	if got, err := ParsePerfDestCM(pd.MarshalCM()); err != nil || got.GID != gid {
		t.Fatalf("ParsePerfDestCM: %+v %v", got, err)
	}
}
