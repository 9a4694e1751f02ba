package nvme

import (
	"bytes"
	"testing"
)

// FuzzParse feeds every parser arbitrary bytes: nothing panics, and the
// fixed-size structures re-encode to the bytes they were decoded from.
func FuzzParse(f *testing.F) {
	s := make([]byte, SQESize+32)
	(&RW{NSID: 1, SLBA: 64, NLB: 15}).Put(SQE(s), IORead)
	sg := Keyed(0xff3c22e082665800, 8192, 0x145b4, true)
	SQE(s).SGL().Encode(&sg)
	f.Add(s)
	f.Add([]byte{0, 0, 32, 0, 31, 0})
	f.Add(make([]byte, DiscoveryHeaderSize+DiscoveryEntrySize))
	f.Add([]byte{3, 16, 0, 0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := ParseSQE(b); err == nil {
			fl := q.Fields()
			out := make(SQE, SQESize)
			out.Encode(&fl)
			if !bytes.Equal(out, q) {
				t.Fatalf("SQE %x re-encoded as %x", []byte(q), []byte(out))
			}
			_, _, _, _, _ = ConnectOf(q), PropertyOf(q), IdentifyOf(q), FeaturesOf(q), GetLogPageOf(q)
			_, _ = RWOf(q), DSMOf(q)
		}
		if c, err := ParseCQE(b); err == nil {
			fl := c.Fields()
			out := make(CQE, CQESize)
			out.Encode(&fl)
			if !bytes.Equal(out, c) {
				t.Fatalf("CQE %x re-encoded as %x", []byte(c), []byte(out))
			}
		}
		if len(b) >= SGLSize {
			g := SGL(b[:SGLSize])
			fl := g.Fields()
			out := make(SGL, SGLSize)
			out.Encode(&fl)
			// A keyed descriptor has no reserved bytes; others keep them.
			if !bytes.Equal(out, g) {
				t.Fatalf("SGL %x re-encoded as %x", []byte(g), []byte(out))
			}
		}
		if r, err := ParseCMReq(b); err == nil {
			_ = r.Fields()
		}
		if r, err := ParseCMRep(b); err == nil {
			_ = r.Fields()
		}
		if r, err := ParseCMRej(b); err == nil {
			fl := r.Fields()
			out := make(CMRej, CMRejSize)
			out.Encode(&fl)
			if !bytes.Equal(out, r) {
				t.Fatalf("REJ %x re-encoded as %x", []byte(r), []byte(out))
			}
		}
		if d, err := ParseConnectData(b); err == nil {
			_ = d.Fields()
		}
		if c, err := ParseIdentifyController(b); err == nil {
			_ = c.Fields()
		}
		if n, err := ParseIdentifyNamespace(b); err == nil {
			fl := n.Fields()
			_ = fl.BlockShift()
		}
		_ = ActiveNSList(b)
		if ds, err := NSDescriptors(b); err == nil {
			out := make([]byte, len(b))
			if _, err := PutNSDescriptors(out, ds); err != nil {
				t.Fatalf("PutNSDescriptors of decoded descriptors: %v", err)
			}
		}
		_ = DSMRanges(b)
		if h, err := DiscoveryHeaderOf(b); err == nil {
			for i := 0; i < 4 && uint64(i) < h.NumRec; i++ {
				_, _ = DiscoveryEntryOf(b, i)
			}
		}
	})
}
