package nvmf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
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
	st       *nsState
}

// ErrAlignment: an offset or length is not a multiple of the block size
// (or the offset is negative).
var ErrAlignment = errors.New("nvmf: offset or length not a multiple of the block size")

// ErrOutOfRange: a read, write or Write Zeroes reaches beyond the end of
// the namespace (NSZE blocks). Nothing of it is sent: Linux's block layer
// never sends I/O beyond a disk's capacity either.
var ErrOutOfRange = errors.New("nvmf: beyond the end of the namespace")

// ErrNamespaceChanged: after a reconnect the controller reported another
// namespace behind the NSID (other identifiers, size or block size) or
// none. Every later command of the HostNamespace fails with it, reads and
// writes that were waiting for the reconnect included: the data behind
// it is not the data the caller wrote. Controller.Namespace again returns
// the namespace there now.
var ErrNamespaceChanged = errors.New("nvmf: namespace changed")

// errBadNamespace: Identify Namespace data the host cannot use.
var errBadNamespace = errors.New("nvmf: unusable namespace")

// nsIdentity tells one namespace's data from another's behind the same
// NSID: its identifiers and the geometry the host addresses it by. A
// target restarted on other data (a memory namespace, a file made
// again) reports other identifiers (docs/NVMEOF.md, "Identity across
// restarts"); one without identifiers is still told apart by size.
type nsIdentity struct {
	nguid  [16]byte
	eui64  [8]byte
	uuid   [16]byte
	blocks uint64
	shift  uint8
}

// diff describes how b differs from a ("" if not).
func (a nsIdentity) diff(b nsIdentity) string {
	switch {
	case a.nguid != b.nguid:
		return fmt.Sprintf("NGUID %x, was %x", b.nguid, a.nguid)
	case a.eui64 != b.eui64:
		return fmt.Sprintf("EUI64 %x, was %x", b.eui64, a.eui64)
	case a.uuid != b.uuid:
		return fmt.Sprintf("UUID %x, was %x", b.uuid, a.uuid)
	case a.shift != b.shift:
		return fmt.Sprintf("block size %d, was %d", 1<<b.shift, 1<<a.shift)
	case a.blocks != b.blocks:
		return fmt.Sprintf("%d blocks, was %d", b.blocks, a.blocks)
	}
	return ""
}

// nsState is an NSID's namespace as the host identified it, shared by the
// HostNamespaces made of it. The Controller checks it again after every
// reconnect, before any command goes to the new association (Linux's
// nvme_validate_ns); err is set, once, when the namespace changed.
type nsState struct {
	id  nsIdentity
	err atomic.Pointer[error]
}

func (st *nsState) failed() error {
	if e := st.err.Load(); e != nil {
		return *e
	}
	return nil
}

func (st *nsState) fail(err error) { st.err.CompareAndSwap(nil, &err) }

// identifyNS identifies namespace nsid on admin queue q: Identify
// Namespace, and the namespace identification descriptors for a UUID
// (or the NGUID or EUI64 when the former leaves them zero); a controller
// that does not answer those (before NVMe 1.3) is identified without
// them. A namespace the host cannot address is errBadNamespace.
func identifyNS(ctx context.Context, q *hqueue, nsid uint32) (nvme.IdentifyNamespaceFields, nsIdentity, error) {
	b := make([]byte, nvme.IdentifySize)
	if err := identify(ctx, q, nvme.Identify{CNS: nvme.CNSNamespace, NSID: nsid}, b); err != nil {
		return nvme.IdentifyNamespaceFields{}, nsIdentity{}, err
	}
	f := nvme.IdentifyNamespace(b).Fields()
	shift := f.BlockShift()
	// The size in bytes must be an int64 (Size, offsets): 2^63 bytes is
	// no disk, but a broken target's NSZE.
	if f.NSZE == 0 || shift < 9 || shift > 16 || f.NSZE > math.MaxInt64>>shift {
		return f, nsIdentity{}, fmt.Errorf("%w: namespace %d: size %d, block shift %d", errBadNamespace, nsid, f.NSZE, shift)
	}
	id := nsIdentity{nguid: f.NGUID, eui64: f.EUI64, blocks: f.NSZE, shift: shift}
	clear(b)
	err := identify(ctx, q, nvme.Identify{CNS: nvme.CNSNSDescList, NSID: nsid}, b)
	if err != nil && !errors.As(err, new(nvme.Status)) {
		return f, nsIdentity{}, err
	}
	if err == nil {
		ds, _ := nvme.NSDescriptors(b)
		for _, d := range ds {
			switch {
			case d.Type == nvme.NIDTUUID && len(d.ID) == 16:
				copy(id.uuid[:], d.ID)
			case d.Type == nvme.NIDTNGUID && len(d.ID) == 16 && id.nguid == [16]byte{}:
				copy(id.nguid[:], d.ID)
			case d.Type == nvme.NIDTEUI64 && len(d.ID) == 8 && id.eui64 == [8]byte{}:
				copy(id.eui64[:], d.ID)
			}
		}
	}
	return f, id, nil
}

// Namespace identifies namespace nsid and returns it.
func (h *Controller) Namespace(ctx context.Context, nsid uint32) (*HostNamespace, error) {
	for {
		a, err := h.assoc(ctx)
		if err != nil {
			return nil, err
		}
		f, ident, err := identifyNS(ctx, a.admin, nsid)
		h.count(err)
		if err != nil {
			return nil, err
		}
		h.mu.Lock()
		if h.cur != a {
			// Lost meanwhile: the reconnect checks the namespaces it
			// knows, this one is not among them yet. Identify it on
			// the new association.
			h.mu.Unlock()
			continue
		}
		st := h.nss[nsid]
		if st == nil || st.failed() != nil || st.id != ident {
			if st != nil {
				st.fail(fmt.Errorf("%w: namespace %d: %s", ErrNamespaceChanged, nsid, st.id.diff(ident)))
			}
			st = &nsState{id: ident}
			if h.nss == nil {
				h.nss = map[uint32]*nsState{}
			}
			h.nss[nsid] = st
		}
		h.mu.Unlock()
		maxBytes := MaxTransfer
		if a.id.MDTS > 0 && a.id.MDTS < 20 {
			maxBytes = min(maxBytes, 4096<<a.id.MDTS)
		}
		shift := ident.shift
		maxBytes = min(maxBytes, 65536<<shift, nvme.MaxKeyedLength+1-(1<<shift))
		return &HostNamespace{h: h, id: nsid, shift: shift, blocks: ident.blocks, ro: f.NSATTR&1 != 0, maxBytes: maxBytes, st: st}, nil
	}
}

// revalidate identifies again, on the new association a, every namespace
// handed out (before a goes into service: no command reaches a namespace
// that changed). A namespace with other identifiers, size or block size,
// or none, fails from now on (ErrNamespaceChanged). Only a transport
// failure (the new association lost too) is an error: the reconnect
// attempt failed.
func (h *Controller) revalidate(ctx context.Context, a *association) error {
	h.mu.Lock()
	nss := make(map[uint32]*nsState, len(h.nss))
	for nsid, st := range h.nss {
		if st.failed() == nil {
			nss[nsid] = st
		}
	}
	h.mu.Unlock()
	for nsid, st := range nss {
		sctx, cancel := context.WithTimeout(ctx, h.cfg.ConnectTimeout)
		_, ident, err := identifyNS(sctx, a.admin, nsid)
		cancel()
		var why string
		switch {
		case err == nil:
			if why = st.id.diff(ident); why == "" {
				continue
			}
		case errors.As(err, new(nvme.Status)), errors.Is(err, errBadNamespace):
			why = err.Error()
		default:
			return fmt.Errorf("nvmf: Identify Namespace %d: %w", nsid, err)
		}
		err = fmt.Errorf("%w: namespace %d: %s", ErrNamespaceChanged, nsid, why)
		h.logf("nvmf: controller %v %s: %v; its I/O fails from now on", h.addr, h.subNQN, err)
		st.fail(err)
	}
	return nil
}

// queue picks the I/O queue for one of the namespace's commands, unless
// the namespace changed. (A namespace that changed is marked so before
// the association that found it goes into service, so a queue of that
// association is never returned for it.)
func (n *HostNamespace) queue(ctx context.Context) (*hqueue, error) {
	q, err := n.h.ioQueue(ctx)
	if err != nil {
		return nil, err
	}
	if err := n.st.failed(); err != nil {
		return nil, err
	}
	return q, nil
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

// ReadAt reads len(p) bytes at off (io.ReaderAt). A read that reaches
// beyond Size fails whole with ErrOutOfRange, and nothing is sent.
func (n *HostNamespace) ReadAt(p []byte, off int64) (int, error) {
	return n.ReadAtContext(context.Background(), p, off)
}

// WriteAt writes p at off (io.WriterAt). A nil error means the controller
// acknowledged every block. A write that reaches beyond Size fails whole
// with ErrOutOfRange, and nothing is sent.
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
	q, err := n.queue(ctx)
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
		return fmt.Errorf("%w: off %d, length %d, block size %d", ErrAlignment, off, length, bs)
	}
	if err := n.checkRange("off", off, "length", length); err != nil {
		return err
	}
	for length > 0 {
		k := min(length, 65536<<n.shift)
		q, err := n.queue(ctx)
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

// checkRange refuses the length bytes at off (whole blocks, neither
// negative) unless they lie within the namespace, naming the caller's
// arguments. It compares in blocks and adds nothing: off+length may
// exceed an int64 (off near 2^63), SLBA plus the block count a uint64
// (which cannot wrap from int64 arguments, but is compared as
// blocks > NSZE-SLBA all the same).
func (n *HostNamespace) checkRange(offName string, off int64, lenName string, length int64) error {
	slba, nlb := uint64(off)>>n.shift, uint64(length)>>n.shift
	if slba > n.blocks || nlb > n.blocks-slba {
		return fmt.Errorf("%w: %s %d (LBA %d) + %s %d (%d blocks): the namespace has %d blocks of %d bytes",
			ErrOutOfRange, offName, off, slba, lenName, length, nlb, n.blocks, 1<<n.shift)
	}
	return nil
}

func (n *HostNamespace) rw(ctx context.Context, op nvme.Opcode, p []byte, off int64) (int, error) {
	bs := int64(1) << n.shift
	if off < 0 || off%bs != 0 || int64(len(p))%bs != 0 {
		return 0, fmt.Errorf("%w: off %d, len(p) %d, block size %d", ErrAlignment, off, len(p), bs)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := n.checkRange("off", off, "len(p)", int64(len(p))); err != nil {
		return 0, err
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

// maxTimeoutRetries bounds how often a read or write that timed out
// (HostConfig.IOTimeout) is sent again, as Linux's nvme_max_retries (5)
// does: a command the target never answers must not reset the
// association forever.
const maxTimeoutRetries = 5

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
	timeouts := 0
	for {
		q, err := n.queue(ctx)
		if err != nil {
			if failed != nil || errors.Is(err, ErrNamespaceChanged) {
				n.h.count(err) // the command was lost, and is not sent again
			}
			return err
		}
		if failed != nil && q != failed {
			n.h.requeued.Add(1) // sent again, on the controller that is back
		}
		_, err = q.do(ctx, r)
		if errors.Is(err, ErrIOTimeout) {
			timeouts++
		}
		if err == nil || !errors.Is(err, ErrDisconnected) || n.h.cfg.CtrlLossTimeout < 0 || ctx.Err() != nil ||
			timeouts > maxTimeoutRetries {
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
