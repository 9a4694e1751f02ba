//go:build unix

package pcapcmd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/test/golden"
)

// readFrames reads a pcap's frames.
func readFrames(t *testing.T, path string) [][]byte {
	t.Helper()
	fr, _, err := golden.ReadPCAP(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]byte, len(fr))
	for i, f := range fr {
		out[i] = f.Data
	}
	return out
}

// writeFrames writes a pcap with the given link type; origLen, if > 0,
// gives every frame that original length (to fake a short snaplen).
func writeFrames(t *testing.T, path string, lt layers.LinkType, frames [][]byte, origLen int) {
	t.Helper()
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65535, lt); err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		n := len(f)
		if origLen > n {
			n = origLen
		}
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(i)*1000), CaptureLength: len(f), Length: n}
		if err := w.WritePacket(ci, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// corruptCopy copies the golden rc_write_64.pcap with frame num changed by
// mod and returns the new path.
func corruptCopy(t *testing.T, num int, mod func([]byte)) string {
	t.Helper()
	src := filepath.Join(golden.Dir(t), "rc_write_64.pcap")
	frames := readFrames(t, src)
	mod(frames[num-1])
	dst := filepath.Join(t.TempDir(), "corrupt.pcap")
	writeFrames(t, dst, layers.LinkTypeEthernet, frames, 0)
	return dst
}

func TestPcapCheckGolden(t *testing.T) {
	files := golden.PCAPs(t)
	code, out, errOut := runIn(t, append([]string{"pcap", "check"}, files...)...)
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"rc_write_64.pcap #20 192.0.2.3:49593 > 192.0.2.2:4791 RC_RDMA_WRITE_ONLY qpn=0x000015 psn=0xc8a712 A pkey=0xffff RETH[va=0x55d90dddb000 rkey=0x00000654 len=64] pay=64 icrc=0x6305d220 ok",
		"rc_write_64.pcap #23 192.0.2.2:49593 > 192.0.2.3:4791 RC_ACKNOWLEDGE qpn=0x000015 psn=0xc8a712 pkey=0xffff AETH[ACK credits=31 msn=1] pay=0 icrc=0x6c74e2aa ok",
		"rc_write_64.pcap: 50 frames, 10 RoCEv2 (ICRC ok 10, bad 0), 40 other frames skipped",
		"total: 17 files, 1162 frames, 803 RoCEv2 packets, 803 ok, 0 bad, 359 other frames skipped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out, "BAD") {
		t.Errorf("BAD in output:\n%s", out)
	}
	// -q prints only the totals for a clean capture.
	code, out, _ = runIn(t, "pcap", "check", "-q", files[0])
	if code != cli.ExitOK || strings.Count(out, "\n") != 2 {
		t.Errorf("-q: exit %d, output:\n%s", code, out)
	}
}

func TestPcapCheckCorrupt(t *testing.T) {
	tests := []struct {
		name string
		num  int
		mod  func([]byte)
		want string
	}{
		{"payload byte", 21, func(b []byte) { b[len(b)-10] ^= 0x01 }, "#21 192.0.2.3:49593 > 192.0.2.2:4791 RC_RDMA_WRITE_ONLY"},
		{"ICRC byte", 23, func(b []byte) { b[len(b)-1] ^= 0x80 }, "ICRC mismatch: stored 0xec74e2aa, computed 0x6c74e2aa"},
		{"PSN", 26, func(b []byte) { b[14+20+8+11]++ }, "#26"},
		{"IPv4 source", 24, func(b []byte) { b[14+15]++ }, "#24 192.0.2.3:49593"},
		{"unknown opcode", 22, func(b []byte) { b[14+20+8] = 0x1f }, "malformed: rocelayer: BTH: packet: unknown opcode"},
		{"TVer", 25, func(b []byte) { b[14+20+8+1] |= 0x01 }, "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := corruptCopy(t, tt.num, tt.mod)
			code, out, errOut := runIn(t, "pcap", "check", path)
			if code != cli.ExitFail {
				t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
			}
			if !strings.Contains(out, tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, out)
			}
			if !strings.Contains(out, "FAIL: 1 bad RoCEv2 packets:\n  "+path+" #") || !strings.Contains(out, "9 ok, 1 bad") {
				t.Errorf("bad packet not named in the summary:\n%s", out)
			}
		})
	}
	// A damaged IPv4 header would hide the UDP port: a RoCEv2 packet
	// behind it (a UDP header to port 4791 after 20 bytes) is named as a
	// bad packet with a malformed IP header (IHL 1: no header decodes;
	// IHL 15: the checksum over 60 bytes is wrong).
	for _, ihl := range []byte{1, 15} {
		path := corruptCopy(t, 21, func(b []byte) { b[14] = 0x40 | ihl })
		code, out, _ := runIn(t, "pcap", "check", path)
		if code != cli.ExitFail || !strings.Contains(out, "FAIL: 1 bad RoCEv2 packets:\n  "+path+" #21: malformed IP header: IPv4 header") {
			t.Errorf("IHL %d: exit %d\n%s", ihl, code, out)
		}
	}
	// Masked fields (TTL, ECN, UDP checksum, BTH FECN/BECN) do not
	// matter, as a router changes them (with the IPv4 checksum).
	path := corruptCopy(t, 20, func(b []byte) {
		b[14+8] = 1
		b[14+1] |= 3
		b[14+20+6] = 0x12
		b[14+20+8+4] = 0xc0
		fixIPv4Checksum(b[14 : 14+20])
	})
	if code, out, _ := runIn(t, "pcap", "check", path); code != cli.ExitOK {
		t.Errorf("masked fields changed: exit %d\n%s", code, out)
	}
}

func TestPcapCheckUnreadable(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pcap")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("not a capture "), 20), 0o644); err != nil {
		t.Fatal(err)
	}
	ng := filepath.Join(dir, "ng.pcapng")
	if err := os.WriteFile(ng, append([]byte{0x0a, 0x0d, 0x0d, 0x0a}, make([]byte, 60)...), 0o644); err != nil {
		t.Fatal(err)
	}
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.pcap")
	writeFrames(t, good, layers.LinkTypeEthernet, [][]byte{samples[0].Frame}, 0)
	raw, _ := os.ReadFile(good)
	cut := filepath.Join(dir, "cut.pcap")
	if err := os.WriteFile(cut, raw[:len(raw)-5], 0o644); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "tokenring.pcap")
	writeFrames(t, token, layers.LinkTypeTokenRing, [][]byte{samples[0].Frame}, 0)
	// A header with a 2 GiB snap length and a record claiming a 2 GiB
	// frame: pcapgo would allocate it before noticing the file is short.
	huge := filepath.Join(dir, "huge.pcap")
	if err := os.WriteFile(huge, []byte{0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 1, 0, 0, 0,
		1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 0, 0, 0, 0x7f}, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.pcap")
	short := filepath.Join(dir, "short.pcap")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte{0xd4, 0xc3, 0xb2, 0xa1, 2, 0}, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		files []string
		want  string
	}{
		{[]string{garbage}, "not a pcap or pcapng file"},
		// An empty file says so (it said "header: EOF").
		{[]string{empty}, empty + ": empty file, not a pcap or pcapng capture"},
		{[]string{short}, short + ": not a pcap or pcapng file: header: unexpected EOF (the file is shorter than a pcap header)"},
		{[]string{filepath.Join(dir, "missing.pcap")}, "no such file or directory"},
		{[]string{ng}, "pcapng"},
		{[]string{cut}, "frame 1: file ends inside a record"},
		{[]string{token}, "unsupported link type 6"},
		{[]string{huge}, "frame 1: corrupt record: captured length 2130706432 exceeds the maximum 262144"},
		{[]string{good, garbage}, garbage + ": not a pcap or pcapng file"},
	}
	for _, tt := range tests {
		code, out, errOut := runIn(t, append([]string{"pcap", "check"}, tt.files...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d (want 2), stderr lacks %q:\n%s%s", tt.files, code, tt.want, out, errOut)
		}
	}
}

// TestPcapCheckLinkTypes checks IPv6 frames, raw IP, IPv4/IPv6 link types,
// Linux SLL, a non-RoCE frame and a snaplen-truncated frame.
func TestPcapCheckLinkTypes(t *testing.T) {
	f := rocelayer.SampleFields(bth.RCReadResponseFirst, 5)
	ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
		SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
	udp := &layers.UDP{SrcPort: 0xc005, DstPort: rocelayer.Port}
	buf := gopacket.NewSerializeBuffer()
	if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, append([]gopacket.SerializableLayer{ip6, udp}, rocelayer.FromFields(&f)...)...); err != nil {
		t.Fatal(err)
	}
	raw6 := append([]byte(nil), buf.Bytes()...)
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	raw4 := samples[3].Frame[14:]
	sll := func(ipFrame []byte, etype uint16) []byte {
		h := make([]byte, 16, 16+len(ipFrame))
		h[1] = 4 // sent by us
		h[3] = 1 // ARPHRD_ETHER
		h[5] = 6
		h[14], h[15] = byte(etype>>8), byte(etype)
		return append(h, ipFrame...)
	}
	eth6 := append([]byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd}, raw6...)
	tcp := func() []byte {
		eth := &layers.Ethernet{SrcMAC: rocelayer.SampleSrcMAC, DstMAC: rocelayer.SampleDstMAC, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: rocelayer.SampleSrcIP, DstIP: rocelayer.SampleDstIP}
		tc := &layers.TCP{SrcPort: 4791, DstPort: 4791}
		_ = tc.SetNetworkLayerForChecksum(ip)
		b := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(b, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tc); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}()
	dir := t.TempDir()
	tests := []struct {
		name    string
		lt      layers.LinkType
		frames  [][]byte
		origLen int
		code    int
		want    string
	}{
		{"ethernet ipv6", layers.LinkTypeEthernet, [][]byte{eth6, tcp}, 0, cli.ExitOK, "1 RoCEv2 (ICRC ok 1, bad 0), 1 other frames skipped"},
		{"ipv6 addresses", layers.LinkTypeEthernet, [][]byte{eth6}, 0, cli.ExitOK, "[2001:db8::1]:49157 > [2001:db8::2]:4791 RC_RDMA_READ_RESPONSE_FIRST"},
		{"raw", layers.LinkTypeRaw, [][]byte{raw6, raw4}, 0, cli.ExitOK, "2 RoCEv2 (ICRC ok 2, bad 0)"},
		{"dlt raw 12", 12, [][]byte{raw4}, 0, cli.ExitOK, "1 RoCEv2 (ICRC ok 1, bad 0)"},
		{"ipv4", layers.LinkTypeIPv4, [][]byte{raw4}, 0, cli.ExitOK, "1 RoCEv2 (ICRC ok 1, bad 0)"},
		{"ipv6", layers.LinkTypeIPv6, [][]byte{raw6}, 0, cli.ExitOK, "1 RoCEv2 (ICRC ok 1, bad 0)"},
		{"sll", layers.LinkTypeLinuxSLL, [][]byte{sll(raw4, 0x0800), sll(raw6, 0x86dd)}, 0, cli.ExitOK, "2 RoCEv2 (ICRC ok 2, bad 0)"},
		{"snaplen", layers.LinkTypeEthernet, [][]byte{samples[3].Frame[:60]}, len(samples[3].Frame), cli.ExitOK, "RC_SEND_LAST_WITH_IMMEDIATE qpn=0x000014 psn=0xfffff9 A pkey=0xffff ImmDt=0x11220003 pay=112 truncated by the capture (60 of 174 bytes): ICRC not checked"},
	}
	for _, tt := range tests {
		path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".pcap")
		writeFrames(t, path, tt.lt, tt.frames, tt.origLen)
		code, out, errOut := runIn(t, "pcap", "check", path)
		if code != tt.code || !strings.Contains(out, tt.want) {
			t.Errorf("%s: exit %d (want %d), output lacks %q:\n%s%s", tt.name, code, tt.code, tt.want, out, errOut)
		}
	}
}

func TestWriteSample(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.pcap")
	code, out, errOut := runIn(t, "pcap", "write-sample", path)
	if code != cli.ExitOK || !strings.Contains(out, "wrote 38 frames") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runIn(t, "pcap", "check", path)
	if code != cli.ExitOK || !strings.Contains(out, "38 RoCEv2 (ICRC ok 38, bad 0)") || !strings.Contains(out, " CNP qpn=") {
		t.Errorf("check of the sample: exit %d\n%s", code, out)
	}
	// Reproducible: a second run writes the same bytes.
	path2 := filepath.Join(t.TempDir(), "s2.pcap")
	runIn(t, "pcap", "write-sample", path2)
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(path2)
	if !bytes.Equal(a, b) {
		t.Error("write-sample is not reproducible")
	}
	if code, _, errOut := runIn(t, "pcap", "write-sample", filepath.Join(t.TempDir(), "no", "such", "dir.pcap")); code != cli.ExitUsage || !strings.Contains(errOut, "no such file") {
		t.Errorf("unwritable: exit %d %s", code, errOut)
	}
}

// TestBinary builds rocev2d and checks its exit statuses as a process
// (pcap check's, and help's).
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	files := golden.PCAPs(t)
	bin := clitest.BuildRocev2d(t)
	garbage := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(garbage, []byte("garbage, not a pcap, definitely long enough"), 0o644); err != nil {
		t.Fatal(err)
	}
	corrupt := corruptCopy(t, 27, func(b []byte) { b[14+20+8+16+20] ^= 0x04 })
	tests := []struct {
		args []string
		code int
		want string
	}{
		{append([]string{"pcap", "check"}, files...), 0, "803 ok, 0 bad"},
		{[]string{"pcap", "check", corrupt}, 1, corrupt + " #27: ICRC mismatch"},
		{[]string{"pcap", "check", garbage}, 2, "not a pcap or pcapng file"},
		{[]string{"help"}, 0, "pcap"},
	}
	for _, tt := range tests {
		cmd := exec.Command(bin, tt.args...)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tt.code || !strings.Contains(string(out), tt.want) {
			t.Errorf("rocev2d %v: exit %d (want %d), output lacks %q:\n%s", tt.args[:2], code, tt.code, tt.want, out)
		}
	}
}

// TestPcapCheckPcapng: a pcapng capture (what current tcpdump/Wireshark
// write) of every sample opcode checks clean, and a corrupted copy fails
// naming the frame.
func TestPcapCheckPcapng(t *testing.T) {
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	write := func(path string, corrupt int) {
		var buf bytes.Buffer
		w, err := pcapgo.NewNgWriter(&buf, layers.LinkTypeEthernet)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range samples {
			f := append([]byte(nil), s.Frame...)
			if i == corrupt {
				f[len(f)-5] ^= 0x01 // last payload/pad byte before the ICRC
			}
			ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(i)*1000), CaptureLength: len(f), Length: len(f), InterfaceIndex: 0}
			if err := w.WritePacket(ci, f); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.pcapng"), filepath.Join(dir, "bad.pcapng")
	write(good, -1)
	write(bad, 3)
	if code, out, errOut := runIn(t, "pcap", "check", good); code != cli.ExitOK || !strings.Contains(out, fmt.Sprintf("%d RoCEv2", len(samples))) {
		t.Errorf("pcapng samples: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runIn(t, "pcap", "check", bad); code != 1 || !strings.Contains(out+errOut, "#4 ") {
		t.Errorf("corrupted pcapng: exit %d (want 1), frame #4 not named\n%s%s", code, out, errOut)
	}
}
