package packet

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/test/goldendir"
)

// goldenPacket is one RoCEv2 UDP payload from a capture.
type goldenPacket struct {
	frame   int // 1-based frame number in the pcap
	payload []byte
}

// readRoCE returns the UDP payloads to port 4791 in the pcap at path.
func readRoCE(tb testing.TB, path string) []goldenPacket {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(bufio.NewReader(f))
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	var out []goldenPacket
	for frame := 1; frame < 1_000_000; frame++ {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatalf("%s frame %d: %v", path, frame, err)
		}
		pkt := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		l := pkt.Layer(layers.LayerTypeUDP)
		if l == nil {
			continue
		}
		udp := l.(*layers.UDP)
		if udp.DstPort != 4791 {
			continue
		}
		out = append(out, goldenPacket{frame: frame, payload: append([]byte(nil), udp.Payload...)})
	}
	return out
}

// expectation is what the capture's .txt (roce_pcap.py) says about a frame.
type expectation struct {
	op     string
	dqpn   uint64
	psn    uint64
	ackReq bool
	pkey   uint64
	pay    int
	icrc   uint64
}

var lineRE = regexp.MustCompile(`^\s*(\d+)\s+\S+\s+\S+\s+>\s+\S+\s+(\S+)\s+dqpn=0x([0-9a-f]+) psn=0x([0-9a-f]+)( A)? pkey=0x([0-9a-f]+) pay=(\d+)\s.*icrc=0x([0-9a-f]+)\s*$`)

// readExpectations parses the "## packets" section of the .txt next to a pcap.
func readExpectations(tb testing.TB, pcap string) map[int]expectation {
	tb.Helper()
	f, err := os.Open(strings.TrimSuffix(pcap, ".pcap") + ".txt")
	if err != nil {
		tb.Logf("no expectations for %s: %v", pcap, err)
		return nil
	}
	defer f.Close()
	m := map[int]expectation{}
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## packets")
			continue
		}
		if !in {
			continue
		}
		s := lineRE.FindStringSubmatch(line)
		if s == nil {
			if strings.TrimSpace(line) != "" {
				tb.Errorf("%s: unparsed packet line %q", pcap, line)
			}
			continue
		}
		frame, _ := strconv.Atoi(s[1])
		hex := func(x string) uint64 { v, _ := strconv.ParseUint(x, 16, 64); return v }
		pay, _ := strconv.Atoi(s[7])
		m[frame] = expectation{op: s[2], dqpn: hex(s[3]), psn: hex(s[4]), ackReq: s[5] != "",
			pkey: hex(s[6]), pay: pay, icrc: hex(s[8])}
	}
	return m
}

func TestGoldenCaptures(t *testing.T) {
	total := 0
	for _, path := range goldendir.PCAPs(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			pkts := readRoCE(t, path)
			if len(pkts) == 0 {
				t.Fatal("no RoCEv2 packets")
			}
			exp := readExpectations(t, path)
			for _, g := range pkts {
				total++
				var p Packet
				if err := p.Parse(g.payload); err != nil {
					t.Errorf("frame %d: Parse: %v", g.frame, err)
					continue
				}
				if e, ok := exp[g.frame]; ok {
					got := expectation{op: p.BTH.Opcode().String(), dqpn: uint64(p.BTH.DestQP()),
						psn: uint64(p.BTH.PSN()), ackReq: p.BTH.AckReq(), pkey: uint64(p.BTH.PKey()),
						pay: len(p.Payload), icrc: uint64(p.ICRC)}
					if got != e {
						t.Errorf("frame %d: parsed %+v, capture says %+v", g.frame, got, e)
					}
				} else if exp != nil {
					t.Errorf("frame %d: not listed in the .txt", g.frame)
				}
				f := p.Fields()
				buf := make([]byte, len(g.payload)+8)
				n, err := Build(buf, &f)
				if err != nil {
					t.Errorf("frame %d: Build: %v", g.frame, err)
					continue
				}
				if n != len(g.payload) {
					t.Errorf("frame %d: Build length %d, capture %d", g.frame, n, len(g.payload))
					continue
				}
				body := len(g.payload) - ICRCSize
				if string(buf[:body]) != string(g.payload[:body]) {
					t.Errorf("frame %d (%v): Build differs from capture\n got % x\nwant % x",
						g.frame, p.BTH.Opcode(), buf[:body], g.payload[:body])
				}
				if Len(p.BTH.Opcode(), len(p.Payload)) != len(g.payload) {
					t.Errorf("frame %d: Len = %d, want %d", g.frame, Len(p.BTH.Opcode(), len(p.Payload)), len(g.payload))
				}
			}
			if exp != nil && len(exp) != len(pkts) {
				t.Errorf("capture has %d RoCEv2 packets, .txt lists %d", len(pkts), len(exp))
			}
		})
	}
	t.Logf("%d golden RoCEv2 packets parsed and rebuilt", total)
}

// goldenFuzzSeeds returns every RoCEv2 payload of the golden captures, as
// fuzz seeds. A missing capture directory (or one without RoCEv2 packets)
// does not skip the fuzz target, whose synthetic seeds still run: it fails
// under CI=true and logs loudly otherwise.
func goldenFuzzSeeds(tb testing.TB) []goldenPacket {
	tb.Helper()
	dir, ok := goldendir.Seeds(tb)
	if !ok {
		return nil
	}
	var seeds []goldenPacket
	for _, path := range goldendir.Files(dir) {
		seeds = append(seeds, readRoCE(tb, path)...)
	}
	if len(seeds) == 0 {
		goldendir.Missing(tb, fmt.Errorf("no RoCEv2 packet in %s", filepath.Join(dir, "*.pcap")))
	}
	return seeds
}
