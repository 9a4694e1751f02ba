package oob

import (
	"bytes"
	"errors"
	"testing"
)

// seedGoldens adds every recorded payload of the captures to f's corpus.
func seedGoldens(f *testing.F, size int) {
	for _, name := range pingpongGoldens {
		for _, s := range loadGolden(f, name).segs {
			if len(s.data) == size {
				f.Add(s.data)
			}
		}
	}
	for _, pg := range perfGoldens {
		for _, s := range loadGolden(f, pg.name).segs {
			if len(s.data) == size {
				f.Add(s.data)
			}
		}
	}
}

func FuzzParsePerfDest(f *testing.F) {
	f.Add(testDest.Marshal())
	f.Add(bytes.Repeat([]byte{':'}, PerfDestSize))
	f.Add([]byte{})
	seedGoldens(f, PerfDestSize)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParsePerfDest(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		// Accepted input is the canonical encoding up to hex letter case.
		if m := d.Marshal(); !bytes.Equal(m, bytes.ToLower(b)) {
			t.Fatalf("Marshal(Parse(%q)) = %q", b, m)
		}
	})
}

func FuzzParsePingpongDest(f *testing.F) {
	f.Add(PingpongDest{QPN: 0x12, PSN: 0x76a9a2}.Marshal())
	f.Add([]byte{})
	seedGoldens(f, PingpongDestSize)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParsePingpongDest(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		if m := d.Marshal(); !bytes.Equal(m, bytes.ToLower(b)) {
			t.Fatalf("Marshal(Parse(%q)) = %q", b, m)
		}
	})
}

func FuzzParseSmallMessages(f *testing.F) {
	seedGoldens(f, VersionSize)
	seedGoldens(f, 2)
	f.Add([]byte("6.28\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add(make([]byte, ReportSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, fv, err := ParseVersion(b); err == nil {
			_ = CheckPeerVersion(v, fv)
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatal(err)
		}
		if m, err := ParseMTU(b); err == nil && (!m.Valid() || m.Bytes() == 0) {
			t.Fatalf("ParseMTU(%q) = %v", b, m)
		}
		if r, err := ParseReport(b); err == nil {
			var out [ReportSize]byte
			r.Encode(out[:])
			if !bytes.Equal(out[:], b) {
				t.Fatalf("report round trip %x != %x", out, b)
			}
		}
	})
}
