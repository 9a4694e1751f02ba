package pcapcmd

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// modifiedPcap returns a pcap in Kuznetzov's "modified" format (magic
// 0xa1b2cd34, 24-byte record headers: the standard 16, then interface
// index, protocol, packet type and a pad byte) in byte order bo.
func modifiedPcap(bo binary.AppendByteOrder, frames ...[]byte) []byte {
	b := bo.AppendUint32(nil, 0xa1b2cd34)
	b = bo.AppendUint16(b, 2)
	b = bo.AppendUint16(b, 4)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = bo.AppendUint32(b, 65535)
	b = bo.AppendUint32(b, 1)
	for i, f := range frames {
		b = bo.AppendUint32(b, 1700000000)
		b = bo.AppendUint32(b, uint32(i))
		b = bo.AppendUint32(b, uint32(len(f)))
		b = bo.AppendUint32(b, uint32(len(f)))
		b = bo.AppendUint32(b, 2)      // interface index
		b = bo.AppendUint16(b, 0x0800) // protocol
		b = append(b, 0, 0)            // packet type, pad
		b = append(b, f...)
	}
	return b
}

// TestPcapCheckModifiedPcap: a classic pcap in the "modified" format old
// Red Hat tcpdump wrote (tshark reads it) is checked frame by frame in
// either byte order; it was refused as "not a pcap or pcapng file: magic
// 0xa1b2cd34".
func TestPcapCheckModifiedPcap(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	eth := samples[4].Frame
	bad := append([]byte(nil), eth...)
	bad[len(bad)-1] ^= 1
	le := modifiedPcap(binary.LittleEndian, eth, samples[6].Frame, bad)
	tests := []struct {
		name string
		file []byte
		code int
		want []string
	}{
		{"little endian", le, cli.ExitFail, []string{": 3 frames, 3 RoCEv2 (ICRC ok 2, bad 1)", "#3: ICRC mismatch"}},
		{"big endian", modifiedPcap(binary.BigEndian, eth, eth), cli.ExitOK, []string{": 2 frames, 2 RoCEv2 (ICRC ok 2, bad 0)"}},
		{"cut inside a record header", le[:24+24+len(eth)+20], cli.ExitUsage, []string{": 1 frames, 1 RoCEv2 (ICRC ok 1, bad 0)", "frame 2: file ends inside a record"}},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".pcap")
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
