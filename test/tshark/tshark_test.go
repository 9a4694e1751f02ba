// Package tshark checks the project's RoCEv2 frames against Wireshark's
// dissector: `rocev2d pcap write-sample` writes one packet of every RC
// (but FLUSH and ATOMIC_WRITE, which tshark 4.0 does not decode), UC and UD
// opcode and a CNP; tshark must decode every one without malformed
// or expert-info packets and report the field values that were written.
//
// Tests only, on top: it builds and runs the rocev2d command and compares
// with rocelayer's sample frames, reading captures with test/golden.
// Nothing imports it.
package tshark

import (
	"bytes"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/test/golden"
)

// needTshark returns tshark's path, skipping (or failing under CI=true) if
// it is not installed.
func needTshark(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("tshark")
	if err != nil {
		msg := "TSHARK NOT INSTALLED (apt-get install tshark): the Wireshark cross-check did NOT run"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// repoRoot walks up from the working directory to the directory with go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	d, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		p := filepath.Dir(d)
		if p == d {
			t.Fatal("no go.mod above the test directory")
		}
		d = p
	}
}

// runCmd runs a command with a time limit and returns its stdout.
func runCmd(t *testing.T, dir string, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s %s: %v\nstderr:\n%s", name, strings.Join(args, " "), err, stderr.String())
		}
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s %s: timed out", name, strings.Join(args, " "))
	}
	return stdout.Bytes()
}

// writeSample builds rocev2d and runs `rocev2d pcap write-sample`.
func writeSample(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "rocev2d")
	runCmd(t, repoRoot(t), "go", "build", "-o", bin, "./cmd/rocev2d")
	file := filepath.Join(dir, "sample.pcap")
	runCmd(t, dir, bin, "pcap", "write-sample", file)
	return file
}

// fields are the tshark fields compared, in -e order.
var fields = []string{
	"frame.number",
	"infiniband.bth.opcode",
	"infiniband.bth.se",
	"infiniband.bth.m",
	"infiniband.bth.padcnt",
	"infiniband.bth.tver",
	"infiniband.bth.p_key",
	"infiniband.bth.destqp",
	"infiniband.bth.a",
	"infiniband.bth.psn",
	"infiniband.reth.va",
	"infiniband.reth.r_key",
	"infiniband.reth.dmalen",
	"infiniband.atomiceth.swapdt",
	"infiniband.atomiceth.cmpdt",
	"infiniband.aeth.syndrome",
	"infiniband.aeth.msn",
	"infiniband.atomicacketh.origremdt",
	"infiniband.immdt",
	"infiniband.ieth",
	"infiniband.deth.q_key",
	"infiniband.deth.srcqp",
	"infiniband.invariant.crc",
}

// absent marks a field tshark must not report.
const absent = ^uint64(0)

// expected returns the value tshark must report for each field of a sample
// frame (absent for headers the opcode does not carry).
func expected(num int, f *packet.Fields) map[string]uint64 {
	in := f.BTH.Opcode.Info()
	b2u := func(b bool) uint64 {
		if b {
			return 1
		}
		return 0
	}
	m := map[string]uint64{
		"frame.number":          uint64(num),
		"infiniband.bth.opcode": uint64(f.BTH.Opcode),
		"infiniband.bth.se":     b2u(f.BTH.SolicitedEvent),
		"infiniband.bth.m":      b2u(f.BTH.MigReq),
		"infiniband.bth.padcnt": uint64(bth.PadFor(len(f.Payload))),
		"infiniband.bth.tver":   uint64(f.BTH.TVer),
		"infiniband.bth.p_key":  uint64(f.BTH.PKey),
		"infiniband.bth.destqp": uint64(f.BTH.DestQP),
		"infiniband.bth.a":      b2u(f.BTH.AckReq),
		"infiniband.bth.psn":    uint64(f.BTH.PSN),
	}
	for _, k := range fields[10:] {
		m[k] = absent
	}
	h := in.Headers
	if h&bth.HdrRETH != 0 {
		m["infiniband.reth.va"] = f.RETH.VA
		m["infiniband.reth.r_key"] = uint64(f.RETH.RKey)
		m["infiniband.reth.dmalen"] = uint64(f.RETH.DMALength)
	}
	if h&bth.HdrAtomicETH != 0 { // Wireshark shows the AtomicETH VA and R_Key with the RETH fields
		m["infiniband.reth.va"] = f.AtomicETH.VA
		m["infiniband.reth.r_key"] = uint64(f.AtomicETH.RKey)
		m["infiniband.atomiceth.swapdt"] = f.AtomicETH.SwapAdd
		m["infiniband.atomiceth.cmpdt"] = f.AtomicETH.Compare
	}
	if h&bth.HdrAETH != 0 {
		m["infiniband.aeth.syndrome"] = uint64(f.AETH.Syndrome)
		m["infiniband.aeth.msn"] = uint64(f.AETH.MSN)
	}
	if h&bth.HdrAtomicAckETH != 0 {
		m["infiniband.atomicacketh.origremdt"] = f.AtomicAckOrig
	}
	if h&bth.HdrImmDt != 0 {
		m["infiniband.immdt"] = uint64(f.Imm)
	}
	if h&bth.HdrIETH != 0 {
		m["infiniband.ieth"] = uint64(f.IETHRKey)
	}
	if h&bth.HdrDETH != 0 {
		m["infiniband.deth.q_key"] = uint64(f.DETH.QKey)
		m["infiniband.deth.srcqp"] = uint64(f.DETH.SrcQP)
	}
	return m
}

// parseValue parses a tshark field value: decimal, 0x-hex, hex bytes
// (FT_BYTES such as immdt, ieth) or a boolean.
func parseValue(field, v string) (uint64, error) {
	switch v {
	case "":
		return absent, nil
	case "True", "true":
		return 1, nil
	case "False", "false":
		return 0, nil
	}
	if field == "infiniband.immdt" || field == "infiniband.ieth" {
		return strconv.ParseUint(strings.ReplaceAll(v, ":", ""), 16, 64)
	}
	return strconv.ParseUint(v, 0, 64)
}

func TestTsharkDecodesSample(t *testing.T) {
	tshark := needTshark(t)
	file := writeSample(t)

	// The file holds exactly the sample frames.
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	frames, lt, err := golden.ReadPCAP(file)
	if err != nil {
		t.Fatal(err)
	}
	if lt != rocelayer.LinkTypeEthernet || len(frames) != len(samples) {
		t.Fatalf("sample file: link type %v, %d frames, want %d", lt, len(frames), len(samples))
	}
	seen := map[bth.Transport]int{}
	for i, fr := range frames {
		if !bytes.Equal(fr.Data, samples[i].Frame) {
			t.Fatalf("frame %d differs from rocelayer.SampleFrames", fr.Num)
		}
		seen[samples[i].Fields.BTH.Opcode.Info().Transport]++
	}
	if seen[bth.TransportRC] < 20 || seen[bth.TransportUC] < 10 || seen[bth.TransportUD] < 2 || seen[bth.TransportCNP] != 1 {
		t.Fatalf("sample opcodes per transport: %v", seen)
	}

	// tshark knows every field we ask for.
	known := string(runCmd(t, "", tshark, "-G", "fields"))
	for _, f := range fields {
		if !strings.Contains(known, "\t"+f+"\t") {
			t.Fatalf("this tshark has no field %s", f)
		}
	}

	args := []string{"-r", file, "-n", "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	args = append(args, "-e", "_ws.col.Protocol")
	out := strings.TrimRight(string(runCmd(t, "", tshark, args...)), "\n")
	lines := strings.Split(out, "\n")
	if len(lines) != len(samples) {
		t.Fatalf("tshark printed %d lines for %d frames:\n%s", len(lines), len(samples), out)
	}
	for i, line := range lines {
		s := &samples[i]
		where := fmt.Sprintf("frame %d (%v)", i+1, s.Fields.BTH.Opcode)
		vals := strings.Split(line, "\t")
		if len(vals) != len(fields)+1 {
			t.Fatalf("%s: %d columns: %q", where, len(vals), line)
		}
		if proto := vals[len(fields)]; proto != "RRoCE" && proto != "RoCE" && !strings.Contains(proto, "IB") {
			t.Errorf("%s: protocol column %q, want RRoCE", where, proto)
		}
		want := expected(i+1, &s.Fields)
		want["infiniband.invariant.crc"] = absent
		if s.Fields.BTH.Opcode != bth.CNP {
			// Wireshark reads the little-endian ICRC trailer as big-endian.
			var b rocelayer.BTH
			want["infiniband.invariant.crc"] = uint64(bits.ReverseBytes32(decodeICRC(t, s.Frame, &b)))
		}
		for j, f := range fields {
			got, err := parseValue(f, vals[j])
			if err != nil {
				t.Errorf("%s: %s = %q: %v", where, f, vals[j], err)
				continue
			}
			if got != want[f] {
				t.Errorf("%s: tshark %s = %q, wrote %s", where, f, vals[j], show(want[f]))
			}
		}
	}

	// No malformed packets and no expert infos at all.
	bad := strings.TrimSpace(string(runCmd(t, "", tshark, "-r", file, "-n", "-Y", "_ws.malformed || _ws.expert",
		"-T", "fields", "-e", "frame.number", "-e", "_ws.expert.message")))
	if bad != "" {
		t.Errorf("tshark reports malformed/expert packets:\n%s", bad)
	}
	expert := strings.TrimSpace(string(runCmd(t, "", tshark, "-r", file, "-n", "-q", "-z", "expert")))
	if expert != "" {
		t.Errorf("tshark -z expert:\n%s", expert)
	}
}

// TestTsharkDetectsMalformed makes sure the malformed check above can fail:
// a frame whose opcode promises a RETH that is not there is flagged.
func TestTsharkDetectsMalformed(t *testing.T) {
	tshark := needTshark(t)
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	fr := append([]byte(nil), samples[0].Frame...) // RC_SEND_FIRST with 1 byte of payload
	if samples[0].Fields.BTH.Opcode != bth.RCSendFirst || len(samples[0].Fields.Payload) != 1 {
		t.Fatalf("unexpected first sample %v", samples[0].Fields.BTH.Opcode)
	}
	fr[14+20+8] = byte(bth.RCWriteOnly)
	file := filepath.Join(t.TempDir(), "bad.pcap")
	if err := writePCAP(file, fr); err != nil {
		t.Fatal(err)
	}
	bad := strings.TrimSpace(string(runCmd(t, "", tshark, "-r", file, "-n", "-Y", "_ws.malformed || _ws.expert",
		"-T", "fields", "-e", "frame.number")))
	if bad != "1" {
		t.Errorf("tshark did not flag a truncated RETH: %q", bad)
	}
}

func show(v uint64) string {
	if v == absent {
		return "nothing"
	}
	return fmt.Sprintf("%d (%#x)", v, v)
}

// decodeICRC returns the ICRC stored in a sample frame.
func decodeICRC(t *testing.T, frame []byte, b *rocelayer.BTH) uint32 {
	t.Helper()
	if err := b.DecodeFromBytes(frame[14+20+8:], gopacket.NilDecodeFeedback); err != nil {
		t.Fatal(err)
	}
	return b.ICRC
}

// writePCAP writes frames to a new Ethernet pcap file.
func writePCAP(name string, frames ...[]byte) error {
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		return err
	}
	for i, f := range frames {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(i)*1000), CaptureLength: len(f), Length: len(f)}
		if err := w.WritePacket(ci, f); err != nil {
			return err
		}
	}
	return os.WriteFile(name, buf.Bytes(), 0o644)
}

// TestTsharkGolden compares tshark's view of every RoCEv2 packet of the
// golden captures with packet.Parse's, and requires no malformed or expert
// info on them.
func TestTsharkGolden(t *testing.T) {
	tshark := needTshark(t)
	if testing.Short() {
		t.Skip("-short: one tshark run per golden capture takes ~10 s")
	}
	total := 0
	for _, path := range golden.PCAPs(t) {
		name := filepath.Base(path)
		frames, _, err := golden.ReadPCAP(path)
		if err != nil {
			t.Fatal(err)
		}
		want := map[int]map[string]uint64{}
		for _, fr := range frames {
			gp := gopacket.NewPacket(fr.Data, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
			udp, _ := gp.Layer(layers.LayerTypeUDP).(*layers.UDP)
			if udp == nil || udp.DstPort != rocelayer.Port {
				continue
			}
			var pk packet.Packet
			if err := pk.Parse(udp.Payload); err != nil {
				t.Fatalf("%s #%d: %v", name, fr.Num, err)
			}
			f := pk.Fields()
			m := expected(fr.Num, &f)
			m["infiniband.invariant.crc"] = uint64(bits.ReverseBytes32(pk.ICRC))
			want[fr.Num] = m
		}
		// The fields are the InfiniBand layer's; Wireshark's NVMe-oF RDMA
		// dissector, above it, throws on the middle packets of an RDMA
		// WRITE carrying log page data (nvmeof_rdma_linux #50-52, Linux's
		// own traffic) and so stops the dissection before the ICRC field.
		// The NVMe layer is checked by package nvme's golden test.
		args := []string{"-r", path, "-n", "--disable-protocol", "nvme-rdma", "-Y", "infiniband", "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"}
		for _, f := range fields {
			args = append(args, "-e", f)
		}
		out := strings.TrimRight(string(runCmd(t, "", tshark, args...)), "\n")
		lines := strings.Split(out, "\n")
		if len(lines) != len(want) {
			t.Errorf("%s: tshark shows %d InfiniBand frames, we decode %d", name, len(lines), len(want))
		}
		for _, line := range lines {
			vals := strings.Split(line, "\t")
			num, err := strconv.Atoi(vals[0])
			if err != nil || len(vals) != len(fields) || want[num] == nil {
				t.Errorf("%s: unexpected tshark line %q", name, line)
				continue
			}
			for j, f := range fields {
				got, err := parseValue(f, vals[j])
				if err != nil || got != want[num][f] {
					t.Errorf("%s #%d: tshark %s = %q, packet.Parse %s", name, num, f, vals[j], show(want[num][f]))
				}
			}
			total++
		}
		// Malformed or expert-flagged RoCEv2 frames, with every dissector on;
		// only the NVMe-oF dissector's own exception (above) is excused.
		bad := strings.TrimSpace(string(runCmd(t, "", tshark, "-r", path, "-n", "-Y",
			"infiniband && (_ws.malformed || _ws.expert) && !(nvme-rdma && _ws.malformed)",
			"-T", "fields", "-e", "frame.number", "-e", "_ws.expert.message")))
		if bad != "" {
			t.Errorf("%s: tshark flags RoCEv2 frames:\n%s", name, bad)
		}
	}
	t.Logf("%d golden packets agree with tshark", total)
}
