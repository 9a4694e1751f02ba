//go:build linux

package interop

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
)

// captureAs writes Ethernet frames re-framed for another link type (the
// full number, written into the header after pcapgo's 8-bit one), as pcap
// or pcapng.
func captureAs(t *testing.T, linkType uint32, ng bool, frames ...[]byte) []byte {
	t.Helper()
	var b bytes.Buffer
	var write func(gopacket.CaptureInfo, []byte) error
	flush := func() error { return nil }
	if ng {
		w, err := pcapgo.NewNgWriter(&b, layers.LinkType(linkType&0xff))
		if err != nil {
			t.Fatal(err)
		}
		write, flush = w.WritePacket, w.Flush
	} else {
		w := pcapgo.NewWriter(&b)
		if err := w.WriteFileHeader(65536, layers.LinkType(linkType&0xff)); err != nil {
			t.Fatal(err)
		}
		write = w.WritePacket
	}
	ts := time.Unix(1700000000, 0)
	for i, f := range frames {
		et, ip := f[12:14], f[14:]
		var out []byte
		switch linkType {
		case 1:
			out = f
		case 113: // Linux SLL: packet type, ARPHRD, address length, address, protocol
			out = append([]byte{0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, et[0], et[1]}, ip...)
		case 276: // Linux SLL2: protocol, reserved, ifindex, ARPHRD, type, address length, address
			out = append([]byte{et[0], et[1], 0, 0, 0, 0, 0, 2, 0, 1, 4, 6, 2, 0, 0, 0, 0, 1, 0, 0}, ip...)
		case 101:
			out = ip
		case 0:
			out = append([]byte{2, 0, 0, 0}, ip...)
		default:
			t.Fatalf("link type %d", linkType)
		}
		ci := gopacket.CaptureInfo{Timestamp: ts.Add(time.Duration(i) * time.Millisecond), CaptureLength: len(out), Length: len(out)}
		if err := write(ci, out); err != nil {
			t.Fatal(err)
		}
	}
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	raw := b.Bytes()
	if ng {
		shb := binary.LittleEndian.Uint32(raw[4:])
		binary.LittleEndian.PutUint16(raw[shb+8:], uint16(linkType))
	} else {
		binary.LittleEndian.PutUint32(raw[20:], linkType)
	}
	return raw
}

// TestAnalyzeLinkTypes: the capture analyzer reads the same traffic alike
// from Ethernet (the lab's tap), Linux SLL and SLL2 (tcpdump -i any), raw
// IP and BSD loopback captures, pcap and pcapng.
func TestAnalyzeLinkTypes(t *testing.T) {
	buf := ppBuf(4096)
	ack := packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: 0x12, PSN: 3}}
	frames := [][]byte{
		frame(t, true, send(0, bth.RCSendFirst, buf[:1024])),
		frame(t, true, send(1, bth.RCSendMiddle, buf[1024:2048])),
		frame(t, true, send(2, bth.RCSendMiddle, buf[2048:3072])),
		frame(t, true, send(3, bth.RCSendLast, buf[3072:])),
		frame(t, false, ack),
		frame(t, false, send(100, bth.RCSendOnly, buf[:64])),
		frame(t, false, send(100, bth.RCSendOnly, buf[:64])), // rxe resends
	}
	ref, err := analyzeWith(bytes.NewReader(pcapOf(t, frames...)), pingpongData)
	if err != nil {
		t.Fatal(err)
	}
	if ref.RetransFromVM != 1 || ref.DataChecked != 6 {
		t.Fatalf("Ethernet reference: retrans %d, checked %d", ref.RetransFromVM, ref.DataChecked)
	}
	for _, lt := range []uint32{1, 113, 276, 101, 0} {
		for _, ng := range []bool{false, true} {
			st, err := analyzeWith(bytes.NewReader(captureAs(t, lt, ng, frames...)), pingpongData)
			if err != nil {
				t.Errorf("link type %d (pcapng %v): %v", lt, ng, err)
				continue
			}
			if st.String() != ref.String() || st.Frames != ref.Frames || st.DataChecked != ref.DataChecked || st.RetransFromVM != ref.RetransFromVM {
				t.Errorf("link type %d (pcapng %v):\n%s\nwant (Ethernet):\n%s", lt, ng, st, ref)
			}
		}
	}
}
