//go:build unix

package pcapcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rocelayer"
)

// cutFrame is a frame and how many of its bytes a capture kept (0: all).
type cutFrame struct {
	frame []byte
	keep  int
}

// writeCut writes an Ethernet pcap of frames, each cut to its keep bytes
// with its whole length recorded, as a capture with a snap length does.
func writeCut(t *testing.T, path string, frames []cutFrame) {
	t.Helper()
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		data := f.frame
		if f.keep > 0 {
			data = data[:f.keep]
		}
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(i)*1000), CaptureLength: len(data), Length: len(f.frame)}
		if err := w.WritePacket(ci, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// srcAddr matches the sample frames' source address and port (the ports
// differ from sample to sample).
var srcAddr = regexp.MustCompile(`192\.0\.2\.1:\d+ `)

// TestPcapCheckTruncated: frames cut by the capture's snap length are
// decoded as far as the capture kept them, counted as truncated, hidden by
// -q and do not fail the check, whether the cut leaves every header, falls
// inside an extension header or inside the BTH; a kept BTH with an
// undefined opcode, and a whole frame's bad ICRC next to truncated
// frames, still fail.
func TestPcapCheckTruncated(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	write := samples[10].Frame // RC_RDMA_WRITE_ONLY, 246 bytes, 171 of payload: BTH and RETH end at byte 70
	read := samples[16].Frame  // RC_RDMA_READ_RESPONSE_ONLY, 258 bytes
	ack := samples[17].Frame   // RC_ACKNOWLEDGE, 62 bytes
	dir := t.TempDir()
	cut := filepath.Join(dir, "cut.pcap")
	writeCut(t, cut, []cutFrame{
		{write, 128}, {write, 60}, {write, 50}, {read, 128}, {ack, 0}, {ack, 60}, {write, 40},
	})
	code, out, errOut := runIn(t, "pcap", "check", cut)
	out = srcAddr.ReplaceAllString(out, "")
	if code != cli.ExitOK {
		t.Fatalf("exit %d, want 0\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"#1 > 192.0.2.2:4791 RC_RDMA_WRITE_ONLY qpn=",
		" RETH[va=0x",
		"] pay=171 truncated by the capture (128 of 246 bytes): ICRC not checked\n",
		"#2 > 192.0.2.2:4791 RC_RDMA_WRITE_ONLY qpn=",
		" truncated by the capture (60 of 246 bytes, inside its RETH): ICRC not checked\n",
		"#3 > 192.0.2.2:4791 truncated by the capture (50 of 246 bytes, inside the BTH): ICRC not checked\n",
		"#4 > 192.0.2.2:4791 RC_RDMA_READ_RESPONSE_ONLY qpn=",
		"#5 > 192.0.2.2:4791 RC_ACKNOWLEDGE qpn=",
		"#6 > 192.0.2.2:4791 RC_ACKNOWLEDGE qpn=",
		" pay=0 truncated by the capture (60 of 62 bytes): ICRC not checked\n",
		// 40 bytes keep the UDP destination port, not the whole header.
		"#7 > 192.0.2.2:4791 truncated by the capture (40 of 246 bytes, inside the UDP header): ICRC not checked\n",
		"cut.pcap: 7 frames, 7 RoCEv2 (ICRC ok 1, bad 0), 0 other frames skipped, 6 truncated by the capture (ICRC not checked)\n",
		"total: 1 files, 7 frames, 7 RoCEv2 packets, 1 ok, 0 bad, 0 other frames skipped, 6 truncated by the capture (ICRC not checked)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "BAD") || strings.Contains(out, "FAIL") {
		t.Errorf("truncated frames reported bad:\n%s", out)
	}
	if code, out, _ := runIn(t, "pcap", "check", "-q", cut); code != cli.ExitOK || strings.Contains(out, "#") || !strings.Contains(out, "6 truncated by the capture") {
		t.Errorf("-q: exit %d, want 0, only the totals:\n%s", code, out)
	}

	// A kept BTH with an undefined opcode is malformed, cut or not; a
	// whole frame's bad ICRC fails among truncated frames.
	var undef bth.Opcode
	for undef = 0; undef.Valid(); undef++ {
	}
	badOp := append([]byte(nil), write...)
	badOp[14+20+8] = byte(undef)
	badICRC := append([]byte(nil), write...)
	badICRC[len(badICRC)-1] ^= 0xff
	mixed := filepath.Join(dir, "mixed.pcap")
	writeCut(t, mixed, []cutFrame{{write, 128}, {badOp, 128}, {badICRC, 0}})
	code, out, _ = runIn(t, "pcap", "check", "-q", mixed)
	out = srcAddr.ReplaceAllString(out, "")
	for _, want := range []string{
		"#2 > 192.0.2.2:4791 BAD: malformed: opcode 0x",
		"#3 > 192.0.2.2:4791 RC_RDMA_WRITE_ONLY",
		"BAD: ICRC mismatch",
		"3 RoCEv2 (ICRC ok 0, bad 2), 0 other frames skipped, 1 truncated by the capture (ICRC not checked)",
		"FAIL: 2 bad RoCEv2 packets:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("mixed: output lacks %q:\n%s", want, out)
		}
	}
	if code != cli.ExitFail || strings.Contains(out, "#1 ") {
		t.Errorf("mixed: exit %d, want 1, frame 1 not listed:\n%s", code, out)
	}
}
