// Package pcapfile reads and writes classic libpcap capture files.
//
// Its API mirrors gopacket/pcapgo's Reader and Writer (NewReader,
// ReadPacketData, LinkType, NewWriter, WriteFileHeader, WritePacket). It
// exists because pcapgo imports golang.org/x/net/bpf, a module this
// repository does not list in go.sum; switching to pcapgo is a change of
// import path.
package pcapfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Magic numbers of the file header.
const (
	magicMicros = 0xa1b2c3d4
	magicNanos  = 0xa1b23c4d
	magicNG     = 0x0a0d0d0a // pcapng section header block
)

const (
	fileHeaderLen   = 24
	recordHeaderLen = 16
	// MaxSnaplen bounds the record length this reader accepts.
	MaxSnaplen = 1 << 18
)

// Errors of the reader (errors.Is-able).
var (
	// ErrNotPCAP means the file does not start with a pcap magic number.
	ErrNotPCAP = errors.New("pcapfile: not a pcap file (bad magic number)")
	// ErrPCAPNG means the file is pcapng, which this package does not read.
	ErrPCAPNG = errors.New("pcapfile: pcapng file (only classic pcap is read; convert with `editcap -F pcap`)")
	// ErrBadRecord means a record header is inconsistent (length too big).
	ErrBadRecord = errors.New("pcapfile: bad record header")
	// ErrTruncatedFile means the file ends inside a record.
	ErrTruncatedFile = errors.New("pcapfile: file ends inside a record")
)

// Reader reads frames from a classic pcap file.
type Reader struct {
	r        io.Reader
	order    binary.ByteOrder
	nanos    bool
	snaplen  uint32
	linkType layers.LinkType
	hdr      [recordHeaderLen]byte
}

// NewReader reads the file header from r.
func NewReader(r io.Reader) (*Reader, error) {
	var h [fileHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w (file shorter than the 24-byte header)", ErrNotPCAP)
		}
		return nil, err
	}
	rd := &Reader{r: r}
	switch m := binary.LittleEndian.Uint32(h[:4]); m {
	case magicMicros, magicNanos:
		rd.order = binary.LittleEndian
		rd.nanos = m == magicNanos
	case magicNG:
		return nil, ErrPCAPNG
	default:
		switch binary.BigEndian.Uint32(h[:4]) {
		case magicMicros, magicNanos:
			rd.order = binary.BigEndian
			rd.nanos = binary.BigEndian.Uint32(h[:4]) == magicNanos
		default:
			return nil, fmt.Errorf("%w: %#08x", ErrNotPCAP, m)
		}
	}
	rd.snaplen = rd.order.Uint32(h[16:20])
	rd.linkType = layers.LinkType(rd.order.Uint32(h[20:24]) & 0x0fffffff)
	return rd, nil
}

// LinkType returns the link type of the file's frames.
func (r *Reader) LinkType() layers.LinkType { return r.linkType }

// Snaplen returns the file header's snapshot length.
func (r *Reader) Snaplen() uint32 { return r.snaplen }

// ReadPacketData returns the next frame (a new slice) and its capture info.
// At the end of the file it returns io.EOF; a file that ends inside a record
// gives ErrTruncatedFile.
func (r *Reader) ReadPacketData() ([]byte, gopacket.CaptureInfo, error) {
	var ci gopacket.CaptureInfo
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, ci, ErrTruncatedFile
		}
		return nil, ci, err
	}
	sec := r.order.Uint32(r.hdr[0:4])
	frac := r.order.Uint32(r.hdr[4:8])
	capLen := r.order.Uint32(r.hdr[8:12])
	origLen := r.order.Uint32(r.hdr[12:16])
	if capLen > MaxSnaplen {
		return nil, ci, fmt.Errorf("%w: captured length %d > %d", ErrBadRecord, capLen, MaxSnaplen)
	}
	if !r.nanos {
		frac *= 1000
	}
	ci.Timestamp = time.Unix(int64(sec), int64(frac)).UTC()
	ci.CaptureLength = int(capLen)
	ci.Length = int(origLen)
	data := make([]byte, capLen)
	if _, err := io.ReadFull(r.r, data); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, ci, ErrTruncatedFile
		}
		return nil, ci, err
	}
	return data, ci, nil
}

// Writer writes a classic pcap file (microsecond timestamps, little-endian).
type Writer struct {
	w       io.Writer
	snaplen uint32
}

// NewWriter returns a Writer; call WriteFileHeader first.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteFileHeader writes the file header.
func (w *Writer) WriteFileHeader(snaplen uint32, linkType layers.LinkType) error {
	var h [fileHeaderLen]byte
	binary.LittleEndian.PutUint32(h[0:], magicMicros)
	binary.LittleEndian.PutUint16(h[4:], 2) // version 2.4
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], snaplen)
	binary.LittleEndian.PutUint32(h[20:], uint32(linkType))
	w.snaplen = snaplen
	_, err := w.w.Write(h[:])
	return err
}

// WritePacket writes one record. ci.CaptureLength must equal len(data).
func (w *Writer) WritePacket(ci gopacket.CaptureInfo, data []byte) error {
	if ci.CaptureLength != len(data) {
		return fmt.Errorf("pcapfile: capture length %d != data length %d", ci.CaptureLength, len(data))
	}
	if ci.Length < ci.CaptureLength {
		return fmt.Errorf("pcapfile: length %d < capture length %d", ci.Length, ci.CaptureLength)
	}
	if w.snaplen != 0 && uint32(len(data)) > w.snaplen {
		return fmt.Errorf("pcapfile: %d bytes exceed the snaplen %d", len(data), w.snaplen)
	}
	var h [recordHeaderLen]byte
	t := ci.Timestamp
	binary.LittleEndian.PutUint32(h[0:], uint32(t.Unix()))
	binary.LittleEndian.PutUint32(h[4:], uint32(t.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(h[8:], uint32(ci.CaptureLength))
	binary.LittleEndian.PutUint32(h[12:], uint32(ci.Length))
	if _, err := w.w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.w.Write(data)
	return err
}
