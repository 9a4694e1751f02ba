package nvmf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/nvme"
)

// HostNamespace is a namespace seen through a host Controller: a block
// device with ReadAt/WriteAt. Offsets and lengths must be multiples of the
// block size (as with O_DIRECT). Requests larger than the controller's
// maximum transfer are split and their pieces run concurrently. Safe for
// concurrent use: goroutines calling it at once keep many commands in
// flight across the I/O queues.
type HostNamespace struct {
	h        *Controller
	id       uint32
	shift    uint8
	blocks   uint64
	ro       bool
	maxBytes int
}

// ErrAlignment: an offset or length is not a multiple of the block size.
var ErrAlignment = errors.New("nvmf: offset or length not a multiple of the block size")

// Namespace identifies namespace nsid and returns it.
func (h *Controller) Namespace(ctx context.Context, nsid uint32) (*HostNamespace, error) {
	a, err := h.assoc(ctx)
	if err != nil {
		return nil, err
	}
	b := make([]byte, nvme.IdentifySize)
	err = identify(ctx, a.admin, nvme.Identify{CNS: nvme.CNSNamespace, NSID: nsid}, b)
	h.count(err)
	if err != nil {
		return nil, err
	}
	f := nvme.IdentifyNamespace(b).Fields()
	shift := f.BlockShift()
	// The size in bytes must be an int64 (Size, offsets): 2^63 bytes is
	// no disk, but a broken target's NSZE.
	if f.NSZE == 0 || shift < 9 || shift > 16 || f.NSZE > math.MaxInt64>>shift {
		return nil, fmt.Errorf("nvmf: namespace %d: size %d, block shift %d", nsid, f.NSZE, shift)
	}
	id, err := h.Identify(ctx)
	if err != nil {
		return nil, err
	}
	maxBytes := MaxTransfer
	if id.MDTS > 0 && id.MDTS < 20 {
		maxBytes = min(maxBytes, 4096<<id.MDTS)
	}
	maxBytes = min(maxBytes, 65536<<shift, nvme.MaxKeyedLength+1-(1<<shift))
	return &HostNamespace{h: h, id: nsid, shift: shift, blocks: f.NSZE, ro: f.NSATTR&1 != 0, maxBytes: maxBytes}, nil
}

// ID returns the namespace ID.
func (n *HostNamespace) ID() uint32 { return n.id }

// BlockSize returns the LBA data size.
func (n *HostNamespace) BlockSize() int { return 1 << n.shift }

// Size returns the capacity in bytes.
func (n *HostNamespace) Size() int64 { return int64(n.blocks << n.shift) }

// ReadOnly reports a write-protected namespace.
func (n *HostNamespace) ReadOnly() bool { return n.ro }

// MaxTransfer returns the largest piece one command moves.
func (n *HostNamespace) MaxTransfer() int { return n.maxBytes }

// ReadAt reads len(p) bytes at off (io.ReaderAt).
func (n *HostNamespace) ReadAt(p []byte, off int64) (int, error) {
	return n.ReadAtContext(context.Background(), p, off)
}

// WriteAt writes p at off (io.WriterAt). A nil error means the controller
// acknowledged every block.
func (n *HostNamespace) WriteAt(p []byte, off int64) (int, error) {
	return n.WriteAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt bounded by ctx.
func (n *HostNamespace) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return n.rw(ctx, nvme.IORead, p, off)
}

// WriteAtContext is WriteAt bounded by ctx.
func (n *HostNamespace) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return n.rw(ctx, nvme.IOWrite, p, off)
}

// Flush asks the controller to make written data durable.
func (n *HostNamespace) Flush(ctx context.Context) error {
	q, err := n.h.ioQueue(ctx)
	if err != nil {
		return err
	}
	_, err = q.do(ctx, &request{build: func(s nvme.SQE) { s.SetOpcode(nvme.IOFlush); s.SetNSID(n.id) }})
	n.h.count(err)
	return err
}

// WriteZeroes zeroes length bytes at off.
func (n *HostNamespace) WriteZeroes(ctx context.Context, off, length int64) error {
	bs := int64(1) << n.shift
	if off%bs != 0 || length%bs != 0 || off < 0 || length < 0 {
		return ErrAlignment
	}
	for length > 0 {
		k := min(length, 65536<<n.shift)
		q, err := n.h.ioQueue(ctx)
		if err != nil {
			return err
		}
		rw := nvme.RW{NSID: n.id, SLBA: uint64(off) >> n.shift, NLB: uint16(k>>n.shift - 1)}
		_, err = q.do(ctx, &request{build: func(s nvme.SQE) { rw.Put(s, nvme.IOWriteZeroes) }})
		n.h.count(err)
		if err != nil {
			return err
		}
		off, length = off+k, length-k
	}
	return nil
}

func (n *HostNamespace) rw(ctx context.Context, op nvme.Opcode, p []byte, off int64) (int, error) {
	bs := int64(1) << n.shift
	if off < 0 || off%bs != 0 || int64(len(p))%bs != 0 {
		return 0, ErrAlignment
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) <= n.maxBytes {
		if err := n.one(ctx, op, p, off); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	var wg sync.WaitGroup
	errs := make([]error, (len(p)+n.maxBytes-1)/n.maxBytes)
	for i := range errs {
		lo := i * n.maxBytes
		hi := min(lo+n.maxBytes, len(p))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.one(ctx, op, p[lo:hi], off+int64(lo))
		}()
	}
	wg.Wait()
	// The bytes before the first failed piece are done.
	for i, err := range errs {
		if err != nil {
			return i * n.maxBytes, err
		}
	}
	return len(p), nil
}

// one runs one Read or Write command. A command lost with its connection
// is sent again once the controller is back (block reads and writes are
// idempotent; Linux's host requeues them the same way), unless the host
// does not reconnect (CtrlLossTimeout < 0) or gave up.
func (n *HostNamespace) one(ctx context.Context, op nvme.Opcode, p []byte, off int64) error {
	rw := nvme.RW{NSID: n.id, SLBA: uint64(off) >> n.shift, NLB: uint16(len(p)>>n.shift - 1)}
	r := &request{build: func(s nvme.SQE) { rw.Put(s, op) }}
	if op == nvme.IOWrite {
		r.out = p
	} else {
		r.in = p
	}
	var failed *hqueue // the queue the command was lost with
	for {
		q, err := n.h.ioQueue(ctx)
		if err != nil {
			if failed != nil {
				n.h.count(err) // the command was lost, and is not sent again
			}
			return err
		}
		if failed != nil && q != failed {
			n.h.requeued.Add(1) // sent again, on the controller that is back
		}
		_, err = q.do(ctx, r)
		if err == nil || !errors.Is(err, ErrDisconnected) || n.h.cfg.CtrlLossTimeout < 0 || ctx.Err() != nil {
			n.h.count(err)
			return err
		}
		// Counted once, when the command ends: not at every look at the
		// dead queue while the association is not yet marked lost.
		failed = q
		select { // the association may not be marked lost yet
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
}
