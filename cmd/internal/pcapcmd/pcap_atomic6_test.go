//go:build unix

package pcapcmd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestPcapCheckIPv6AtomicFragmentAlone: an atomic fragment (offset 0, M
// 0) is a whole packet, handled on its own as Linux's ipv6_frag_rcv and
// RFC 6946 say, even while fragments of the same identification are
// being reassembled. Before, it joined their datagram: its header and
// length replaced the first fragment's, neither RoCEv2 packet was
// checked and the datagram was reported "fragments missing".
func TestPcapCheckIPv6AtomicFragmentAlone(t *testing.T) {
	ip := roceIPv6(t, 3000)
	fr := fragments6(ip, 1448, 0xabcd, nil)
	atomic := fragments6(roceIPv6(t, 100), 1448, 0xabcd, nil)
	if len(atomic) != 1 {
		t.Fatalf("%d fragments, want 1 atomic fragment", len(atomic))
	}
	path := filepath.Join(t.TempDir(), "a.pcap")
	writeFrames(t, path, layers.LinkTypeEthernet, [][]byte{fr[0], atomic[0], fr[1], fr[2]}, 0)
	code, out, errOut := runIn(t, "pcap", "check", path)
	if code != cli.ExitOK {
		t.Errorf("exit %d, want %d\n%s%s", code, cli.ExitOK, out, errOut)
	}
	for _, w := range []string{"(reassembled from 1 IPv6 fragments, frames 2) ok",
		"(reassembled from 3 IPv6 fragments, frames 1, 3, 4) ok", "2 RoCEv2 (ICRC ok 2, bad 0)"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
		}
	}
}
