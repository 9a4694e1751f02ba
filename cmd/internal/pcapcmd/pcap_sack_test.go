//go:build unix

package pcapcmd

import (
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/test/golden"
)

// TestPcapCheckSACK: a selective repeat NAK (an RC ACKNOWLEDGE whose AETH
// is followed by a SACK block) passes the check and is described with
// the PSNs the responder holds; a broken block is reported malformed.
func TestPcapCheckSACK(t *testing.T) {
	frames := readFrames(t, filepath.Join(golden.Dir(t), "rc_write_64.pcap"))
	ack := frames[22] // #23, an RC_ACKNOWLEDGE with psn 0xc8a712
	mk := func(block []byte) []byte {
		const ipOff, udpOff, bthOff = 14, 14 + 20, 14 + 20 + 8
		f := append([]byte(nil), ack[:len(ack)-4]...)
		f = append(f, block...)
		f = append(f, 0, 0, 0, 0)
		f[bthOff+12] = 0x60 // AETH (after the 12-byte BTH): NAK, PSN sequence error
		binary.BigEndian.PutUint16(f[ipOff+2:], uint16(len(f)-ipOff))
		binary.BigEndian.PutUint16(f[udpOff+4:], uint16(len(f)-udpOff))
		fixIPv4Checksum(f[ipOff:udpOff])
		if err := icrc.Put(f[ipOff:]); err != nil {
			t.Fatal(err)
		}
		return f
	}
	var b [aeth.SACKMaxSize]byte
	good := mk(b[:aeth.EncodeSACK(b[:], []uint32{0xb0000000, 0, 0, 1})])
	bad := mk([]byte{'S', 'R', 9, 1, 0, 0, 0, 0})
	dir := t.TempDir()
	okPath, badPath := filepath.Join(dir, "sack.pcap"), filepath.Join(dir, "bad.pcap")
	writeFrames(t, okPath, layers.LinkTypeEthernet, [][]byte{good}, 0)
	writeFrames(t, badPath, layers.LinkTypeEthernet, [][]byte{bad}, 0)
	code, out, errOut := runIn(t, "pcap", "check", okPath)
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	want := "AETH[NAK PSN_SEQ_ERROR msn=1] SACK[v1 bits=128 held=0xc8a713,0xc8a715-0xc8a716,0xc8a792] pay=20"
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	if code, out, _ := runIn(t, "pcap", "check", badPath); code != cli.ExitFail || !strings.Contains(out, "malformed") {
		t.Errorf("a broken SACK block: exit %d\n%s", code, out)
	}
	// Cut by the capture: the block is shown if the capture kept all of
	// it, and the frame is truncated, not bad, either way.
	for _, tt := range []struct {
		keep int
		want string
	}{
		{len(good) - 2, want + " truncated by the capture"},
		{len(good) - 10, "AETH[NAK PSN_SEQ_ERROR msn=1] pay=20 truncated by the capture"},
	} {
		cutPath := filepath.Join(dir, "cut.pcap")
		writeFrames(t, cutPath, layers.LinkTypeEthernet, [][]byte{good[:tt.keep]}, len(good))
		if code, out, _ := runIn(t, "pcap", "check", cutPath); code != cli.ExitOK || !strings.Contains(out, tt.want) {
			t.Errorf("SACK cut to %d bytes: exit %d, want 0, output lacks %q:\n%s", tt.keep, code, tt.want, out)
		}
	}
}
