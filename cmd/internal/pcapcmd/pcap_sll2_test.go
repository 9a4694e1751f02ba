//go:build unix

package pcapcmd

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// tcpdumpAny is a real `tcpdump -i any` capture (LINUX_SLL2) of two
// rocev2d endpoints on a namespace's loopback with GSO on; the .txt beside
// it has the commands that made it.
const tcpdumpAny = "testdata/tcpdump_any_sll2.pcap"

// tcpdumpAnyWant is what pcap check says of it, whatever the link type the
// same frames are written with.
const tcpdumpAnyWant = "45 frames, 40 RoCEv2 (ICRC ok 40, bad 0), 22 other frames skipped, 11 GSO datagrams split into their packets"

// sll2Frame is one frame of a LINUX_SLL2 capture, cut into its header
// fields and its network-layer packet.
type sll2Frame struct {
	ci    gopacket.CaptureInfo
	proto uint16 // EtherType
	pkt   []byte // from the IP header on
}

// readSLL2 reads a LINUX_SLL2 pcap (pcapgo reads its link type as 20).
func readSLL2(t *testing.T, path string) []sll2Frame {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []sll2Frame
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if len(data) < 20 {
			t.Fatalf("frame %d: %d bytes, shorter than the SLL2 header", len(out)+1, len(data))
		}
		ci.CaptureLength -= 20
		ci.Length -= 20
		out = append(out, sll2Frame{ci, binary.BigEndian.Uint16(data), append([]byte(nil), data[20:]...)})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no frames", path)
	}
	return out
}

// linkFraming is one link type to write the same packets with.
type linkFraming struct {
	name     string
	linkType uint32
	head     func(f sll2Frame) []byte // the link-layer header before f.pkt
}

// framings are the link types pcap check reads, each with its header.
var framings = []linkFraming{
	{"ethernet", 1, func(f sll2Frame) []byte {
		return []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, byte(f.proto >> 8), byte(f.proto)}
	}},
	{"linux sll", 113, func(f sll2Frame) []byte {
		return []byte{0, 0, 3, 4, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, byte(f.proto >> 8), byte(f.proto)}
	}},
	{"linux sll2", 276, func(f sll2Frame) []byte {
		return []byte{byte(f.proto >> 8), byte(f.proto), 0, 0, 0, 0, 0, 1, 3, 4, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0}
	}},
	{"raw", 101, func(sll2Frame) []byte { return nil }},
	{"ipv4", 228, func(sll2Frame) []byte { return nil }},
	{"bsd null", 0, func(sll2Frame) []byte { return []byte{2, 0, 0, 0} }}, // AF_INET, little-endian host
	{"openbsd loop", 108, func(sll2Frame) []byte { return []byte{0, 0, 0, 2} }},
}

// writeLinkType writes frames framed by fr as a classic pcap or a pcapng
// file. pcapgo's link types are 8 bits, so the header's link type is
// written in afterwards.
func writeLinkType(t *testing.T, path string, fr linkFraming, frames []sll2Frame, ng bool) {
	t.Helper()
	var buf bytes.Buffer
	var write func(gopacket.CaptureInfo, []byte) error
	var flush func() error
	if ng {
		w, err := pcapgo.NewNgWriter(&buf, layers.LinkType(fr.linkType&0xff))
		if err != nil {
			t.Fatal(err)
		}
		write, flush = w.WritePacket, w.Flush
	} else {
		w := pcapgo.NewWriter(&buf)
		if err := w.WriteFileHeader(65600, layers.LinkType(fr.linkType&0xff)); err != nil {
			t.Fatal(err)
		}
		write, flush = w.WritePacket, func() error { return nil }
	}
	for _, f := range frames {
		h := fr.head(f)
		ci := f.ci
		ci.CaptureLength += len(h)
		ci.Length += len(h)
		if err := write(ci, append(h, f.pkt...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if ng {
		// The Interface Description Block follows the Section Header
		// Block; its link type is 16 bits at offset 8.
		shb := binary.LittleEndian.Uint32(b[4:])
		if binary.LittleEndian.Uint32(b[shb:]) != 1 {
			t.Fatal("pcapgo's pcapng: no IDB after the SHB")
		}
		binary.LittleEndian.PutUint16(b[shb+8:], uint16(fr.linkType))
	} else {
		binary.LittleEndian.PutUint32(b[20:], fr.linkType)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPcapCheckTcpdumpAny checks the real tcpdump -i any capture, and the
// same packets written with every link type pcap check reads, as pcap and
// as pcapng: the same verdict for each (every GSO datagram split, every
// ICRC valid).
func TestPcapCheckTcpdumpAny(t *testing.T) {
	code, out, errOut := runIn(t, "pcap", "check", tcpdumpAny)
	if code != cli.ExitOK || !strings.Contains(out, tcpdumpAnyWant) {
		t.Fatalf("%s: exit %d, output lacks %q:\n%s%s", tcpdumpAny, code, tcpdumpAnyWant, out, errOut)
	}
	for _, want := range []string{
		" 127.0.0.1:55580 > 127.0.0.2:4791 RC_SEND_FIRST qpn=0x000011 psn=0x120007 pkey=0xffff pay=1024 icrc=0x4c983e46 ok (GSO segment 1/3 of a 3048-byte datagram)",
		" 127.0.0.1:55580 > 127.0.0.2:4791 RC_SEND_LAST qpn=0x000011 psn=0x120009 A pkey=0xffff pay=952 icrc=0x9a0d67bb ok (GSO segment 3/3 of a 3048-byte datagram)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	frames := readSLL2(t, tcpdumpAny)
	dir := t.TempDir()
	for _, fr := range framings {
		for _, ng := range []bool{false, true} {
			name := strings.ReplaceAll(fr.name, " ", "_")
			if ng {
				name += ".pcapng"
			} else {
				name += ".pcap"
			}
			path := filepath.Join(dir, name)
			writeLinkType(t, path, fr, frames, ng)
			code, out, errOut := runIn(t, "pcap", "check", "-q", path)
			if code != cli.ExitOK || !strings.Contains(out, tcpdumpAnyWant) {
				t.Errorf("%s: exit %d, output lacks %q:\n%s%s", name, code, tcpdumpAnyWant, out, errOut)
			}
		}
	}
	// A link type none reads is refused by its full number.
	bad := linkFraming{"dlt 147", 147, func(sll2Frame) []byte { return nil }}
	path := filepath.Join(dir, "user0.pcap")
	writeLinkType(t, path, bad, frames[:1], false)
	if code, _, errOut := runIn(t, "pcap", "check", path); code != cli.ExitUsage || !strings.Contains(errOut, "unsupported link type 147") {
		t.Errorf("link type 147: exit %d, %s", code, errOut)
	}
}
