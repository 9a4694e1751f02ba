package interop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
)

// CaptureStats summarises the RoCEv2 traffic of a capture on the lab wire.
type CaptureStats struct {
	Frames   int // every frame in the file
	RoCE     int // IPv4/UDP frames to port 4791
	FromHost int // RoCEv2 packets sent by HostIP
	FromVM   int // RoCEv2 packets sent by the VM
	BadICRC  int
	Bad      int // malformed BTH/headers
	// Opcodes counts packets per direction and opcode, "host RC_SEND_ONLY".
	Opcodes map[string]int
	// HostIPIDs, HostSrcPorts, HostTTLs, HostDF describe the IPv4/UDP
	// headers of the host's packets (what rxe's ICRC check covers).
	HostIPIDs    map[uint16]int
	HostSrcPorts map[uint16]int
	HostDF       int
	// Lines is a one-line decode of the first packets and of every bad one.
	Lines []string
}

// maxLines bounds CaptureStats.Lines.
const maxLines = 60

// AnalyzeCapture reads an Ethernet pcap written on the lab's tap.
func AnalyzeCapture(file string) (*CaptureStats, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := analyze(f)
	if err != nil {
		return s, fmt.Errorf("%s: %w", file, err)
	}
	return s, nil
}

// analyze decodes a pcap stream; it never panics on malformed input.
func analyze(in io.Reader) (*CaptureStats, error) {
	r, err := pcapgo.NewReader(in)
	if err != nil {
		return nil, err
	}
	s := &CaptureStats{Opcodes: map[string]int{}, HostIPIDs: map[uint16]int{}, HostSrcPorts: map[uint16]int{}}
	var p packet.Packet
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return s, fmt.Errorf("frame %d: %w", s.Frames+1, err)
		}
		s.Frames++
		if len(data) < 14+20+8 || binary.BigEndian.Uint16(data[12:14]) != 0x0800 {
			continue
		}
		ip := data[14:]
		ihl := int(ip[0]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:4]))
		if ip[0]>>4 != 4 || ip[9] != 17 || ihl < 20 || tot > len(ip) || tot < ihl+8 {
			continue
		}
		ip = ip[:tot]
		udp := ip[ihl:]
		if binary.BigEndian.Uint16(udp[2:4]) != 4791 {
			continue
		}
		s.RoCE++
		src := fmt.Sprintf("%d.%d.%d.%d", ip[12], ip[13], ip[14], ip[15])
		dir := "vm  "
		if src == HostIP {
			dir = "host"
			s.FromHost++
			s.HostIPIDs[binary.BigEndian.Uint16(ip[4:6])]++
			s.HostSrcPorts[binary.BigEndian.Uint16(udp[0:2])]++
			if ip[6]&0x40 != 0 {
				s.HostDF++
			}
		} else {
			s.FromVM++
		}
		bad := ""
		p = packet.Packet{}
		if err := p.Parse(udp[8:]); err != nil {
			s.Bad++
			bad = "MALFORMED " + err.Error()
		}
		if err := icrc.Verify(ip); err != nil {
			s.BadICRC++
			if bad != "" {
				bad += ", "
			}
			bad += "ICRC " + err.Error()
		}
		op := "?"
		if p.BTH != nil {
			op = p.BTH.Opcode().String()
		}
		s.Opcodes[dir+" "+op]++
		if len(s.Lines) < maxLines && (bad != "" || s.RoCE <= 24) {
			line := fmt.Sprintf("#%d %s %s:%d > :4791 id=%#04x df=%v ttl=%d", s.Frames, dir, src,
				binary.BigEndian.Uint16(udp[0:2]), binary.BigEndian.Uint16(ip[4:6]), ip[6]&0x40 != 0, ip[8])
			if p.BTH != nil {
				line += fmt.Sprintf(" %s qp=%#06x psn=%#06x ack=%v pay=%d", p.BTH.Opcode(), p.BTH.DestQP(), uint32(p.BTH.PSN()), p.BTH.AckReq(), len(p.Payload))
				if p.AETH != nil {
					line += " " + p.AETH.Syndrome().String()
				}
			}
			if bad != "" {
				line += " BAD: " + bad
			}
			s.Lines = append(s.Lines, line)
		}
	}
	return s, nil
}

// String is a short summary: counts per direction and opcode.
func (s *CaptureStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d frames, %d RoCEv2 (host->vm %d, vm->host %d), bad ICRC %d, malformed %d\n",
		s.Frames, s.RoCE, s.FromHost, s.FromVM, s.BadICRC, s.Bad)
	keys := make([]string, 0, len(s.Opcodes))
	for k := range s.Opcodes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-40s %d\n", k, s.Opcodes[k])
	}
	fmt.Fprintf(&b, "  host IPv4: %d distinct IDs %s, DF on %d/%d, UDP source ports %v\n",
		len(s.HostIPIDs), topKeys(s.HostIPIDs), s.HostDF, s.FromHost, topKeys(s.HostSrcPorts))
	for _, l := range s.Lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// topKeys lists up to 4 keys of m.
func topKeys(m map[uint16]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, int(k))
	}
	sort.Ints(keys)
	if len(keys) > 4 {
		return fmt.Sprintf("%v...", keys[:4])
	}
	return fmt.Sprint(keys)
}
