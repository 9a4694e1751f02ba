package pcapcmd

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// gzipped returns b gzip-compressed (as gzip(1) or Wireshark writes it).
func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPcapCheckCompressed: a gzip-compressed pcap or pcapng (tshark and
// Wireshark read them) is checked as the file it holds (it was refused as
// "not a pcap or pcapng file: magic 0x08088b1f"); a gzip stream cut short
// or with a bad checksum is a damaged file (exit 2); the compressions
// check does not read are named.
func TestPcapCheckCompressed(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	eth := samples[4].Frame
	badEth := append([]byte(nil), eth...)
	badEth[len(badEth)-1] ^= 1
	classic := pcapFile(65535, 1, 0, eth, eth, badEth)
	ng := bytes.Join([][]byte{shbBlock(0), idbBlock(101), idbBlock(1), epbBlock(1, eth), epbBlock(0, eth[14:])}, nil)
	gzClassic := gzipped(t, classic)
	badSum := append([]byte(nil), gzClassic...)
	badSum[len(badSum)-8] ^= 1 // the CRC-32 of the trailer
	tests := []struct {
		name string
		file []byte
		code int
		want []string
	}{
		{"gzip pcap", gzClassic, cli.ExitFail, []string{": 3 frames, 3 RoCEv2 (ICRC ok 2, bad 1)", "#3: ICRC mismatch"}},
		{"gzip pcapng", gzipped(t, ng), cli.ExitOK, []string{": 2 frames, 2 RoCEv2 (ICRC ok 2, bad 0)"}},
		{"gzip cut", gzClassic[:len(gzClassic)*2/3], cli.ExitUsage, []string{"file ends inside a record", "1 files cut short or corrupt"}},
		{"gzip bad checksum", badSum, cli.ExitUsage, []string{": 3 frames, 3 RoCEv2 (ICRC ok 2, bad 1)", "frame 4: gzip: invalid checksum"}},
		{"gzip of text", gzipped(t, []byte("hello\n")), cli.ExitUsage, []string{"gzip-compressed file: not a pcap or pcapng file"}},
		{"zstd", append([]byte{0x28, 0xb5, 0x2f, 0xfd}, classic...), cli.ExitUsage, []string{"not a pcap or pcapng file: zstd-compressed (decompress it first: zstd -d)"}},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".gz")
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
