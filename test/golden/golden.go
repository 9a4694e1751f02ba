// Package golden gives tests access to the golden RoCEv2 captures of real
// Linux rdma_rxe traffic kept in the repository (found by test/goldendir:
// testdata/golden, or $ROCEV2_GOLDEN): it reads their frames and parses
// the values each capture's .txt states (the "## packets" lines and the
// QPN/PSN/RKey/VAddr lines the tools printed).
//
// Tests only: it serves the tests under test/ and cmd/ (product packages'
// tests use test/goldendir and read the captures themselves), and imports
// gopacket, rocelayer (the link types), test/goldendir and the standard
// library — nothing else of this module.
package golden

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/test/goldendir"
)

// Dir returns the directory holding the golden captures (see
// goldendir.Dir). Without it the test is skipped with a loud reason, or
// fails when CI=true.
func Dir(tb testing.TB) string {
	tb.Helper()
	return goldendir.Require(tb)
}

// PCAPs returns the paths of every *.pcap in the golden directory, sorted
// (skipped loudly, or failing when CI=true, without them).
func PCAPs(tb testing.TB) []string {
	tb.Helper()
	return goldendir.PCAPs(tb)
}

// Frame is one frame of a capture.
type Frame struct {
	// Num is the 1-based frame number (as tcpdump and Wireshark count).
	Num int
	// Data is the captured frame.
	Data []byte
	// Len is the original frame length.
	Len int
	// EtherType and IP are the network-layer packet cut out of Data
	// (rocelayer.NetworkPacket): 0x0800 or 0x86dd and the bytes from the
	// IP header on (aliasing Data). A frame too short for its link-layer
	// header has a nil IP.
	EtherType uint16
	IP        []byte
}

// Packet decodes the frame with gopacket (and rocelayer's layers), from
// the link-layer header of linkType (ReadPCAP's) on.
func (f Frame) Packet(linkType uint32, opts gopacket.DecodeOptions) gopacket.Packet {
	dec, err := rocelayer.LinkDecoder(linkType)
	if err != nil {
		dec = gopacket.DecodeFunc(func([]byte, gopacket.PacketBuilder) error { return err })
	}
	return gopacket.NewPacket(f.Data, dec, opts)
}

// ReadPCAP reads every frame of a capture file: classic pcap (either byte
// order, micro- or nanosecond timestamps) or pcapng, of any link type
// rocelayer reads — Ethernet, Linux SLL and SLL2 (what `tcpdump -i any`
// writes), raw IP (101, 12, 14, 228, 229) and the BSD loopbacks (0, 108).
// It returns the file's link type with its full number
// (rocelayer.FileLinkType: gopacket's layers.LinkType is 8 bits wide and
// reads SLL2's 276 as 20); each Frame carries its IP packet.
func ReadPCAP(path string) ([]Frame, uint32, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	lt, err := rocelayer.FileLinkType(b)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := rocelayer.LinkDecoder(lt); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	var r interface {
		ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
	}
	if binary.LittleEndian.Uint32(b) == 0x0a0d0d0a { // pcapng Section Header Block
		r, err = pcapgo.NewNgReader(bytes.NewReader(b), pcapgo.DefaultNgReaderOptions)
	} else {
		r, err = pcapgo.NewReader(bytes.NewReader(b))
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	var out []Frame
	for n := 1; ; n++ {
		data, ci, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out, lt, nil
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%s: frame %d: %w", path, n, err)
		}
		f := Frame{Num: n, Data: data, Len: ci.Length}
		if et, ip, ok := rocelayer.NetworkPacket(lt, data); ok {
			f.EtherType, f.IP = et, ip
		}
		out = append(out, f)
	}
}

// Line is one line of a .txt's "## packets" section, e.g.
//
//	20 0.000000 192.0.2.3:49593 > 192.0.2.2 RC_RDMA_WRITE_ONLY dqpn=0x000015 psn=0xc8a712 A pkey=0xffff pay=64 RETH[va=0x55d90dddb000 rkey=0x00000654 len=64] icrc=0x6305d220
//
// or, over IPv6, "... [2001:db8::3]:49593 > 2001:db8::2 ...".
type Line struct {
	Frame   int
	Src     netip.Addr
	SrcPort uint16
	Dst     netip.Addr
	Opcode  string
	DQPN    uint32
	PSN     uint32
	AckReq  bool
	PKey    uint16
	Pay     int
	ICRC    uint32

	RETH      *RETH
	AETH      *AETH
	AtomicETH *AtomicETH
	AtomicAck *uint64 // AtomicAckETH original data
	Imm       *uint32 // ImmDt
	IETH      *uint32 // IETH R_Key
	DETH      *DETH

	// Text is the line as written.
	Text string
}

// RETH holds the RETH[...] values of a Line.
type RETH struct {
	VA   uint64
	RKey uint32
	Len  uint32
}

// AETH holds the AETH[...] values of a Line.
type AETH struct {
	Syndrome string // e.g. "ACK credits=31"
	MSN      uint32
}

// AtomicETH holds the AtomicETH[...] values of a Line.
type AtomicETH struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// DETH holds the DETH[...] values of a Line.
type DETH struct {
	QKey  uint32
	SrcQP uint32
}

// Addr is a queue pair as a tool printed it ("local address: ... QPN .. PSN
// .. RKey .. VAddr .."), attributed to the host that owns it.
type Addr struct {
	Host  netip.Addr
	QPN   uint32
	PSN   uint32
	RKey  uint32
	VAddr uint64
	// HasRKey reports whether the line stated RKey and VAddr.
	HasRKey bool
	// Text is the line as written.
	Text string
}

// Capture is what a golden .txt states.
type Capture struct {
	// Name is the capture's base name without extension.
	Name string
	// Server and Client are the hosts' IP addresses.
	Server, Client netip.Addr
	// Packets are the "## packets" lines.
	Packets []Line
	// Addrs are the queue pairs from the tool output sections, each
	// attributed to its owner (a "remote" line belongs to the peer).
	Addrs []Addr
	// SentImm are the immediate values the client reported sending ("sent
	// #k ... imm=0x.."), in order.
	SentImm []uint32
}

// Addresses in a .txt are IPv4 (192.0.2.2) or IPv6 (2001:db8::2,
// fe80::2%eth0); a packet line's source with its port is ADDR:PORT for
// IPv4 and [ADDR]:PORT for IPv6, its destination may be bracketed too.
const (
	reIPv4 = `\d+\.\d+\.\d+\.\d+`
	reIPv6 = `[0-9A-Fa-f]*:[0-9A-Fa-f:.]*(?:%[\w.-]+)?`
	reIP   = `(?:` + reIPv4 + `|` + reIPv6 + `)`
)

var (
	reRole = regexp.MustCompile(`^(server|client) \((?:\S+ )?(` + reIP + `)`)
	reHead = regexp.MustCompile(`^\s*(\d+) \d+\.\d+ (` + reIPv4 + `|\[` + reIPv6 + `\]):(\d+) > (` + reIP + `|\[` + reIPv6 + `\]) ([A-Z_]+)\s+dqpn=(0x[0-9a-f]+) psn=(0x[0-9a-f]+) (A )?pkey=(0x[0-9a-f]+) pay=(\d+)\s*(.*?)\s*icrc=(0x[0-9a-f]{8})$`)
	reExt  = regexp.MustCompile(`^(RETH|AETH|AtomicETH|AtomicAckETH|DETH|IETH)\[([^\]]*)\]|^ImmDt=(0x[0-9a-f]+)`)
	reAddr = regexp.MustCompile(`^\s*(local|remote)(?: address)?:\s+(?:LID \S+\s+)?QPN (0x[0-9a-f]+),? PSN (0x[0-9a-f]+)[,:]?(?: OUT \S+)?(?: RKey (0x[0-9a-f]+) VAddr (0x[0-9a-f]+))?`)
	reSent = regexp.MustCompile(`^\s*sent #\d+ .*imm=(0x[0-9a-f]+)`)
)

// ParseTxt parses a golden .txt file.
func ParseTxt(path string) (*Capture, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &Capture{Name: strings.TrimSuffix(filepath.Base(path), ".txt")}
	section := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	ln := 0
	for sc.Scan() {
		ln++
		s := sc.Text()
		if strings.HasPrefix(s, "## ") {
			section = strings.TrimPrefix(s, "## ")
			continue
		}
		bad := func(err error) error { return fmt.Errorf("%s:%d: %w: %q", path, ln, err, s) }
		switch {
		case section == "":
			if m := reRole.FindStringSubmatch(s); m != nil {
				a, err := netip.ParseAddr(m[2])
				if err != nil {
					return nil, bad(err)
				}
				if m[1] == "server" {
					c.Server = a
				} else {
					c.Client = a
				}
			}
		case strings.HasPrefix(section, "packets"):
			if strings.TrimSpace(s) == "" {
				continue
			}
			l, err := parseLine(s)
			if err != nil {
				return nil, bad(err)
			}
			c.Packets = append(c.Packets, l)
		case section == "server output" || section == "client output":
			if m := reSent.FindStringSubmatch(s); m != nil && section == "client output" {
				v, _ := strconv.ParseUint(m[1], 0, 32)
				c.SentImm = append(c.SentImm, uint32(v))
			}
			m := reAddr.FindStringSubmatch(s)
			if m == nil {
				continue
			}
			own, peer := c.Server, c.Client
			if section == "client output" {
				own, peer = peer, own
			}
			a := Addr{Host: own, Text: strings.TrimSpace(s)}
			if m[1] == "remote" {
				a.Host = peer
			}
			if !a.Host.IsValid() {
				return nil, bad(errors.New("address line before the server/client header lines"))
			}
			a.QPN = uint32(hex(m[2]))
			a.PSN = uint32(hex(m[3]))
			if m[4] != "" {
				a.HasRKey = true
				a.RKey = uint32(hex(m[4]))
				a.VAddr = hex(m[5])
			}
			c.Addrs = append(c.Addrs, a)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(c.Packets) == 0 {
		return nil, fmt.Errorf("%s: no \"## packets\" lines", path)
	}
	return c, nil
}

func hex(s string) uint64 {
	v, _ := strconv.ParseUint(s, 0, 64) // the regexps only admit 0x[0-9a-f]+
	return v
}

// parseLine parses one "## packets" line; every token must be understood.
func parseLine(s string) (Line, error) {
	m := reHead.FindStringSubmatch(s)
	if m == nil {
		return Line{}, errors.New("unrecognised packet line")
	}
	var l Line
	var err error
	l.Text = strings.TrimSpace(s)
	if l.Frame, err = strconv.Atoi(m[1]); err != nil {
		return l, err
	}
	if l.Src, err = netip.ParseAddr(strings.Trim(m[2], "[]")); err != nil {
		return l, err
	}
	sp, err := strconv.ParseUint(m[3], 10, 16)
	if err != nil {
		return l, err
	}
	l.SrcPort = uint16(sp)
	if l.Dst, err = netip.ParseAddr(strings.Trim(m[4], "[]")); err != nil {
		return l, err
	}
	l.Opcode = m[5]
	l.DQPN = uint32(hex(m[6]))
	l.PSN = uint32(hex(m[7]))
	l.AckReq = m[8] != ""
	l.PKey = uint16(hex(m[9]))
	if l.Pay, err = strconv.Atoi(m[10]); err != nil {
		return l, err
	}
	l.ICRC = uint32(hex(m[12]))
	rest := m[11]
	for rest = strings.TrimSpace(rest); rest != ""; rest = strings.TrimSpace(rest) {
		e := reExt.FindStringSubmatchIndex(rest)
		if e == nil {
			return l, fmt.Errorf("unrecognised extension header text %q", rest)
		}
		if e[6] >= 0 { // ImmDt=0x..
			v := uint32(hex(rest[e[6]:e[7]]))
			l.Imm = &v
		} else if err := l.setExt(rest[e[2]:e[3]], rest[e[4]:e[5]]); err != nil {
			return l, err
		}
		rest = rest[e[1]:]
	}
	return l, nil
}

// kv parses "a=1 b=0x2" into a map; keys listed in want must all be present
// and no others.
func kv(body string, want ...string) (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, f := range strings.Fields(body) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("bad field %q", f)
		}
		n, err := strconv.ParseUint(v, 0, 64)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", k, err)
		}
		out[k] = n
	}
	if len(out) != len(want) {
		return nil, fmt.Errorf("fields %q: want exactly %v", body, want)
	}
	for _, k := range want {
		if _, ok := out[k]; !ok {
			return nil, fmt.Errorf("fields %q: missing %s", body, k)
		}
	}
	return out, nil
}

func (l *Line) setExt(name, body string) error {
	switch name {
	case "RETH":
		m, err := kv(body, "va", "rkey", "len")
		if err != nil {
			return err
		}
		l.RETH = &RETH{VA: m["va"], RKey: uint32(m["rkey"]), Len: uint32(m["len"])}
	case "AETH":
		syn, msn, ok := strings.Cut(body, " msn=")
		if !ok {
			return fmt.Errorf("AETH %q: no msn", body)
		}
		v, err := strconv.ParseUint(msn, 0, 32)
		if err != nil {
			return fmt.Errorf("AETH msn: %w", err)
		}
		l.AETH = &AETH{Syndrome: syn, MSN: uint32(v)}
	case "AtomicETH":
		m, err := kv(body, "va", "rkey", "swap_add", "compare")
		if err != nil {
			return err
		}
		l.AtomicETH = &AtomicETH{VA: m["va"], RKey: uint32(m["rkey"]), SwapAdd: m["swap_add"], Compare: m["compare"]}
	case "AtomicAckETH":
		m, err := kv(body, "orig")
		if err != nil {
			return err
		}
		v := m["orig"]
		l.AtomicAck = &v
	case "DETH":
		m, err := kv(body, "qkey", "srcqp")
		if err != nil {
			return err
		}
		l.DETH = &DETH{QKey: uint32(m["qkey"]), SrcQP: uint32(m["srcqp"])}
	case "IETH":
		m, err := kv(body, "rkey")
		if err != nil {
			return err
		}
		v := uint32(m["rkey"])
		l.IETH = &v
	default:
		return fmt.Errorf("unknown extension header %s", name)
	}
	return nil
}
