package icrc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/test/goldendir"
)

// refICRC is a deliberately naive reference: it literally builds the masked
// byte string (8 x 0xff, masked IP header, masked UDP header, masked BTH, rest)
// and calls crc32.ChecksumIEEE. It shares no code with the package. ip must be
// well formed (IPv4 of any IHL or IPv6 without extension headers, UDP, BTH,
// ICRC) and end exactly at the ICRC.
func refICRC(ip []byte) uint32 {
	var hl int
	switch ip[0] >> 4 {
	case 4:
		hl = int(ip[0]&0xf) * 4
	case 6:
		hl = 40
	default:
		panic("refICRC: bad version")
	}
	s := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	s = append(s, ip[:len(ip)-4]...)
	p := s[8:]
	if hl == 40 && ip[0]>>4 == 6 {
		p[0] |= 0x0f                        // traffic class, high nibble
		p[1], p[2], p[3] = 0xff, 0xff, 0xff // traffic class low nibble, flow label
		p[7] = 0xff                         // hop limit
	} else {
		p[1] = 0xff               // TOS
		p[8] = 0xff               // TTL
		p[10], p[11] = 0xff, 0xff // header checksum
	}
	p[hl+6], p[hl+7] = 0xff, 0xff // UDP checksum
	p[hl+8+4] = 0xff              // BTH byte 4
	return crc32.ChecksumIEEE(s)
}

// pkt describes a packet for the builders.
type pkt struct {
	v6           bool
	src4, dst4   [4]byte
	src6, dst6   [16]byte
	tos, ttl     byte
	id, flags    uint16
	sport, dport uint16
	options      []byte // IPv4 options, multiple of 4 bytes
	tc           byte   // IPv6 traffic class
	flow         uint32 // IPv6 flow label (20 bits)
	hop          byte
	udpSum       uint16
	bth          [12]byte
	body         []byte // after the BTH, before the ICRC
}

// build returns the whole IP packet with a zero ICRC and a random-looking IPv4
// header checksum (it is masked, so its value does not matter).
func (p *pkt) build() []byte {
	udpLen := 8 + 12 + len(p.body) + 4
	var b []byte
	if p.v6 {
		b = make([]byte, 40+udpLen)
		binary.BigEndian.PutUint32(b[0:], 6<<28|uint32(p.tc)<<20|p.flow&0xfffff)
		binary.BigEndian.PutUint16(b[4:], uint16(udpLen))
		b[6] = 17
		b[7] = p.hop
		copy(b[8:], p.src6[:])
		copy(b[24:], p.dst6[:])
	} else {
		hl := 20 + len(p.options)
		b = make([]byte, hl+udpLen)
		b[0] = 0x40 | byte(hl/4)
		b[1] = p.tos
		binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
		binary.BigEndian.PutUint16(b[4:], p.id)
		binary.BigEndian.PutUint16(b[6:], p.flags)
		b[8] = p.ttl
		b[9] = 17
		b[10], b[11] = 0x5a, 0xa5
		copy(b[12:], p.src4[:])
		copy(b[16:], p.dst4[:])
		copy(b[20:], p.options)
	}
	u := b[len(b)-udpLen:]
	binary.BigEndian.PutUint16(u[0:], p.sport)
	binary.BigEndian.PutUint16(u[2:], p.dport)
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen))
	binary.BigEndian.PutUint16(u[6:], p.udpSum)
	copy(u[8:], p.bth[:])
	copy(u[20:], p.body)
	return b
}

// randPkt returns a random packet description with a body of n bytes.
func randPkt(r *rand.Rand, v6 bool, n int) *pkt {
	p := &pkt{v6: v6, tos: byte(r.Uint32()), ttl: byte(r.Uint32()), id: uint16(r.Uint32()),
		flags: 0x4000, sport: uint16(r.Uint32()), dport: 4791, tc: byte(r.Uint32()),
		flow: r.Uint32() & 0xfffff, hop: byte(r.Uint32()), udpSum: uint16(r.Uint32())}
	fill(r, p.src4[:])
	fill(r, p.dst4[:])
	fill(r, p.src6[:])
	fill(r, p.dst6[:])
	fill(r, p.bth[:])
	p.body = make([]byte, n)
	fill(r, p.body)
	return p
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// pseudo4 extracts the IPv4Pseudo fields and the UDP payload of a 20-byte-header
// IPv4 packet.
func pseudo4(ip []byte) (*IPv4Pseudo, []byte) {
	h := &IPv4Pseudo{ID: binary.BigEndian.Uint16(ip[4:]), FlagsFrag: binary.BigEndian.Uint16(ip[6:]),
		SrcPort: binary.BigEndian.Uint16(ip[20:]), DstPort: binary.BigEndian.Uint16(ip[22:])}
	copy(h.Src[:], ip[12:16])
	copy(h.Dst[:], ip[16:20])
	tl := int(binary.BigEndian.Uint16(ip[2:]))
	return h, ip[28:tl]
}

// pseudo6 extracts the IPv6Pseudo fields and the UDP payload of an IPv6 packet.
func pseudo6(ip []byte) (*IPv6Pseudo, []byte) {
	h := &IPv6Pseudo{SrcPort: binary.BigEndian.Uint16(ip[40:]), DstPort: binary.BigEndian.Uint16(ip[42:])}
	copy(h.Src[:], ip[8:24])
	copy(h.Dst[:], ip[24:40])
	return h, ip[48 : 40+int(binary.BigEndian.Uint16(ip[4:]))]
}

// goldenPacket is one RoCEv2 packet from a capture: the IP packet as found in
// the frame (it may be followed by Ethernet padding).
type goldenPacket struct {
	file  string
	frame int
	ip    []byte
}

// readGolden returns the RoCEv2 packets (IPv4 or IPv6, UDP destination port
// 4791) of every golden capture, keyed by capture name without extension.
// Frames are decoded with gopacket's layers, independently of this package.
func readGolden(tb testing.TB) map[string][]goldenPacket {
	tb.Helper()
	files := goldendir.PCAPs(tb)
	out := make(map[string][]goldenPacket)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".pcap")
		out[name] = readPcap(tb, f)
	}
	return out
}

func readPcap(tb testing.TB, file string) []goldenPacket {
	tb.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		tb.Fatal(err)
	}
	frames, err := parsePcap(data)
	if err != nil {
		tb.Fatalf("%s: %v", file, err)
	}
	var out []goldenPacket
	for i, data := range frames {
		frame := i + 1
		var eth layers.Ethernet
		if err := eth.DecodeFromBytes(data, nopFeedback{}); err != nil {
			continue
		}
		ipb := eth.Payload
		var dport layers.UDPPort
		switch eth.EthernetType {
		case layers.EthernetTypeIPv4:
			var ip4 layers.IPv4
			if err := ip4.DecodeFromBytes(ipb, nopFeedback{}); err != nil || ip4.Protocol != layers.IPProtocolUDP {
				continue
			}
			var udp layers.UDP
			if err := udp.DecodeFromBytes(ip4.Payload, nopFeedback{}); err != nil {
				continue
			}
			dport = udp.DstPort
		case layers.EthernetTypeIPv6:
			var ip6 layers.IPv6
			if err := ip6.DecodeFromBytes(ipb, nopFeedback{}); err != nil || ip6.NextHeader != layers.IPProtocolUDP {
				continue
			}
			var udp layers.UDP
			if err := udp.DecodeFromBytes(ip6.Payload, nopFeedback{}); err != nil {
				continue
			}
			dport = udp.DstPort
		default:
			continue
		}
		if dport != 4791 {
			continue
		}
		out = append(out, goldenPacket{file: filepath.Base(file), frame: frame, ip: append([]byte(nil), ipb...)})
	}
	return out
}

// parsePcap returns the frames of a classic pcap file with Ethernet link
// type, refusing frames the capture truncated.
func parsePcap(data []byte) ([][]byte, error) {
	r, err := pcapgo.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	if lt := r.LinkType(); lt != layers.LinkTypeEthernet {
		return nil, fmt.Errorf("pcap: link type %d, want Ethernet", lt)
	}
	var frames [][]byte
	for {
		frame, ci, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return frames, nil
		}
		if err != nil {
			return nil, fmt.Errorf("pcap: frame %d: %w", len(frames)+1, err)
		}
		if ci.CaptureLength != ci.Length {
			return nil, fmt.Errorf("pcap: frame %d truncated (%d of %d bytes)", len(frames)+1, ci.CaptureLength, ci.Length)
		}
		frames = append(frames, frame)
	}
}

type nopFeedback struct{}

func (nopFeedback) SetTruncated() {}

// ipEnd returns the end of the IP packet by its length fields.
func ipEnd(ip []byte) int {
	if ip[0]>>4 == 6 {
		return 40 + int(binary.BigEndian.Uint16(ip[4:]))
	}
	return int(binary.BigEndian.Uint16(ip[2:]))
}

// maskedBits returns, for byte i of a well-formed packet, the bits of it that
// the ICRC masks.
func maskedBits(ip []byte, i int) byte {
	v6 := ip[0]>>4 == 6
	hl := 40
	if !v6 {
		hl = int(ip[0]&0xf) * 4
	}
	switch {
	case v6 && i == 0:
		return 0x0f
	case v6 && (i == 1 || i == 2 || i == 3 || i == 7):
		return 0xff
	case !v6 && (i == 1 || i == 8 || i == 10 || i == 11):
		return 0xff
	case i == hl+6 || i == hl+7 || i == hl+8+4:
		return 0xff
	}
	return 0
}
