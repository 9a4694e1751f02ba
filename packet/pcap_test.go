package packet

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/google/gopacket/layers"
)

// pcapReader reads classic libpcap files. (gopacket/pcapgo would pull
// golang.org/x/net into go.sum, which this module does not carry.)
type pcapReader struct {
	r        io.Reader
	order    binary.ByteOrder
	linkType layers.LinkType
	hdr      [16]byte
}

func newPcapReader(r io.Reader) (*pcapReader, error) {
	var h [24]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("pcap header: %w", err)
	}
	p := &pcapReader{r: r}
	switch binary.LittleEndian.Uint32(h[:4]) {
	case 0xa1b2c3d4, 0xa1b23c4d: // microsecond, nanosecond
		p.order = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		p.order = binary.BigEndian
	default:
		return nil, fmt.Errorf("not a classic pcap file (magic % x)", h[:4])
	}
	p.linkType = layers.LinkType(p.order.Uint32(h[20:24]) & 0xffff)
	return p, nil
}

// next returns the next record's captured bytes, or io.EOF.
func (p *pcapReader) next() ([]byte, error) {
	if _, err := io.ReadFull(p.r, p.hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("truncated record header: %w", err)
		}
		return nil, err
	}
	n := p.order.Uint32(p.hdr[8:12])
	if n > 1<<20 {
		return nil, fmt.Errorf("record length %d too large", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(p.r, b); err != nil {
		return nil, fmt.Errorf("truncated record: %w", err)
	}
	return b, nil
}
