//go:build unix

package pcapcmd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestPcapCheckOverlappingFragments: Linux discards a datagram with
// overlapping fragments (inet_frag_queue_insert's IPFRAG_OVERLAP, RFC
// 5722 for IPv6) and drops only a fragment wholly inside what it holds
// (IPFRAG_DUP). check reassembles "as Linux does": a datagram with an
// overlap is not reassembled (named, not checked), an exact duplicate
// changes nothing. Before, overlapping fragments were laid over each
// other and the result's ICRC called ok, a packet no receiver sees.
func TestPcapCheckOverlappingFragments(t *testing.T) {
	ip := roceIPv6(t, 3000)
	fr := fragments6(ip, 1448, 0x77, nil)
	other := fragments6(ip, 1000, 0x77, nil) // [1000, 2000) overlaps [0, 1448) and [1448, 2896)
	tests := []struct {
		name   string
		frames [][]byte
		want   []string
	}{
		{"overlap", [][]byte{fr[0], other[1], fr[1], fr[2]}, []string{
			"RoCEv2 packet in IPv6 fragments (frames 1, 2, 3, 4): not reassembled (overlapping fragments), ICRC not checked",
			"1 RoCEv2 (ICRC ok 0, bad 0)", "1 RoCEv2 not checked"}},
		{"duplicate", [][]byte{fr[0], fr[1], fr[1], fr[2]}, []string{
			"(reassembled from 3 IPv6 fragments, frames 1, 2, 3, 4) ok", "1 RoCEv2 (ICRC ok 1, bad 0)"}},
	}
	dir := t.TempDir()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "o"+string(rune('a'+i))+".pcap")
			writeFrames(t, path, layers.LinkTypeEthernet, tt.frames, 0)
			code, out, errOut := runIn(t, "pcap", "check", path)
			if code != cli.ExitOK {
				t.Errorf("exit %d, want %d\n%s%s", code, cli.ExitOK, out, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
				}
			}
		})
	}
}
