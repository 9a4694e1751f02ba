package pcapfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	frames := [][]byte{{1, 2, 3}, make([]byte, 1500), {}}
	t0 := time.Unix(1700000000, 123456000).UTC()
	for i, f := range frames {
		ci := gopacket.CaptureInfo{Timestamp: t0.Add(time.Duration(i) * time.Millisecond), CaptureLength: len(f), Length: len(f) + i}
		if err := w.WritePacket(ci, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WritePacket(gopacket.CaptureInfo{CaptureLength: 2, Length: 2}, []byte{1}); err == nil {
		t.Error("inconsistent capture length accepted")
	}
	r, err := NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkType() != layers.LinkTypeEthernet || r.Snaplen() != 65535 {
		t.Errorf("link type %v snaplen %d", r.LinkType(), r.Snaplen())
	}
	for i, f := range frames {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, f) || ci.Length != len(f)+i || !ci.Timestamp.Equal(t0.Add(time.Duration(i)*time.Millisecond)) {
			t.Errorf("frame %d: %d bytes len %d ts %v", i, len(data), ci.Length, ci.Timestamp)
		}
	}
	if _, _, err := r.ReadPacketData(); !errors.Is(err, io.EOF) {
		t.Errorf("end: %v", err)
	}
	// Cut inside the last record with data.
	r, _ = NewReader(bytes.NewReader(buf.Bytes()[:24+16+3+16+100]))
	r.ReadPacketData()
	if _, _, err := r.ReadPacketData(); !errors.Is(err, ErrTruncatedFile) {
		t.Errorf("truncated: %v", err)
	}
}

func TestBigEndianNanos(t *testing.T) {
	h := make([]byte, 24+16+2)
	binary.BigEndian.PutUint32(h, magicNanos)
	binary.BigEndian.PutUint32(h[20:], 101)
	binary.BigEndian.PutUint32(h[24:], 5)
	binary.BigEndian.PutUint32(h[28:], 7)
	binary.BigEndian.PutUint32(h[32:], 2)
	binary.BigEndian.PutUint32(h[36:], 2)
	r, err := NewReader(bytes.NewReader(h))
	if err != nil {
		t.Fatal(err)
	}
	_, ci, err := r.ReadPacketData()
	if err != nil || r.LinkType() != layers.LinkTypeRaw || ci.Timestamp.UnixNano() != 5e9+7 {
		t.Errorf("%v %v %v", err, r.LinkType(), ci.Timestamp.UnixNano())
	}
}

func TestNotPCAP(t *testing.T) {
	tests := []struct {
		in   []byte
		want error
	}{
		{[]byte("hello"), ErrNotPCAP},
		{bytes.Repeat([]byte("garbage!"), 10), ErrNotPCAP},
		{append([]byte{0x0a, 0x0d, 0x0d, 0x0a}, make([]byte, 40)...), ErrPCAPNG},
	}
	for _, tt := range tests {
		if _, err := NewReader(bytes.NewReader(tt.in)); !errors.Is(err, tt.want) {
			t.Errorf("%q: %v, want %v", tt.in[:4], err, tt.want)
		}
	}
	h := make([]byte, 24+16)
	binary.LittleEndian.PutUint32(h, magicMicros)
	binary.LittleEndian.PutUint32(h[24+8:], MaxSnaplen+1)
	r, _ := NewReader(bytes.NewReader(h))
	if _, _, err := r.ReadPacketData(); !errors.Is(err, ErrBadRecord) {
		t.Errorf("huge record: %v", err)
	}
}
