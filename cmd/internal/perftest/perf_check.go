package perftest

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// checkHint follows a --check mismatch: the pattern comes from the peer,
// which fills its source only when it runs with --check too.
const checkHint = "the data comes from the peer's source, which holds the pattern only when the peer is a rocev2d run with --check too and the same -s, -n, -q and test"

// perfPattern is the byte at offset off of a --check source region.
func perfPattern(off int) byte { return byte(off*131 + off>>8 + 7) }

func fillPattern(b []byte) {
	for i := range b {
		b[i] = perfPattern(i)
	}
}

// checkPattern verifies that b equals the pattern starting at offset off.
func checkPattern(b []byte, off int) error {
	for i, v := range b {
		if want := perfPattern(off + i); v != want {
			return fmt.Errorf("byte %d is 0x%02x, want 0x%02x", off+i, v, want)
		}
	}
	return nil
}

// checkClientRun compares, on the server of a test whose data it checks
// but does not see arrive (write-bw, atomic-bw), the client's report with
// this side's flags: messages of another size or another count put the
// data elsewhere, and the check would name a byte instead of the cause.
func (s *perfSide) checkClientRun(role oob.Role, res oob.Result, sizes []int) error {
	c := s.c
	if role != oob.Server || c.bidi || c.duration > 0 || !res.HasReport || (c.test != oob.WriteBW && c.test != oob.AtomicBW) {
		return nil
	}
	r := res.RemoteReport
	if size := sizes[len(sizes)-1]; r.Size != uint64(size) {
		return fmt.Errorf("the client sent %d-byte messages, this side expects %d (-s differs? both sides need the same -s)", r.Size, size)
	}
	if iters := c.iters * len(s.qps); r.Iters != uint64(iters) {
		return fmt.Errorf("the client ran %d iterations, this side expects %d (-n differs? both sides need the same -n)", r.Iters, iters)
	}
	return nil
}

// verify checks the data of a --check run on this side: each QP's
// regions, which each hold what one QP alone would have moved.
func (s *perfSide) verify(role oob.Role, sizes []int) error {
	for i := range s.qps {
		if err := s.verifyQP(i, role, sizes); err != nil {
			if len(s.qps) > 1 {
				return fmt.Errorf("QP %d: %w", i, err)
			}
			return err
		}
	}
	return nil
}

// verifyQP checks the data of QP i.
func (s *perfSide) verifyQP(i int, role oob.Role, sizes []int) error {
	c := s.c
	target := s.dst(i)
	switch {
	case c.test == oob.WriteBW && (role == oob.Server || c.bidi):
		if c.duration > 0 {
			return nil
		}
		for _, size := range sizes {
			if err := s.checkSlots(target, size, c.iters); err != nil {
				return fmt.Errorf("size %d: %w", size, err)
			}
		}
	case c.test == oob.ReadBW && (role == oob.Client || c.bidi):
		for _, r := range s.results {
			// r.iters counts every QP's; the QPs take turns.
			if err := s.checkSlots(s.src(i), r.size, r.iters/len(s.qps)); err != nil {
				return fmt.Errorf("size %d: %w", r.size, err)
			}
		}
	case (c.test == oob.AtomicBW || c.test == oob.AtomicLat) && (role == oob.Server || c.bidi):
		if c.duration > 0 {
			return nil
		}
		cycle := int(s.params.CycleBuffer)
		inc := perfInc(8, int(s.params.CacheLine))
		slots := cycle / inc
		if c.test == oob.AtomicLat {
			slots = 1
		}
		for k := 0; k < slots; k++ {
			want := uint64(0)
			if c.atomicType == "FETCH_AND_ADD" {
				want = uint64(c.iters / slots)
				if k < c.iters%slots {
					want++
				}
			}
			if got := binary.NativeEndian.Uint64(target[k*inc:]); got != want {
				return fmt.Errorf("atomic target %d holds %d, want %d", k, got, want)
			}
		}
	case c.test == oob.ReadLat && role == oob.Client:
		for _, size := range sizes {
			if err := checkPattern(s.mem[:size], 0); err != nil {
				return fmt.Errorf("size %d: %w", size, err)
			}
		}
	case c.test == oob.SendLat:
		// The last (largest) message is in the receive buffer.
		if err := checkPattern(target[:sizes[len(sizes)-1]], 0); err != nil {
			return err
		}
	case c.test == oob.WriteLat:
		// The last (largest) write is in the target; the last byte of
		// every size carried an iteration count instead of the pattern.
		last := sizes[len(sizes)-1]
		for i, v := range target[:last] {
			if slices.Contains(sizes, i+1) {
				continue
			}
			if want := perfPattern(i); v != want {
				return fmt.Errorf("byte %d is 0x%02x, want 0x%02x", i, v, want)
			}
		}
		if got := target[last-1]; int(got) != c.iters&0xff {
			return fmt.Errorf("last byte is %d, want the iteration count %d", got, c.iters&0xff)
		}
	}
	return nil
}

// checkSlots checks that the slots iterations 0..iters-1 of size bytes hit
// hold the pattern.
func (s *perfSide) checkSlots(region []byte, size, iters int) error {
	seen := map[uint64]bool{}
	for n := 0; n < iters; n++ {
		off := s.slotOff(size, uint64(n))
		if seen[off] {
			break
		}
		seen[off] = true
		if err := checkPattern(region[off:off+uint64(size)], int(off)); err != nil {
			return err
		}
	}
	return nil
}
