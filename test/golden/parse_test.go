package golden

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseTxt checks that every golden .txt parses completely: every
// "## packets" line is understood and every tool output names its QPs.
func TestParseTxt(t *testing.T) {
	for _, p := range PCAPs(t) {
		txt := strings.TrimSuffix(p, ".pcap") + ".txt"
		c, err := ParseTxt(txt)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d packets, %d addrs, %d imm, server %v client %v", filepath.Base(txt), len(c.Packets), len(c.Addrs), len(c.SentImm), c.Server, c.Client)
		if !c.Server.IsValid() || !c.Client.IsValid() {
			t.Errorf("%s: server/client addresses missing", txt)
		}
	}
}

// TestParseTxtIPv6 parses a .txt of an IPv6 capture (there is no golden
// one yet): IPv6 hosts in the header lines (one link-local with its zone),
// [ADDR]:PORT sources and plain or bracketed destinations.
func TestParseTxtIPv6(t *testing.T) {
	txt := `# rc_write_ipv6
server (vm0 2001:db8::2):    ib_write_bw -d rxe0 -x 0 -F -n 2
client (host fe80::5054:ff:fec0:201%rv2br0, netns lab): rocev2d write-bw -n 2 192.0.2.2

## server output
 local address: LID 0000 QPN 0x0015 PSN 0x2ac7d7 RKey 0x000116 VAddr 0x007f99d8107000
 remote address: LID 0000 QPN 0x0011 PSN 0xc8a712 RKey 0x000654 VAddr 0x0055d90dddb000

## packets (synthetic)
  20 0.000000 [fe80::5054:ff:fec0:201]:49593 > 2001:db8::2 RC_RDMA_WRITE_ONLY dqpn=0x000015 psn=0xc8a712 A pkey=0xffff pay=64 RETH[va=0x7f99d8107000 rkey=0x00000116 len=64] icrc=0x6305d220
  21 0.000446 [2001:db8::2]:53248 > [fe80::5054:ff:fec0:201] RC_ACKNOWLEDGE dqpn=0x000011 psn=0xc8a712 pkey=0xffff pay=0 AETH[ACK credits=31 msn=1] icrc=0x76d7dc06
  22 0.000592 192.0.2.3:49593 > 192.0.2.2 RC_SEND_ONLY dqpn=0x000015 psn=0xc8a713 A pkey=0xffff pay=4 icrc=0xa846fd1d
`
	path := filepath.Join(t.TempDir(), "rc_write_ipv6.txt")
	if err := os.WriteFile(path, []byte(txt), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := ParseTxt(path)
	if err != nil {
		t.Fatal(err)
	}
	srv, cli := netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("fe80::5054:ff:fec0:201%rv2br0")
	if c.Server != srv || c.Client != cli {
		t.Errorf("server %v client %v, want %v and %v", c.Server, c.Client, srv, cli)
	}
	if len(c.Packets) != 3 {
		t.Fatalf("%d packets, want 3", len(c.Packets))
	}
	ll := netip.MustParseAddr("fe80::5054:ff:fec0:201")
	p0, p1, p2 := c.Packets[0], c.Packets[1], c.Packets[2]
	if p0.Src != ll || p0.SrcPort != 49593 || p0.Dst != srv || p0.RETH == nil || p0.RETH.RKey != 0x116 {
		t.Errorf("line 1: %+v", p0)
	}
	if p1.Src != srv || p1.SrcPort != 53248 || p1.Dst != ll || p1.AETH == nil || p1.AETH.MSN != 1 {
		t.Errorf("line 2: %+v", p1)
	}
	if p2.Src != netip.MustParseAddr("192.0.2.3") || p2.Dst != netip.MustParseAddr("192.0.2.2") {
		t.Errorf("line 3 (IPv4): %+v", p2)
	}
	if len(c.Addrs) != 2 || c.Addrs[0].Host != srv || c.Addrs[1].Host != cli || c.Addrs[1].QPN != 0x11 {
		t.Errorf("addrs %+v", c.Addrs)
	}
}
