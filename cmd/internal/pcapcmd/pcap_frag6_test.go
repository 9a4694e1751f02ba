//go:build unix

package pcapcmd

import (
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/icrc"
)

// roceIPv6 returns an IPv6 RoCEv2 packet (RC SEND_ONLY with n payload
// bytes, 2001:db8::1 to 2001:db8::2) with its ICRC.
func roceIPv6(t *testing.T, n int) []byte {
	t.Helper()
	v4 := roceIPv4(t, n)
	udp := v4[20:] // the UDP datagram, ICRC included
	ip := make([]byte, 40, 40+len(udp))
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
	ip[6], ip[7] = protoUDP, 64
	copy(ip[8:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	copy(ip[24:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})
	ip = append(ip, udp...)
	if err := icrc.Put(ip); err != nil {
		t.Fatal(err)
	}
	return ip
}

// ethIPv6 wraps an IPv6 packet in an Ethernet header.
func ethIPv6(ip []byte) []byte {
	return append([]byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd}, ip...)
}

// fragments6 cuts IPv6 packet ip (no extension headers; ext, if not nil,
// is put before the Fragment header as a Hop-by-Hop header) into
// fragments of at most size bytes of payload (a multiple of 8) with
// identification id, as Linux does.
func fragments6(ip []byte, size int, id uint32, ext []byte) [][]byte {
	pay := ip[40:]
	var out [][]byte
	for off := 0; off < len(pay) || off == 0; off += size {
		end := min(off+size, len(pay))
		f := append([]byte(nil), ip[:40]...)
		if ext != nil {
			f[6] = ipv6HopByHop
			f = append(f, ext...)
			f[40] = protoFrag6
		} else {
			f[6] = protoFrag6
		}
		fh := make([]byte, 8)
		fh[0] = ip[6]
		fo := uint16(off)
		if end < len(pay) {
			fo |= 1
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], id)
		f = append(append(f, fh...), pay[off:end]...)
		binary.BigEndian.PutUint16(f[4:], uint16(len(f)-40))
		out = append(out, ethIPv6(f))
	}
	return out
}

// TestPcapCheckIPv6Fragments: the IPv6 fragments of a RoCEv2 packet are
// reassembled (in any order; an atomic fragment too) and the packet's
// ICRC checked, as Linux reassembles them before UDP sees them. Before,
// the packet was "not reassembled, ICRC not checked", a wrong ICRC in
// fragments passed unseen, and the later fragments were counted as "IPv4
// fragments held for reassembly".
func TestPcapCheckIPv6Fragments(t *testing.T) {
	ip := roceIPv6(t, 3000)
	bad := append([]byte(nil), ip...)
	bad[len(bad)-1] ^= 1
	fr := fragments6(ip, 1448, 0xabcd, nil)
	hbh := []byte{0, 0, 1, 4, 0, 0, 0, 0} // next header set by fragments6, PadN
	other := roceIPv6(t, 100)
	tests := []struct {
		name   string
		frames [][]byte
		code   int
		want   []string
	}{
		{"in order", fr, cli.ExitOK, []string{"#1 IPv6 fragment of a RoCEv2 packet: held for reassembly",
			"#3 [2001:db8::1]:49169 > [2001:db8::2]:4791 RC_SEND_ONLY", "pay=3000", "(reassembled from 3 IPv6 fragments, frames 1, 2, 3) ok",
			": 3 frames, 1 RoCEv2 (ICRC ok 1, bad 0), 0 other frames skipped, 2 IP fragments held for reassembly"}},
		{"reversed, another packet between", [][]byte{fr[2], fr[1], ethIPv6(other), fr[0]}, cli.ExitOK, []string{"(reassembled from 3 IPv6 fragments, frames 1, 2, 4) ok", "2 RoCEv2 (ICRC ok 2, bad 0)"}},
		{"bad ICRC", fragments6(bad, 1448, 7, nil), cli.ExitFail, []string{"#3 [2001:db8::1]:49169 > [2001:db8::2]:4791 RC_SEND_ONLY", "(reassembled from 3 IPv6 fragments, frames 1, 2, 3) BAD: ICRC mismatch", "1 RoCEv2 (ICRC ok 0, bad 1)"}},
		{"missing", fr[:2], cli.ExitOK, []string{"#2 RoCEv2 packet in IPv6 fragments (frames 1, 2): not reassembled (fragments missing), ICRC not checked", "1 RoCEv2 not checked"}},
		{"atomic fragment", fragments6(other, 1448, 9, nil), cli.ExitOK, []string{"#1 [2001:db8::1]:49169 > [2001:db8::2]:4791 RC_SEND_ONLY", "(reassembled from 1 IPv6 fragments, frames 1) ok"}},
		{"hop-by-hop before", fragments6(ip, 1448, 5, hbh), cli.ExitOK, []string{"#3 RoCEv2 packet after IPv6 extension headers (Hop-by-Hop): ICRC not checked", "1 RoCEv2 not checked"}},
	}
	dir := t.TempDir()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "f"+string(rune('a'+i))+".pcap")
			writeFrames(t, path, layers.LinkTypeEthernet, tt.frames, 0)
			code, out, errOut := runIn(t, "pcap", "check", path)
			if code != tt.code {
				t.Errorf("exit %d, want %d\n%s%s", code, tt.code, out, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
				}
			}
			if strings.Contains(out, "IPv4 fragment") {
				t.Errorf("IPv6 fragments named IPv4's:\n%s", out)
			}
		})
	}
}
