package nvmf

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// sentIO counts the commands the host submitted on its I/O queues.
func sentIO(h *Controller) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := int64(0)
	for _, q := range h.cur.io {
		n += q.subs.Load()
	}
	return n
}

// TestHostRangeChecks: reads, writes and Write Zeroes that reach beyond
// the namespace are refused before anything is sent, with an error
// naming the arguments (ErrOutOfRange); they went to the target, which
// answered LBA Out of Range — or, for a target that checks less, would
// have read or written beyond the disk. An offset near 2^63 makes
// off+len overflow an int64, so the check compares in blocks. Requests
// larger than MDTS are not refused but split (ReadAt/WriteAt take any
// length): a 3 MiB + 512 read goes out as four commands of at most 1 MiB.
func TestHostRangeChecks(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, ns := connectNS(t, ctx, p.hdev, p.targetAddr, &HostConfig{IOQueues: 2, QueueSize: 16})
	defer h.Close()
	size := ns.Size() // 8 MiB: 16384 blocks
	huge := int64(math.MaxInt64) &^ 511
	for _, tc := range []struct {
		name string
		off  int64
		n    int
	}{
		{"at the end", size, 512},
		{"across the end", size - 512, 1024},
		{"across the end, split at MDTS", size - 1<<20, 2 << 20},
		{"LBA 2^53", 1 << 62, 512},
		{"off+len overflows int64", huge, 1024},
	} {
		for _, write := range []bool{false, true} {
			before := sentIO(h)
			var err error
			if write {
				_, err = ns.WriteAtContext(ctx, make([]byte, tc.n), tc.off)
			} else {
				_, err = ns.ReadAtContext(ctx, make([]byte, tc.n), tc.off)
			}
			if !errors.Is(err, ErrOutOfRange) || !strings.Contains(err.Error(), "off ") || !strings.Contains(err.Error(), "len(p) ") {
				t.Errorf("%s (write %v): %v, want ErrOutOfRange naming off and len(p)", tc.name, write, err)
			}
			if sent := sentIO(h) - before; sent != 0 {
				t.Errorf("%s (write %v): %d commands sent", tc.name, write, sent)
			}
		}
	}
	for _, tc := range []struct {
		name        string
		off, length int64
	}{
		{"at the end", size, 512},
		{"across the end", 4096, size},
		{"off+length overflows int64", 512, huge},
	} {
		before := sentIO(h)
		err := ns.WriteZeroes(ctx, tc.off, tc.length)
		if !errors.Is(err, ErrOutOfRange) || !strings.Contains(err.Error(), "length ") {
			t.Errorf("WriteZeroes %s: %v, want ErrOutOfRange naming length", tc.name, err)
		}
		if sent := sentIO(h) - before; sent != 0 {
			t.Errorf("WriteZeroes %s: %d commands sent", tc.name, sent)
		}
	}
	// The last block, and the whole namespace, are within range.
	last := bytes.Repeat([]byte{0xa5}, 512)
	if _, err := ns.WriteAtContext(ctx, last, size-512); err != nil {
		t.Fatalf("write of the last block: %v", err)
	}
	if err := ns.WriteZeroes(ctx, 0, size-512); err != nil {
		t.Fatalf("WriteZeroes of all but the last block: %v", err)
	}
	before := sentIO(h)
	b := make([]byte, 3<<20+512)
	if _, err := ns.ReadAtContext(ctx, b, size-int64(len(b))); err != nil || !bytes.Equal(b[len(b)-512:], last) {
		t.Fatalf("read of the last 3 MiB + 512: %v", err)
	}
	if sent := sentIO(h) - before; sent != 4 || ns.MaxTransfer() != 1<<20 {
		t.Errorf("a read of 3 MiB + 512 went out as %d commands (max transfer %d), want 4", sent, ns.MaxTransfer())
	}
	if st := p.t.Stats(); st.Errors != 0 {
		t.Errorf("the target answered %d errors", st.Errors)
	}
}
