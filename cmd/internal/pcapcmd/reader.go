package pcapcmd

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/gorocev2/rocev2/rocelayer"
)

// maxFrame is the largest frame pcap check reads (libpcap's largest snap
// length, 262144): a record claiming more is a corrupt file, and no
// buffer is ever sized from a length the file gives beyond it.
const maxFrame = 262144

// maxBlock bounds the non-packet pcapng blocks pcap check reads into
// memory (a section's or interface's options); longer ones of other
// kinds are skipped without reading them in.
const maxBlock = 1 << 20

// Errors wrapped by those of a capture whose record or block lengths make
// no sense.
var (
	errCorruptRecord = errors.New("corrupt record") // classic pcap
	errCorruptBlock  = errors.New("corrupt block")  // pcapng
)

// record is one frame of a capture file.
type record struct {
	data     []byte // the captured bytes (valid until the next read)
	origLen  int    // the frame's length on the wire
	linkType uint32 // the full link type of the frame's interface
	// notPacket marks a pcapng block Wireshark lists among the frames
	// though it holds no packet (a systemd Journal Export or a Custom
	// Block): it takes a frame number and is not checked.
	notPacket bool
}

// frameReader reads the frames of a capture file. next returns io.EOF at
// the clean end of the file, io.ErrUnexpectedEOF (wrapped) when the file
// ends inside a record, and an error wrapping errCorruptRecord or errCorruptBlock
// for a corrupt record.
type frameReader interface {
	next() (record, error)
}

// pcapngMagic is the block type of a pcapng Section Header Block.
var pcapngMagic = []byte{0x0a, 0x0d, 0x0d, 0x0a}

// gzipMagic starts a gzip stream (RFC 1952): tcpdump -w - | gzip, or
// Wireshark's "compress with gzip", and tshark reads such files.
var gzipMagic = []byte{0x1f, 0x8b}

// compressions names the compressed formats pcap check does not read, by
// the magic number their files start with, and how to decompress them.
var compressions = []struct {
	magic []byte
	name  string
}{
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, "zstd-compressed (decompress it first: zstd -d)"},
	{[]byte{0x04, 0x22, 0x4d, 0x18}, "LZ4-compressed (decompress it first: lz4 -d)"},
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0}, "xz-compressed (decompress it first: xz -d)"},
	{[]byte("BZh"), "bzip2-compressed (decompress it first: bzip2 -d)"},
}

// openCapture returns the reader of a classic pcap or a pcapng file, either
// as it is or gzip-compressed.
func openCapture(br *bufio.Reader) (frameReader, error) {
	if magic, _ := br.Peek(len(gzipMagic)); bytes.Equal(magic, gzipMagic) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip-compressed file: %w", err)
		}
		r, err := openUncompressed(bufio.NewReaderSize(zr, 1<<16))
		if err != nil {
			return nil, fmt.Errorf("gzip-compressed file: %w", err)
		}
		return r, nil
	}
	return openUncompressed(br)
}

// openUncompressed returns the reader of a classic pcap or a pcapng file.
func openUncompressed(br *bufio.Reader) (frameReader, error) {
	magic, err := br.Peek(4)
	if err == nil && string(magic) == string(pcapngMagic) {
		return newNgReader(br)
	}
	head, _ := br.Peek(6)
	for _, c := range compressions {
		if bytes.HasPrefix(head, c.magic) {
			return nil, errors.New("not a pcap or pcapng file: " + c.name)
		}
	}
	return newPcapReader(br)
}

// readFull reads len(b) bytes: io.EOF if none were left, and
// io.ErrUnexpectedEOF if only some.
func readFull(r io.Reader, b []byte) error {
	_, err := io.ReadFull(r, b)
	return err
}

// pcapReader reads a classic pcap file (either byte order, micro- or
// nanosecond timestamps, also the Kuznetzov "modified" format).
type pcapReader struct {
	r        *bufio.Reader
	bo       binary.ByteOrder
	linkType uint32
	fcsLen   int // bytes of FCS at each frame's end (link type's FCS bits)
	// extra is the bytes each record header has beyond the standard 16:
	// 8 in the "modified" format of Alexey Kuznetzov's patched libpcap
	// (magic 0xa1b2cd34: interface index, protocol, packet type, pad),
	// which old Red Hat tcpdump wrote and tshark reads.
	extra int
	buf   []byte
}

// pcapModifiedMagic is the magic of the Kuznetzov "modified" pcap format.
const pcapModifiedMagic = 0xa1b2cd34

// Link-type field bits of a classic pcap header (pcap-linktype(7)): the
// link type is the low 16 bits (libpcap's LT_LINKTYPE); when the P bit is
// set, bits 28-31 give the FCS length in 16-bit units.
const (
	pcapFCSPresent = 0x04000000
	pcapFCSShift   = 28
)

// newPcapReader reads a classic pcap header. A snap length of 0 or one
// smaller than the records is not trusted (libpcap neither): records up to
// maxFrame are read whatever it says.
func newPcapReader(br *bufio.Reader) (*pcapReader, error) {
	var h [24]byte
	if err := readFull(br, h[:]); err != nil {
		if errors.Is(err, io.EOF) {
			// No byte at all (was "header: EOF").
			return nil, errors.New("empty file, not a pcap or pcapng capture")
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			// Not a short file: a directory, an I/O error.
			return nil, err
		}
		return nil, fmt.Errorf("not a pcap or pcapng file: header: %w (the file is shorter than a pcap header)", err)
	}
	p := &pcapReader{r: br}
	switch {
	case binary.LittleEndian.Uint32(h[:]) == 0xa1b2c3d4 || binary.LittleEndian.Uint32(h[:]) == 0xa1b23c4d:
		p.bo = binary.LittleEndian
	case binary.BigEndian.Uint32(h[:]) == 0xa1b2c3d4 || binary.BigEndian.Uint32(h[:]) == 0xa1b23c4d:
		p.bo = binary.BigEndian
	case binary.LittleEndian.Uint32(h[:]) == pcapModifiedMagic:
		p.bo, p.extra = binary.LittleEndian, 8
	case binary.BigEndian.Uint32(h[:]) == pcapModifiedMagic:
		p.bo, p.extra = binary.BigEndian, 8
	default:
		return nil, fmt.Errorf("not a pcap or pcapng file: magic 0x%08x", binary.LittleEndian.Uint32(h[:]))
	}
	lt := p.bo.Uint32(h[20:])
	p.linkType = lt & 0xffff
	if lt&pcapFCSPresent != 0 {
		p.fcsLen = int(lt>>pcapFCSShift) * 2
	}
	if _, err := rocelayer.LinkDecoder(p.linkType); err != nil {
		return nil, err
	}
	return p, nil
}

// next reads the next record.
func (p *pcapReader) next() (record, error) {
	var h [24]byte
	if err := readFull(p.r, h[:16+p.extra]); err != nil {
		return record{}, err
	}
	capLen, origLen := p.bo.Uint32(h[8:]), p.bo.Uint32(h[12:])
	if capLen > maxFrame {
		return record{}, fmt.Errorf("%w: captured length %d exceeds the maximum %d", errCorruptRecord, capLen, maxFrame)
	}
	if cap(p.buf) < int(capLen) {
		p.buf = make([]byte, capLen)
	}
	data := p.buf[:capLen]
	if err := readFull(p.r, data); err != nil {
		return record{}, io.ErrUnexpectedEOF
	}
	rec := record{data: data, origLen: int(max(origLen, capLen)), linkType: p.linkType}
	return stripFCS(rec, p.fcsLen), nil
}

// stripFCS removes an FCS of n bytes from the end of the frame (as much
// of it as the capture kept).
func stripFCS(rec record, n int) record {
	if n == 0 || rec.origLen < n {
		return rec
	}
	rec.origLen -= n
	rec.data = rec.data[:min(len(rec.data), rec.origLen)]
	return rec
}

// pcapng block types pcap check reads.
const (
	ngSHB = 0x0a0d0d0a // section header
	ngIDB = 1          // interface description
	ngPB  = 2          // packet (obsolete)
	ngSPB = 3          // simple packet
	ngEPB = 6          // enhanced packet
	// Blocks Wireshark numbers as frames: systemd Journal Export, and
	// Custom Blocks (copied or not).
	ngJournal    = 9
	ngCustom     = 0x00000bad
	ngCustomNoCp = 0x40000bad
)

// ngInterface is an interface of a pcapng section.
type ngInterface struct {
	linkType uint32
	snapLen  uint32
}

// ngReader reads a pcapng file: every section, every interface, each
// frame with its own interface's link type (16 bits, as the file has it).
type ngReader struct {
	r      *bufio.Reader
	bo     binary.ByteOrder
	ifaces []ngInterface
	buf    []byte
}

// newNgReader reads the first Section Header Block.
func newNgReader(br *bufio.Reader) (*ngReader, error) {
	n := &ngReader{r: br}
	var h [8]byte
	err := readFull(br, h[:])
	if err == nil {
		err = n.readSHB(h)
	}
	if err != nil {
		return nil, fmt.Errorf("pcapng: %w", err)
	}
	return n, nil
}

// readSHB reads the rest of a Section Header Block whose first 8 bytes
// (type and length) are h: the byte order of the section, and a fresh
// interface list.
func (n *ngReader) readSHB(h [8]byte) error {
	var bom [4]byte
	if err := readFull(n.r, bom[:]); err != nil {
		return io.ErrUnexpectedEOF
	}
	switch {
	case binary.LittleEndian.Uint32(bom[:]) == 0x1a2b3c4d:
		n.bo = binary.LittleEndian
	case binary.BigEndian.Uint32(bom[:]) == 0x1a2b3c4d:
		n.bo = binary.BigEndian
	default:
		return fmt.Errorf("%w: section header without a byte-order magic", errCorruptBlock)
	}
	total := n.bo.Uint32(h[4:])
	if total < 28 || total%4 != 0 {
		return fmt.Errorf("%w: section header block length %d", errCorruptBlock, total)
	}
	n.ifaces = n.ifaces[:0]
	return n.skip(int64(total) - 12)
}

// skip discards k bytes of the current block.
func (n *ngReader) skip(k int64) error {
	m, err := io.CopyN(io.Discard, n.r, k)
	if m < k {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}

// next reads blocks up to the next packet block.
func (n *ngReader) next() (record, error) {
	for {
		var h [8]byte
		if err := readFull(n.r, h[:]); err != nil {
			return record{}, err
		}
		typ := n.bo.Uint32(h[:])
		if typ == ngSHB {
			if err := n.readSHB(h); err != nil {
				return record{}, err
			}
			continue
		}
		total := n.bo.Uint32(h[4:])
		if total < 12 || total%4 != 0 {
			return record{}, fmt.Errorf("%w: block type %d has length %d", errCorruptBlock, typ, total)
		}
		body := int64(total) - 12 // without the type and both lengths
		switch typ {
		case ngIDB:
			if err := n.readIDB(body); err != nil {
				return record{}, err
			}
		case ngEPB, ngPB, ngSPB:
			return n.readPacket(typ, body)
		case ngJournal, ngCustom, ngCustomNoCp:
			if err := n.skip(body + 4); err != nil {
				return record{}, err
			}
			return record{notPacket: true}, nil
		default:
			if err := n.skip(body + 4); err != nil {
				return record{}, err
			}
		}
	}
}

// readIDB reads an Interface Description Block's body (body bytes, then
// the trailing length).
func (n *ngReader) readIDB(body int64) error {
	if body < 8 || body > maxBlock {
		return fmt.Errorf("%w: interface description block length %d", errCorruptBlock, body+12)
	}
	b := make([]byte, body+4)
	if err := readFull(n.r, b); err != nil {
		return io.ErrUnexpectedEOF
	}
	n.ifaces = append(n.ifaces, ngInterface{linkType: uint32(n.bo.Uint16(b)), snapLen: n.bo.Uint32(b[4:])})
	return nil
}

// Fixed parts (after type and length) of the packet blocks.
const (
	epbFixed = 20 // interface, timestamp (2), captured and original length
	pbFixed  = 20 // interface (16 bits), drops (16 bits), timestamp (2), lengths
	spbFixed = 4  // original length
)

// readPacket reads a packet block's body (body bytes, then the trailing
// length).
func (n *ngReader) readPacket(typ uint32, body int64) (record, error) {
	fixed := map[uint32]int64{ngEPB: epbFixed, ngPB: pbFixed, ngSPB: spbFixed}[typ]
	if body < fixed {
		return record{}, fmt.Errorf("%w: packet block length %d is less than the minimum %d", errCorruptBlock, body+12, fixed+12)
	}
	var f [epbFixed]byte
	if err := readFull(n.r, f[:fixed]); err != nil {
		return record{}, io.ErrUnexpectedEOF
	}
	iface, capLen, origLen := n.packetLengths(typ, f[:fixed], body-fixed)
	if int(iface) >= len(n.ifaces) {
		return record{}, fmt.Errorf("%w: packet on interface %d, but the section describes %d", errCorruptBlock, iface, len(n.ifaces))
	}
	if int64(capLen) > body-fixed || capLen > maxFrame {
		return record{}, fmt.Errorf("%w: captured length %d exceeds the block (%d bytes) or the maximum %d", errCorruptBlock, capLen, body-fixed, maxFrame)
	}
	if cap(n.buf) < int(capLen) {
		n.buf = make([]byte, capLen)
	}
	data := n.buf[:capLen]
	if err := readFull(n.r, data); err != nil {
		return record{}, io.ErrUnexpectedEOF
	}
	if err := n.skip(body - fixed - int64(capLen) + 4); err != nil {
		return record{}, err
	}
	return record{data: data, origLen: int(max(origLen, capLen)), linkType: n.ifaces[iface].linkType}, nil
}

// packetLengths returns a packet block's interface and lengths from its
// fixed part; room is what the block has after it.
func (n *ngReader) packetLengths(typ uint32, f []byte, room int64) (iface, capLen, origLen uint32) {
	switch typ {
	case ngEPB:
		return n.bo.Uint32(f), n.bo.Uint32(f[12:]), n.bo.Uint32(f[16:])
	case ngPB:
		return uint32(n.bo.Uint16(f)), n.bo.Uint32(f[12:]), n.bo.Uint32(f[16:])
	}
	// A Simple Packet Block: interface 0, captured length the smaller of
	// the original length, the snap length and the block.
	origLen = n.bo.Uint32(f)
	capLen = uint32(min(int64(origLen), room))
	if len(n.ifaces) > 0 && n.ifaces[0].snapLen > 0 {
		capLen = min(capLen, n.ifaces[0].snapLen)
	}
	return 0, capLen, origLen
}
