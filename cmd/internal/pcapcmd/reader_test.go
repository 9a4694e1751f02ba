package pcapcmd

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// ngBlock returns a little-endian pcapng block of type typ with body b
// (padded to 4 bytes).
func ngBlock(typ uint32, b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	n := uint32(12 + len(b))
	out := binary.LittleEndian.AppendUint32(nil, typ)
	out = binary.LittleEndian.AppendUint32(out, n)
	out = append(out, b...)
	return binary.LittleEndian.AppendUint32(out, n)
}

// shbBlock returns a Section Header Block with a comment of n bytes (0: none).
func shbBlock(comment int) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 0x1a2b3c4d)
	b = append(b, 1, 0, 0, 0)                                     // version 1.0
	b = append(b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff) // section length unknown
	if comment > 0 {
		b = binary.LittleEndian.AppendUint16(b, 1) // opt_comment
		b = binary.LittleEndian.AppendUint16(b, uint16(comment))
		b = append(b, bytes.Repeat([]byte{'c'}, comment)...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		b = append(b, 0, 0, 0, 0) // opt_endofopt
	}
	return ngBlock(0x0a0d0d0a, b)
}

// idbBlock returns an Interface Description Block of link type lt.
func idbBlock(lt uint16) []byte {
	b := binary.LittleEndian.AppendUint16(nil, lt)
	b = append(b, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, 262144)
	return ngBlock(1, b)
}

// epbBlock returns an Enhanced Packet Block of frame f on interface iface.
func epbBlock(iface uint32, f []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, iface)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
	return ngBlock(6, append(b, f...))
}

// pcapFile returns a classic little-endian pcap of the frames with the
// given snap length and link-type field; each frame gets trailer bytes
// after it (an FCS).
func pcapFile(snap, lt uint32, trailer int, frames ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 0xa1b2c3d4)
	b = append(b, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, snap)
	b = binary.LittleEndian.AppendUint32(b, lt)
	for i, f := range frames {
		n := uint32(len(f) + trailer)
		b = binary.LittleEndian.AppendUint32(b, 1700000000)
		b = binary.LittleEndian.AppendUint32(b, uint32(i))
		b = binary.LittleEndian.AppendUint32(b, n)
		b = binary.LittleEndian.AppendUint32(b, n)
		b = append(b, f...)
		b = append(b, bytes.Repeat([]byte{0xee}, trailer)...)
	}
	return b
}

// TestPcapCheckReader: pcapng files with several interfaces of several
// link types (each frame decoded with its own interface's, frame numbers
// as Wireshark's), several sections, a first interface block beyond 4 KiB,
// and classic pcaps whose header's snap length is 0 or smaller than the
// records or whose link-type field has the FCS bits all check every
// frame; pcapng files cut inside a block or with a corrupt block are
// unreadable (exit 2) naming the frame, after the line of the frames read.
func TestPcapCheckReader(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	eth := samples[4].Frame
	raw := eth[14:]
	sll2 := append([]byte{0x08, 0x00, 0, 0, 0, 0, 0, 1, 0, 1, 4, 6, 2, 0, 0, 0, 0, 1, 0, 0}, raw...)
	badRaw := append([]byte(nil), raw...)
	badRaw[len(badRaw)-1] ^= 1
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	multi := cat(shbBlock(0), idbBlock(1), idbBlock(101), idbBlock(276),
		epbBlock(0, eth), epbBlock(1, raw), epbBlock(2, sll2), epbBlock(1, badRaw), epbBlock(0, eth))
	sections := cat(shbBlock(0), idbBlock(1), epbBlock(0, eth), shbBlock(0), idbBlock(101), epbBlock(0, raw), epbBlock(0, badRaw))
	big := cat(shbBlock(5000), idbBlock(276), epbBlock(0, sll2))
	twoGood := cat(shbBlock(0), idbBlock(1), epbBlock(0, eth), epbBlock(0, eth))
	huge := cat(shbBlock(0), idbBlock(1), epbBlock(0, eth))
	binary.LittleEndian.PutUint32(huge[len(huge)-len(epbBlock(0, eth))+8+12:], 0xfffffff0)
	short := cat(shbBlock(0), idbBlock(1), epbBlock(0, eth), ngBlock(6, nil)[:4], []byte{4, 0, 0, 0})
	tokenRing := cat(shbBlock(0), idbBlock(1), idbBlock(6), epbBlock(1, eth), epbBlock(0, eth))
	classicCut := pcapFile(65535, 1, 0, eth, eth)
	tests := []struct {
		name string
		file []byte
		code int
		want []string
	}{
		{"multi interface", multi, cli.ExitFail, []string{": 5 frames, 5 RoCEv2 (ICRC ok 4, bad 1)", "#2 192.0.2.", "#3 192.0.2.", "#5 192.0.2.", "FAIL: 1 bad RoCEv2 packets:\n  ", ".pcapng #4: ICRC mismatch"}},
		{"two sections", sections, cli.ExitFail, []string{": 3 frames, 3 RoCEv2 (ICRC ok 2, bad 1)", ".pcapng #3: ICRC mismatch"}},
		{"idb beyond 4 KiB", big, cli.ExitOK, []string{": 1 frames, 1 RoCEv2 (ICRC ok 1, bad 0)"}},
		{"cut inside a block", twoGood[:len(twoGood)-30], cli.ExitUsage, []string{": 1 frames, 1 RoCEv2 (ICRC ok 1, bad 0)", "frame 2: file ends inside a record", "total: 1 files, 1 frames"}},
		{"cut inside a block header", twoGood[:len(twoGood)-len(epbBlock(0, eth))+6], cli.ExitUsage, []string{"frame 2: file ends inside a record"}},
		{"huge captured length", huge, cli.ExitUsage, []string{"frame 1: corrupt block: captured length 4294967280 exceeds"}},
		{"block length 4", short, cli.ExitUsage, []string{"frame 2: corrupt block: block type 6 has length 4"}},
		{"unsupported interface", tokenRing, cli.ExitOK, []string{"#1 not decoded: unsupported link type 6", ": 2 frames, 1 RoCEv2 (ICRC ok 1, bad 0), 0 other frames skipped, 1 on interfaces of an unsupported link type"}},
		{"snaplen 0", pcapFile(0, 1, 0, eth, eth), cli.ExitOK, []string{": 2 frames, 2 RoCEv2 (ICRC ok 2, bad 0)"}},
		{"snaplen below records", pcapFile(60, 1, 0, eth, eth), cli.ExitOK, []string{": 2 frames, 2 RoCEv2 (ICRC ok 2, bad 0)"}},
		{"fcs bits", pcapFile(65535, 0x24000001, 4, eth, eth), cli.ExitOK, []string{": 2 frames, 2 RoCEv2 (ICRC ok 2, bad 0)"}},
		{"classic cut", classicCut[:len(classicCut)-5], cli.ExitUsage, []string{": 1 frames, 1 RoCEv2 (ICRC ok 1, bad 0)", "frame 2: file ends inside a record", "total: 1 files, 1 frames", "1 files cut short or corrupt"}},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ext := ".pcapng"
			if bytes.HasPrefix(tt.file, []byte{0xd4, 0xc3}) {
				ext = ".pcap"
			}
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+ext)
			if err := os.WriteFile(path, tt.file, 0o644); err != nil {
				t.Fatal(err)
			}
			code, out, errOut := runIn(t, "pcap", "check", path)
			if code != tt.code {
				t.Errorf("exit %d, want %d\n%s%s", code, tt.code, out, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out+errOut, w) {
					t.Errorf("output lacks %q:\n%s%s", w, out, errOut)
				}
			}
		})
	}
}

// TestPcapCheckFlagsAfterFiles: -q after the file names is the option, not
// a file ("open -q: no such file"); after -- it names a file.
func TestPcapCheckFlagsAfterFiles(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "a.pcap")
	if err := os.WriteFile(path, pcapFile(65535, 1, 0, samples[0].Frame), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args  []string
		code  int
		want  string
		lines int // lines of output (-1: not checked)
	}{
		{[]string{path, "-q"}, cli.ExitOK, "total: 1 files", 2},
		{[]string{"-q", path}, cli.ExitOK, "total: 1 files", 2},
		{[]string{path, path, "-q"}, cli.ExitOK, "total: 2 files", 3},
		{[]string{path, "--", "-q"}, cli.ExitUsage, "-q: no such file", -1},
		{[]string{path, "-x"}, cli.ExitUsage, "flag provided but not defined: -x", -1},
	}
	for _, tt := range tests {
		code, out, errOut := runIn(t, append([]string{"pcap", "check"}, tt.args...)...)
		if code != tt.code || !strings.Contains(out+errOut, tt.want) || tt.lines >= 0 && strings.Count(out, "\n") != tt.lines {
			t.Errorf("%v: exit %d (want %d), want %q in %d lines:\n%s%s", tt.args, code, tt.code, tt.want, tt.lines, out, errOut)
		}
	}
}
