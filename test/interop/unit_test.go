//go:build linux

package interop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
	"github.com/gorocev2/rocev2/test/goldendir"
)

// readNewc parses a newc archive back into name -> (mode, data, rdev).
func readNewc(t *testing.T, b []byte) (map[string]cpioEntry, []string) {
	t.Helper()
	out := map[string]cpioEntry{}
	var order []string
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	for {
		if off%4 != 0 {
			t.Fatalf("header at unaligned offset %d", off)
		}
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, b[off:off+6])
		}
		mode, size, rmaj, rmin, nsize := field(1), field(6), field(9), field(10), field(11)
		name := string(b[off+110 : off+110+int(nsize)-1])
		if b[off+110+int(nsize)-1] != 0 {
			t.Fatalf("%s: name not NUL-terminated", name)
		}
		doff := (off + 110 + int(nsize) + 3) &^ 3
		if name == "TRAILER!!!" {
			if (doff+int(size)+3)&^3 != len(b) {
				t.Fatalf("trailer ends at %d, archive is %d bytes", doff, len(b))
			}
			return out, order
		}
		out[name] = cpioEntry{mode: mode, data: b[doff : doff+int(size)], rmaj: rmaj, rmin: rmin}
		order = append(order, name)
		off = (doff + int(size) + 3) &^ 3
	}
}

func TestArchive(t *testing.T) {
	a := NewArchive()
	a.File("/init", 0o755, []byte("#!/bin/sh\n"))
	a.File("lib/modules/6.1/kernel/drivers/x.ko", 0o644, []byte("abcde"))
	a.Symlink("bin/sh", "/bin/busybox")
	a.Symlink("bin/sh", "/other") // existing paths are kept
	a.CharDev("dev/console", 0o600, 5, 1)
	a.Dir("tmp", 0o1777)
	var buf bytes.Buffer
	n, err := a.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteTo = %d, %v; wrote %d", n, err, buf.Len())
	}
	got, order := readNewc(t, buf.Bytes())
	want := map[string]struct {
		mode uint32
		data string
	}{
		"init":                                {modeReg | 0o755, "#!/bin/sh\n"},
		"lib":                                 {modeDir | 0o755, ""},
		"lib/modules":                         {modeDir | 0o755, ""},
		"lib/modules/6.1":                     {modeDir | 0o755, ""},
		"lib/modules/6.1/kernel":              {modeDir | 0o755, ""},
		"lib/modules/6.1/kernel/drivers":      {modeDir | 0o755, ""},
		"lib/modules/6.1/kernel/drivers/x.ko": {modeReg | 0o644, "abcde"},
		"bin":                                 {modeDir | 0o755, ""},
		"bin/sh":                              {modeLink | 0o777, "/bin/busybox"},
		"dev":                                 {modeDir | 0o755, ""},
		"dev/console":                         {modeChr | 0o600, ""},
		"tmp":                                 {modeDir | 0o1777, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries %v, want %d", len(got), order, len(want))
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || g.mode != w.mode || string(g.data) != w.data {
			t.Errorf("%s: got mode %o data %q, want mode %o data %q", name, g.mode, g.data, w.mode, w.data)
		}
	}
	if c := got["dev/console"]; c.rmaj != 5 || c.rmin != 1 {
		t.Errorf("dev/console rdev %d:%d, want 5:1", c.rmaj, c.rmin)
	}
	seen := map[string]bool{}
	for _, n := range order {
		if d := filepath.Dir(n); d != "." && !seen[d] {
			t.Errorf("%s comes before its directory %s", n, d)
		}
		seen[n] = true
	}
}

func TestOrderModules(t *testing.T) {
	graph := map[string][]string{
		"rdma_rxe":   {"ib_core", "ib_uverbs", "ip6_udp_tunnel", "udp_tunnel"},
		"ib_uverbs":  {"ib_core"},
		"ib_core":    nil,
		"udp_tunnel": nil, "ip6_udp_tunnel": nil,
		"virtio_net": {"net_failover"}, "net_failover": {"failover"}, "failover": nil,
		"crc32_pclmul": nil,
	}
	builtin := map[string]bool{"virtio_pci": true}
	lookup := func(n string) (string, []string, error) {
		if builtin[n] {
			return "", nil, nil
		}
		d, ok := graph[n]
		if !ok {
			return "", nil, errors.New("unknown module " + n)
		}
		return n + ".ko", d, nil
	}
	got, err := orderModules([]string{"virtio_pci", "virtio-net", "crc32-pclmul", "rdma_rxe"}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"failover.ko", "net_failover.ko", "virtio_net.ko", "crc32_pclmul.ko",
		"ib_core.ko", "ib_uverbs.ko", "ip6_udp_tunnel.ko", "udp_tunnel.ko", "rdma_rxe.ko"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order\n got %v\nwant %v", got, want)
	}
	if _, err := orderModules([]string{"nope"}, lookup); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("missing module: err = %v", err)
	}
	graph["ib_core"] = []string{"rdma_rxe"}
	if _, err := orderModules([]string{"rdma_rxe"}, lookup); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("cycle: err = %v", err)
	}
}

func TestModName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/crypto/crc32-pclmul.ko": "crc32_pclmul", "rdma_rxe.ko.xz": "rdma_rxe",
		"virtio_net": "virtio_net", "ib_core.ko.zst": "ib_core",
	} {
		if got := modName(in); got != want {
			t.Errorf("modName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestELFDeps(t *testing.T) {
	sh := "/bin/sh"
	if _, err := os.Stat(sh); err != nil {
		t.Skip("no /bin/sh")
	}
	libs, interp, err := elfDeps(sh)
	if err != nil {
		t.Skipf("elfDeps(%s): %v (not a glibc x86-64 system?)", sh, err)
	}
	if _, ok := libs["libc.so.6"]; !ok {
		t.Errorf("libs %v lack libc.so.6", libs)
	}
	if !strings.Contains(interp, "ld-linux") {
		t.Errorf("interpreter %q", interp)
	}
}

func TestAnalyzeCaptureGolden(t *testing.T) {
	dir := goldendir.Require(t)
	st, err := AnalyzeCapture(filepath.Join(dir, "rc_send_64.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	// rc_send_64.txt: 31 frames, 20 RoCEv2 packets between two VMs.
	if st.Frames != 31 || st.RoCE != 20 || st.BadICRC != 0 || st.Bad != 0 || st.FromHost != 0 || st.FromVM != 20 {
		t.Fatalf("stats %+v", st)
	}
	if st.Opcodes["vm   RC_SEND_ONLY"] != 10 || st.Opcodes["vm   RC_ACKNOWLEDGE"] != 10 {
		t.Fatalf("opcodes %v", st.Opcodes)
	}
	// A flipped payload bit must show up as a bad ICRC.
	b, err := os.ReadFile(filepath.Join(dir, "rc_send_64.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	// First record: 24-byte file header + 16-byte record header; find the
	// first frame to UDP 4791 and flip its last payload byte before the ICRC.
	off := 24
	for off+16 < len(b) {
		incl := int(binary.LittleEndian.Uint32(b[off+8:]))
		fr := b[off+16 : off+16+incl]
		if len(fr) > 42 && binary.BigEndian.Uint16(fr[36:38]) == 4791 {
			fr[len(fr)-5] ^= 1
			break
		}
		off += 16 + incl
	}
	bad := filepath.Join(t.TempDir(), "bad.pcap")
	if err := os.WriteFile(bad, b, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err = AnalyzeCapture(bad)
	if err != nil {
		t.Fatal(err)
	}
	if st.BadICRC != 1 || !strings.Contains(st.String(), "BAD: ICRC") {
		t.Fatalf("flipped bit: %d bad ICRC\n%s", st.BadICRC, st)
	}
}

func TestImmPeerRoundTrip(t *testing.T) {
	p := immPeer{qpn: 0x11, psn: 0xabcdef, rkey: 0x1234, vaddr: 0x7f0011223344,
		gid: [16]byte{10: 0xff, 11: 0xff, 12: 192, 13: 0, 14: 2, 15: 1}}
	b := p.encode()
	if len(b) != immMsgLen || !strings.HasPrefix(string(b), "RV2IMM1 000011 abcdef 00001234 00007f0011223344 00000000000000000000ffffc0000201\x00") {
		t.Fatalf("encode = %q", b)
	}
	q, err := parseImmPeer(b)
	if err != nil || q != p {
		t.Fatalf("parse = %+v, %v", q, err)
	}
	for _, bad := range []string{"", "RV2IMM2 1 2 3 4 00000000000000000000ffffc0000201", "RV2IMM1 1 2 3 4 abc",
		"RV2IMM1 1000000 2 3 4 00000000000000000000ffffc0000201", "RV2IMM1 1 2 3 4 zz000000000000000000ffffc0000201"} {
		if _, err := parseImmPeer([]byte(bad)); err == nil {
			t.Errorf("parseImmPeer(%q) accepted", bad)
		}
	}
}

func FuzzParseImmPeer(f *testing.F) {
	f.Add(immPeer{qpn: 0x11, psn: 1, rkey: 2, vaddr: 3}.encode())
	f.Add([]byte("RV2IMM1 x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseImmPeer(b)
		if err != nil {
			return
		}
		if q, err := parseImmPeer(p.encode()); err != nil || q != p {
			t.Fatalf("re-parse of %+v: %+v, %v", p, q, err)
		}
	})
}

func FuzzAnalyzeCapture(f *testing.F) {
	if dir, err := goldendir.Dir(); err == nil { // else the synthetic seed only
		for _, n := range []string{"rc_send_64.pcap", "rc_write_4096.pcap"} {
			if b, err := os.ReadFile(filepath.Join(dir, n)); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte{0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := analyze(bytes.NewReader(b))
		if err == nil && (s.RoCE > s.Frames || s.FromHost+s.FromVM != s.RoCE) {
			t.Fatalf("inconsistent stats %+v", s)
		}
		if s != nil {
			_ = s.String()
		}
	})
}

// TestAnalyzeHostileCapture: inputs the fuzzer found to cost gigabytes
// (a 2 GiB snap length that pcapgo would allocate per frame; a READ whose
// DMA length spans millions of packets) are refused or bounded and finish
// at once.
func TestAnalyzeHostileCapture(t *testing.T) {
	// pcap global header (magic, version 2.4, zone, sigfigs, snap length
	// 2 GiB, Ethernet), then a record header claiming a 2 GiB frame.
	hdr := []byte{0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 1, 0, 0, 0,
		1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 0, 0, 0, 0x7f}
	if _, err := analyze(bytes.NewReader(hdr)); err == nil || !strings.Contains(err.Error(), "snap length") {
		t.Fatalf("a 2 GiB frame: err %v, want a snap length error", err)
	}

	// A READ request for 2 GiB (2 M response PSNs at labMTU).
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	pkt := make([]byte, 64)
	n, err := packet.Build(pkt, &packet.Fields{
		BTH:  bth.Fields{Opcode: bth.RCReadRequest, DestQP: 0x11, PSN: 100},
		RETH: reth.Fields{VA: 0x1000, RKey: 1, DMALength: 1 << 31},
	})
	if err != nil {
		t.Fatal(err)
	}
	frame := gopacket.NewSerializeBuffer()
	eth := &layers.Ethernet{SrcMAC: []byte{2, 0, 0, 0, 0, 1}, DstMAC: []byte{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: []byte{192, 0, 2, 2}, DstIP: []byte{192, 0, 2, 3}}
	udp := &layers.UDP{SrcPort: 49152, DstPort: 4791}
	udp.SetNetworkLayerForChecksum(ip)
	if err := gopacket.SerializeLayers(frame, gopacket.SerializeOptions{FixLengths: true}, eth, ip, udp, gopacket.Payload(pkt[:n])); err != nil {
		t.Fatal(err)
	}
	b := frame.Bytes()
	if err := icrc.Put(b[14:]); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: len(b), Length: len(b)}, b); err != nil {
		t.Fatal(err)
	}
	// Unbounded, this filled a map with 2 M entries (hundreds of MiB);
	// bounded, to maxReadSpan, a few MiB.
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	s, err := analyze(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	if mib := (m1.TotalAlloc - m0.TotalAlloc) >> 20; mib > 64 {
		t.Fatalf("one 2 GiB READ request cost %d MiB of allocations to analyze", mib)
	}
	if s.Frames != 1 || s.RoCE != 1 || s.Bad != 0 || s.BadICRC != 0 {
		t.Fatalf("frames %d, RoCE %d, bad %d, bad ICRC %d: want the one READ request decoded and tracked", s.Frames, s.RoCE, s.Bad, s.BadICRC)
	}
}

func TestFailedSummary(t *testing.T) {
	rows := []row{
		{cell: "a", direction: "d", result: "PASS"},
		{cell: "nvmf loss", direction: "host", result: "FAIL", d: 2 * time.Second, counters: "connect\n  timed out " + strings.Repeat("x", 400)},
	}
	s := failedSummary(rows)
	if !strings.Contains(s, "1 of 2 rows") || !strings.Contains(s, "FAIL nvmf loss (host, 2.0s): connect timed out x") || strings.Contains(s, "FAIL a ") || len(s) > 420 {
		t.Errorf("summary:\n%s", s)
	}
	if s := failedSummary(rows[:1]); !strings.Contains(s, "outside the cells") {
		t.Errorf("no failed row: %s", s)
	}
}
