package golden_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
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

// sampleIPs returns RoCEv2 IP packets (IP header .. ICRC): rocelayer's
// IPv4 sample frames and one IPv6 packet.
func sampleIPs(t *testing.T) [][]byte {
	t.Helper()
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, s := range samples {
		out = append(out, s.Frame[14:])
	}
	f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x12, PSN: 7}, Payload: []byte("over IPv6")}
	ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
		SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
	udp := &layers.UDP{SrcPort: 0xc012, DstPort: rocelayer.Port}
	if err := udp.SetNetworkLayerForChecksum(ip6); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := rocelayer.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
		append([]gopacket.SerializableLayer{ip6, udp}, rocelayer.FromFields(&f)...)...); err != nil {
		t.Fatal(err)
	}
	return append(out, bytes.Clone(buf.Bytes()))
}

// TestReadPCAPLinkTypes writes the same RoCEv2 packets with every link
// type rocelayer reads, as classic pcap and as pcapng, and reads them back
// with ReadPCAP: the file's full link type (SLL2 is 276, not gopacket's
// 20), every frame with its IP packet and EtherType, and each frame
// decoding to a BTH with a valid ICRC from its link-layer header on. A
// link type nobody reads is refused by its number.
func TestReadPCAPLinkTypes(t *testing.T) {
	ips := sampleIPs(t)
	family := func(ip []byte) (etherType uint16, af uint32) {
		if ip[0]>>4 == 6 {
			return 0x86dd, 10
		}
		return 0x0800, 2
	}
	mac := []byte{0x02, 0, 0, 0, 0, 1}
	cases := []struct {
		name     string
		linkType uint32
		only     uint16 // an IP version only (the raw IPv4 / IPv6 link types)
		head     func(ip []byte) []byte
	}{
		{"ethernet", rocelayer.LinkTypeEthernet, 0, func(ip []byte) []byte {
			et, _ := family(ip)
			return binary.BigEndian.AppendUint16(append(append([]byte{}, mac...), 0x02, 0, 0, 0, 0, 2), et)
		}},
		{"linux sll", rocelayer.LinkTypeLinuxSLL, 0, func(ip []byte) []byte {
			et, _ := family(ip)
			h := []byte{0, 4, 0, 1, 0, 6}
			h = append(append(h, mac...), 0, 0)
			return binary.BigEndian.AppendUint16(h, et)
		}},
		{"linux sll2", rocelayer.LinkTypeLinuxSLL2, 0, func(ip []byte) []byte {
			et, _ := family(ip)
			h := binary.BigEndian.AppendUint16(nil, et)
			h = append(h, 0, 0, 0, 0, 0, 7, 0, 1, 4, 6)
			return append(append(h, mac...), 0, 0)
		}},
		{"raw", rocelayer.LinkTypeRaw, 0, func([]byte) []byte { return nil }},
		{"raw 12", rocelayer.LinkTypeRawOld, 0, func([]byte) []byte { return nil }},
		{"raw 14", rocelayer.LinkTypeRawOld2, 0, func([]byte) []byte { return nil }},
		{"ipv4", rocelayer.LinkTypeIPv4, 4, func([]byte) []byte { return nil }},
		{"ipv6", rocelayer.LinkTypeIPv6, 6, func([]byte) []byte { return nil }},
		{"null", rocelayer.LinkTypeNull, 0, func(ip []byte) []byte {
			_, af := family(ip)
			return binary.LittleEndian.AppendUint32(nil, af)
		}},
		{"loop", rocelayer.LinkTypeLoop, 0, func(ip []byte) []byte {
			_, af := family(ip)
			return binary.BigEndian.AppendUint32(nil, af)
		}},
	}
	dir := t.TempDir()
	for _, c := range cases {
		for _, ng := range []bool{false, true} {
			name := c.name
			if ng {
				name += " pcapng"
			}
			t.Run(name, func(t *testing.T) {
				var want [][]byte
				for _, ip := range ips {
					if c.only == 0 || uint16(ip[0]>>4) == c.only {
						want = append(want, ip)
					}
				}
				path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
				writeCapture(t, path, c.linkType, ng, want, c.head)
				frames, lt, err := golden.ReadPCAP(path)
				if err != nil {
					t.Fatal(err)
				}
				if lt != c.linkType || len(frames) != len(want) {
					t.Fatalf("link type %d, %d frames; want %d and %d", lt, len(frames), c.linkType, len(want))
				}
				for i, f := range frames {
					et, _ := family(want[i])
					if f.Num != i+1 || f.Len != len(f.Data) || f.EtherType != et || !bytes.Equal(f.IP, want[i]) {
						t.Fatalf("frame %d: num %d, len %d of %d, EtherType %#x (want %#x), IP packet equal %v",
							i, f.Num, f.Len, len(f.Data), f.EtherType, et, bytes.Equal(f.IP, want[i]))
					}
					p := f.Packet(lt, gopacket.Default)
					if el := p.ErrorLayer(); el != nil {
						t.Fatalf("frame %d: decode: %v", f.Num, el.Error())
					}
					if p.Layer(rocelayer.LayerTypeBTH) == nil {
						t.Fatalf("frame %d: no BTH: %v", f.Num, p)
					}
					if err := rocelayer.VerifyICRC(p); err != nil {
						t.Fatalf("frame %d: %v", f.Num, err)
					}
				}
			})
		}
	}
	path := filepath.Join(dir, "user0")
	writeCapture(t, path, 147, false, ips[:1], func([]byte) []byte { return nil })
	if _, _, err := golden.ReadPCAP(path); err == nil || !strings.Contains(err.Error(), "unsupported link type 147") {
		t.Errorf("link type 147: %v", err)
	}
}

// writeCapture writes a pcap or pcapng file of link type linkType (any
// number: pcapgo's writers take 8 bits, so the header is patched) whose
// frames are head(ip) followed by ip.
func writeCapture(t *testing.T, path string, linkType uint32, ng bool, ips [][]byte, head func([]byte) []byte) {
	t.Helper()
	var buf bytes.Buffer
	var write func(gopacket.CaptureInfo, []byte) error
	flush := func() error { return nil }
	if ng {
		w, err := pcapgo.NewNgWriter(&buf, layers.LinkType(linkType&0xff))
		if err != nil {
			t.Fatal(err)
		}
		write, flush = w.WritePacket, w.Flush
	} else {
		w := pcapgo.NewWriter(&buf)
		if err := w.WriteFileHeader(65535, layers.LinkType(linkType&0xff)); err != nil {
			t.Fatal(err)
		}
		write = w.WritePacket
	}
	for i, ip := range ips {
		f := append(head(ip), ip...)
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(i)*1000), CaptureLength: len(f), Length: len(f)}
		if err := write(ci, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if ng {
		// The Interface Description Block follows the Section Header
		// Block; its link type is 16 bits at offset 8.
		shb := binary.LittleEndian.Uint32(b[4:])
		binary.LittleEndian.PutUint16(b[shb+8:], uint16(linkType))
	} else {
		binary.LittleEndian.PutUint32(b[20:], linkType)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
