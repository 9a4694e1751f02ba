package pcapcmd

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"testing"

	"github.com/google/gopacket"

	"github.com/gorocev2/rocev2/rocelayer"
)

// FuzzWalk: no frame makes the walk (link types, VLAN tags, tunnels, IPv4
// and IPv6 reassembly, IPv6 extension headers) panic, and what it calls a RoCEv2
// packet starts with an IP header.
func FuzzWalk(f *testing.F) {
	if samples, err := rocelayer.SampleFrames(); err == nil {
		for _, s := range samples[:4] {
			f.Add(uint16(1), s.Frame, true)
		}
	}
	f.Add(uint16(101), []byte{0x45, 0, 0, 20, 0, 0, 0x20, 0, 64, 47, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, false)
	// An IPv6 first fragment (more to come) of a UDP datagram to 4791.
	v6 := make([]byte, 40, 80)
	v6[0], v6[5], v6[6] = 0x60, 24, protoFrag6
	v6 = append(v6, protoUDP, 0, 0, 1, 0, 0, 0, 7, 0xc0, 0, 0x12, 0xb7, 0, 40, 0, 0, 4, 0, 0xff, 0xff, 0, 0, 0, 1)
	f.Add(uint16(101), v6, false)
	f.Fuzz(func(t *testing.T, lt uint16, frame []byte, cut bool) {
		w := walker{frags: newReassembly()}
		et, pkt, ok := rocelayer.NetworkPacket(uint32(lt), frame)
		if !ok {
			return
		}
		for num := 1; num <= 2; num++ { // twice: a fragment meets itself
			fd := w.frame(num, cut, et, pkt)
			if fd.kind == kindRoCE && (len(fd.ip) == 0 || fd.ip[0]>>4 != 4 && fd.ip[0]>>4 != 6) {
				t.Fatalf("RoCEv2 packet without an IP header: %x", fd.ip)
			}
		}
		w.frags.finish()
	})
}

// FuzzCheck: no file (also gzip-compressed) makes the readers or the per-frame check panic or
// read without end.
func FuzzCheck(f *testing.F) {
	if samples, err := rocelayer.SampleFrames(); err == nil {
		f.Add(pcapFile(65535, 1, 0, samples[0].Frame, samples[5].Frame))
		f.Add(bytes.Join([][]byte{shbBlock(0), idbBlock(1), idbBlock(276), epbBlock(0, samples[1].Frame)}, nil))
		f.Add(gzipped(f, pcapFile(65535, 1, 0, samples[2].Frame)))
		f.Add(modifiedPcap(binary.BigEndian, samples[3].Frame))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := openCapture(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			return
		}
		c := &fileCheck{name: "f", out: io.Discard, decoders: map[uint32]gopacket.Decoder{}, walk: walker{frags: newReassembly()}}
		for num := 1; num <= len(data); num++ {
			rec, err := r.next()
			if err != nil {
				break
			}
			c.frame(num, rec)
		}
		c.finish()
	})
}
