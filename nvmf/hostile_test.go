package nvmf

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// setHooks installs host test hooks until the test ends.
func setHooks(t *testing.T, hk *hostHooks) {
	t.Helper()
	testHooks.Store(hk)
	t.Cleanup(func() { testHooks.Store(nil) })
}

// TestHostileIdentify: Identify data no sane controller sends. The host
// must neither size its memory from it (IOCCSZ 0xFFFFFFFF made dialQueue
// allocate 64 GiB per slot: a fatal out-of-memory that kills the
// process; 2^20 made it 480 MiB for two queues of 16) nor build queues
// without slots (MAXCMD 1, MQES 0) nor overflow the namespace's size
// (NSZE 2^62 blocks gave Size 0).
func TestHostileIdentify(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mod    func(cns uint8, b []byte)
		nsFail bool // Namespace must refuse the namespace
	}{
		{"ioccsz all ones", func(cns uint8, b []byte) {
			if cns == nvme.CNSController {
				binary.LittleEndian.PutUint32(b[1792:], 0xffffffff)
			}
		}, false},
		{"ioccsz 16 MiB", func(cns uint8, b []byte) {
			if cns == nvme.CNSController {
				binary.LittleEndian.PutUint32(b[1792:], 1<<20)
			}
		}, false},
		{"maxcmd 1", func(cns uint8, b []byte) {
			if cns == nvme.CNSController {
				binary.LittleEndian.PutUint16(b[514:], 1)
			}
		}, false},
		{"mdts 0", func(cns uint8, b []byte) {
			if cns == nvme.CNSController {
				b[77] = 0
			}
		}, false},
		{"nsze 2^62", func(cns uint8, b []byte) {
			if cns == nvme.CNSNamespace {
				binary.LittleEndian.PutUint64(b[0:], 1<<62)
			}
		}, true},
		{"nsze all ones", func(cns uint8, b []byte) {
			if cns == nvme.CNSNamespace {
				binary.LittleEndian.PutUint64(b[0:], ^uint64(0))
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setHooks(t, &hostHooks{identify: tc.mod})
			p := newPair(t, memnet.Faults{}, TargetConfig{})
			ctx := ctxT(t, 20*time.Second)
			h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 16, Log: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			h.mu.Lock()
			for _, q := range h.cur.io {
				if q.inline > maxInline || len(q.cmdBuf) > q.depth*(nvme.SQESize+maxInline) || q.depth < 1 {
					t.Errorf("queue %d: inline %d, command buffer %d bytes, depth %d", q.qid, q.inline, len(q.cmdBuf), q.depth)
				}
			}
			h.mu.Unlock()
			ns, err := h.Namespace(ctx, 1)
			if tc.nsFail {
				if err == nil {
					t.Fatalf("namespace accepted: size %d", ns.Size())
				}
				t.Logf("namespace refused: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ns.Size() != 8<<20 || ns.MaxTransfer() > MaxTransfer {
				t.Errorf("size %d, max transfer %d", ns.Size(), ns.MaxTransfer())
			}
			// Writes in the capsule and by keyed SGL. (Not beyond the
			// 4 KiB of in-capsule data this target really takes: the
			// hook lies to the host, and a target that offers more
			// than it takes loses the queue on such a write.)
			for _, n := range []int{512, 4096, 2 << 20} {
				w := bytes.Repeat([]byte{byte(n >> 9)}, n)
				if _, err := ns.WriteAtContext(ctx, w, 0); err != nil {
					t.Fatalf("write %d: %v", n, err)
				}
				r := make([]byte, n)
				if _, err := ns.ReadAtContext(ctx, r, 0); err != nil || !bytes.Equal(r, w) {
					t.Fatalf("read %d: %v", n, err)
				}
			}
			if st := h.Stats(); st.Reconnects != 0 || st.Errors != 0 {
				t.Errorf("host %+v", st)
			}
		})
	}
}

// TestNamespaceReplaced: the target dies and another starts on its
// address. The host reconnects by itself; whether the namespace behind
// NSID 1 is still the disk it wrote decides what its I/O may do: the same
// identity (NGUID, size, block size) goes on, anything else fails with
// ErrNamespaceChanged — the reads and writes waiting for the reconnect
// too, so no write lands on the other disk and no read returns its data
// (Linux: nvme_validate_ns, "identifiers changed"). Without the check
// the host read the new disk's zeros as its data and wrote onto it.
func TestNamespaceReplaced(t *testing.T) {
	defNGUID := func() [16]byte { // what the first target derived
		h := sha256.Sum256([]byte(testNQN + "/1"))
		return [16]byte(h[:16])
	}()
	for _, tc := range []struct {
		name    string
		ns      func(old *MemBackend) (*Namespace, *MemBackend)
		changed bool
	}{
		{"same disk", func(old *MemBackend) (*Namespace, *MemBackend) {
			return &Namespace{Backend: old}, old
		}, false},
		{"restarted with the same NGUID", func(old *MemBackend) (*Namespace, *MemBackend) {
			b := bytes.Clone(old.buf)
			be, _ := NewMemBackend(int64(len(b)))
			copy(be.buf, b)
			return &Namespace{Backend: be, NGUID: defNGUID}, be
		}, false},
		{"other NGUID", func(old *MemBackend) (*Namespace, *MemBackend) {
			be, _ := NewMemBackend(8 << 20)
			return &Namespace{Backend: be, NGUID: [16]byte{0xde, 0xad}}, be
		}, true},
		{"other size", func(old *MemBackend) (*Namespace, *MemBackend) {
			be, _ := NewMemBackend(4 << 20)
			return &Namespace{Backend: be}, be
		}, true},
		{"other block size", func(old *MemBackend) (*Namespace, *MemBackend) {
			be, _ := NewMemBackend(8 << 20)
			return &Namespace{Backend: be, BlockSize: 4096}, be
		}, true},
		{"namespace gone", func(old *MemBackend) (*Namespace, *MemBackend) {
			be, _ := NewMemBackend(8 << 20)
			return &Namespace{ID: 2, Backend: be}, be
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, memnet.Faults{}, TargetConfig{})
			ctx := ctxT(t, 30*time.Second)
			h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 2, QueueSize: 8, KATO: 500 * time.Millisecond,
				ReconnectDelay: 100 * time.Millisecond, CtrlLossTimeout: 20 * time.Second, ConnectTimeout: time.Second, Log: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			ns, err := h.Namespace(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			data := bytes.Repeat([]byte("precious"), 512)
			if _, err := ns.WriteAtContext(ctx, data, 0); err != nil {
				t.Fatal(err)
			}
			// The target dies; a write is started while it is gone
			// (it waits for the reconnect); another target starts on
			// the address.
			p.tdev.Close()
			p.t.Close()
			time.Sleep(50 * time.Millisecond)
			intruder := bytes.Repeat([]byte("intruder"), 512)
			werr := make(chan error, 1)
			go func() {
				_, err := ns.WriteAtContext(ctx, intruder, 8192)
				werr <- err
			}()
			time.Sleep(200 * time.Millisecond)
			nns, be := tc.ns(p.backend)
			tdev2 := newDevice(t, p.net, targetIP)
			t2, err := Listen(tdev2, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{nns}}}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { h.Close(); t2.Close(); tdev2.Close() }()
			err = <-werr
			got := make([]byte, len(data))
			_, rerr := ns.ReadAtContext(ctx, got, 0)
			t.Logf("write while replaced: %v; read after: %v; host %+v", err, rerr, h.Stats())
			if h.Stats().Reconnects == 0 {
				t.Fatal("no reconnect")
			}
			if !tc.changed {
				if err != nil || rerr != nil || !bytes.Equal(got, data) {
					t.Fatalf("same namespace: write %v, read %v (data equal %v)", err, rerr, bytes.Equal(got, data))
				}
				return
			}
			if !errors.Is(err, ErrNamespaceChanged) || !errors.Is(rerr, ErrNamespaceChanged) {
				t.Errorf("replaced namespace: write %v, read %v; want ErrNamespaceChanged", err, rerr)
			}
			if bytes.Contains(be.buf, []byte("intruder")) {
				t.Error("the write waiting for the reconnect landed on the other disk")
			}
			if err := ns.Flush(ctx); !errors.Is(err, ErrNamespaceChanged) {
				t.Errorf("flush: %v", err)
			}
			// The namespace there now is there to be had, on purpose.
			if nns.ID == 1 {
				ns2, err := h.Namespace(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ns2.WriteAtContext(ctx, intruder, 8192); err != nil {
					t.Fatalf("write to the new namespace: %v", err)
				}
				if _, err := ns.ReadAtContext(ctx, got, 0); !errors.Is(err, ErrNamespaceChanged) {
					t.Errorf("old namespace after Namespace again: %v", err)
				}
			}
		})
	}
}

// loseAnswers installs a hook that loses the completions of I/O commands
// for which lose(opcode, SLBA) says so.
func loseAnswers(t *testing.T, lose func(op nvme.Opcode, slba uint64) bool) {
	setHooks(t, &hostHooks{response: func(q *hqueue, c *nvme.CQEFields) bool {
		idx := int(c.CID & (1<<cidIdxBits - 1))
		if q.qid == 0 || idx >= len(q.slots) {
			return false
		}
		q.mu.Lock()
		sqe := nvme.SQE(q.slots[idx].cmd[:nvme.SQESize])
		op, slba := sqe.Opcode(), uint64(sqe.CDW(10))|uint64(sqe.CDW(11))<<32
		q.mu.Unlock()
		return lose(op, slba)
	}})
}

// TestIOTimeout: a target that loses the answer to a command but answers
// keep-alives. Without an I/O timeout ReadAt/WriteAt (no context) waited
// forever, and commands whose callers gave up kept their slots until
// QueueSize-1 of them wedged the queue for good. With it the host ends
// the association after IOTimeout (Linux: nvme_rdma_timeout, error
// recovery), reconnects, and sends the read or write again: a write is
// reported done only when the new association acknowledged it. A command
// that is never answered fails after maxTimeoutRetries resends.
func TestIOTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	connect := func(t *testing.T) (*pair, *Controller, *HostNamespace, context.Context) {
		p := newPair(t, memnet.Faults{}, TargetConfig{})
		ctx := ctxT(t, 60*time.Second)
		h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8, KATO: 200 * time.Millisecond,
			ReconnectDelay: 50 * time.Millisecond, IOTimeout: timeout, Log: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		ns, err := h.Namespace(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return p, h, ns, ctx
	}
	// within runs f, which must end within d.
	within := func(t *testing.T, d time.Duration, what string, f func() error) error {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- f() }()
		select {
		case err := <-errc:
			return err
		case <-time.After(d):
			t.Fatalf("%s hangs", what)
			return nil
		}
	}
	for _, op := range []nvme.Opcode{nvme.IORead, nvme.IOWrite} {
		t.Run(fmt.Sprintf("one answer lost, opcode %#x", op), func(t *testing.T) {
			p, h, ns, _ := connect(t)
			w := bytes.Repeat([]byte("answered"), 512)
			copy(p.backend.buf[4096:], w)
			var lost atomic.Int32
			loseAnswers(t, func(o nvme.Opcode, slba uint64) bool { return o == op && lost.Add(1) == 1 })
			start := time.Now()
			r := make([]byte, len(w))
			err := within(t, 20*time.Second, "the command", func() error {
				if op == nvme.IOWrite {
					_, err := ns.WriteAt(w, 8192)
					return err
				}
				_, err := ns.ReadAt(r, 4096)
				return err
			})
			st := h.Stats()
			t.Logf("%v after %v; host %+v", err, time.Since(start).Round(time.Millisecond), st)
			if err != nil || st.Reconnects != 1 || st.Requeued != 1 || time.Since(start) < timeout {
				t.Fatalf("err %v, %d reconnects, %d requeued", err, st.Reconnects, st.Requeued)
			}
			if op == nvme.IORead && !bytes.Equal(r, w) || op == nvme.IOWrite && !bytes.Equal(p.backend.buf[8192:8192+len(w)], w) {
				t.Error("data differs")
			}
		})
	}
	t.Run("never answered", func(t *testing.T) {
		_, h, ns, _ := connect(t)
		loseAnswers(t, func(o nvme.Opcode, slba uint64) bool { return o == nvme.IORead && slba == 64 })
		err := within(t, 30*time.Second, "the read", func() error {
			_, err := ns.ReadAt(make([]byte, 512), 64*512)
			return err
		})
		st := h.Stats()
		t.Logf("%v; host %+v", err, st)
		if !errors.Is(err, ErrIOTimeout) || !errors.Is(err, ErrDisconnected) || st.Requeued != maxTimeoutRetries {
			t.Errorf("err %v, sent again %d times; want ErrIOTimeout after %d", err, st.Requeued, maxTimeoutRetries)
		}
		if _, err := ns.ReadAt(make([]byte, 512), 0); err != nil {
			t.Errorf("read after: %v", err)
		}
	})
	t.Run("abandoned commands", func(t *testing.T) {
		_, h, ns, ctx := connect(t)
		var armed atomic.Bool
		armed.Store(true)
		loseAnswers(t, func(o nvme.Opcode, slba uint64) bool { return o == nvme.IORead && armed.Load() })
		// QueueSize-1 reads whose callers give up: every slot of the
		// queue waits for an answer that never comes.
		for i := 0; i < 7; i++ {
			c, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			_, err := ns.ReadAtContext(c, make([]byte, 512), 0)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("abandoned read %d: %v", i, err)
			}
		}
		armed.Store(false)
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := ns.ReadAtContext(c, make([]byte, 512), 0)
		st := h.Stats()
		t.Logf("read after 7 abandoned: %v; host %+v", err, st)
		if err != nil || st.Reconnects == 0 {
			t.Errorf("queue wedged by abandoned commands: %v, %d reconnects", err, st.Reconnects)
		}
	})
}

// TestReadWithoutData: the target answers a read with success but its
// data never reaches the host's buffer (here: the read's SGL names a
// scratch region, as a target that skips the RDMA WRITE would leave the
// slot's buffer untouched). The host read into its slot's buffer and
// returned what the slot's previous read had left there — another
// block's data — as success; now it returns ErrNoData, and the caller's
// buffer holds nothing of that block.
func TestReadWithoutData(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 2}) // one slot
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte("SECRET-LBA-100! "), 256)
	copy(p.backend.buf[100*512:], secret)
	var armed atomic.Bool
	var scratch *memreg.MR
	setHooks(t, &hostHooks{readSGL: func(q *hqueue, g *nvme.SGLFields) {
		if !armed.Load() {
			return
		}
		if scratch == nil {
			var err error
			if scratch, err = q.pd.RegisterMR(make([]byte, 1<<20), memreg.AccessLocalWrite|memreg.AccessRemoteWrite); err != nil {
				panic(err)
			}
		}
		g.Addr, g.Key = scratch.IOVA(), scratch.RKey()
	}})
	for _, n := range []int{4096, 512} {
		a := make([]byte, n)
		if _, err := ns.ReadAtContext(ctx, a, 100*512); err != nil || !bytes.Equal(a, secret[:n]) {
			t.Fatalf("read %d: %v", n, err)
		}
		armed.Store(true)
		b := make([]byte, n)
		_, err = ns.ReadAtContext(ctx, b, 0) // LBA 0 holds zeros
		armed.Store(false)
		t.Logf("read of %d bytes at LBA 0 without its data: %v", n, err)
		if !errors.Is(err, ErrNoData) || bytes.Contains(b, []byte("SECRET")) {
			t.Errorf("read of %d bytes without its data: %v, got %q...", n, err, b[:16])
		}
		if _, err := ns.ReadAtContext(ctx, b, 0); err != nil || !bytes.Equal(b, make([]byte, n)) {
			t.Fatalf("read after: %v", err)
		}
	}
}

// TestReadPartlyWithoutData: the target answers a read with success but
// wrote only part of its data (here: it writes all of it elsewhere, and
// the parts it "wrote" are copied into the slot's buffer as the response
// arrives). The host checked only the last 8 bytes of the region: a read
// whose first half, or whose one block in the middle, never came
// returned the slot's previous data there — another block's — as
// success. Now a canary ends every 512 bytes: any block left unwritten
// is ErrNoData, wherever it is, and the caller's buffer gets nothing.
// A gap inside a block that leaves the block's last 8 bytes written is
// what the canaries cannot see (ErrNoData's documented limit).
func TestReadPartlyWithoutData(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 2}) // one slot
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64 << 10
	secret := bytes.Repeat([]byte("SECRET-LBA-500! "), n/16)
	copy(p.backend.buf[500*512:], secret)
	for i := 0; i < n; i += 512 {
		copy(p.backend.buf[i:], fmt.Sprintf("block %d of LBA 0..", i/512))
	}
	var scratch *memreg.MR
	scratchBuf := make([]byte, 1<<20)
	var written atomic.Pointer[[][2]int] // the ranges of the region the target "wrote"; nil: all (no hook)
	setHooks(t, &hostHooks{
		readSGL: func(q *hqueue, g *nvme.SGLFields) {
			if written.Load() == nil {
				return
			}
			if scratch == nil {
				var err error
				if scratch, err = q.pd.RegisterMR(scratchBuf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite); err != nil {
					panic(err)
				}
			}
			g.Addr, g.Key = scratch.IOVA(), scratch.RKey()
		},
		response: func(q *hqueue, c *nvme.CQEFields) bool {
			rs := written.Load()
			if q.qid == 0 || rs == nil {
				return false
			}
			s := &q.slots[int(c.CID&(1<<cidIdxBits-1))]
			for _, r := range *rs {
				copy(s.data[r[0]:r[1]], scratchBuf[r[0]:r[1]])
			}
			return false
		},
	})
	for _, tc := range []struct {
		name    string
		written [][2]int
		detect  bool
	}{
		{"nothing", nil, true},
		{"the first half missing", [][2]int{{n / 2, n}}, true},
		{"the second half missing", [][2]int{{0, n / 2}}, true},
		{"block 0 missing", [][2]int{{512, n}}, true},
		{"block 37 missing", [][2]int{{0, 37 * 512}, {38 * 512, n}}, true},
		{"the last 8 bytes missing", [][2]int{{0, n - 8}}, true},
		{"4 KiB in the middle missing", [][2]int{{0, 20 << 10}, {24 << 10, n}}, true},
		{"all but the last 8 bytes of block 3 missing", [][2]int{{0, 3 * 512}, {4*512 - 8, n}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := make([]byte, n)
			if _, err := ns.ReadAtContext(ctx, a, 500*512); err != nil || !bytes.Equal(a, secret) {
				t.Fatalf("read at LBA 500: %v", err)
			}
			rs := append([][2]int{}, tc.written...)
			written.Store(&rs)
			b := make([]byte, n)
			_, err = ns.ReadAtContext(ctx, b, 0)
			written.Store(nil)
			t.Logf("read of LBA 0.. with %v written: %v", tc.written, err)
			if !tc.detect {
				// The limit: the stale bytes pass (the slot's previous data).
				if err != nil || !bytes.Contains(b, []byte("SECRET")) {
					t.Errorf("a gap inside block 3: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNoData) || bytes.Contains(b, []byte("SECRET")) {
				t.Errorf("%v, got %q... (the caller's buffer holds the previous read's data: %v)", err, b[:24],
					bytes.Contains(b, []byte("SECRET")))
			}
		})
	}
	b := make([]byte, n)
	if _, err := ns.ReadAtContext(ctx, b, 0); err != nil || !bytes.Equal(b, p.backend.buf[:n]) {
		t.Fatalf("read after: %v", err)
	}
}

// TestCanaryLayout: the canaries of a region of any length from 8 bytes
// on lie inside it, do not overlap, end every 512 bytes and the region
// itself, and each one left in place is found.
func TestCanaryLayout(t *testing.T) {
	const v = 0x0123456789abcdef
	for _, n := range []int{8, 9, 15, 511, 512, 513, 515, 519, 520, 1024, 1030, 4096, 4100} {
		b := make([]byte, n)
		putCanaries(b, v)
		var at []int
		for off := 0; off+canarySize <= n; off++ {
			if binary.LittleEndian.Uint64(b[off:]) == v {
				at = append(at, off)
			}
		}
		want := []int{}
		for end := canaryStride; end+canarySize <= n; end += canaryStride {
			want = append(want, end-canarySize)
		}
		want = append(want, n-canarySize)
		if fmt.Sprint(at) != fmt.Sprint(want) {
			t.Errorf("%d bytes: canaries at %v, want %v", n, at, want)
		}
		for _, off := range want {
			c := bytes.Clone(b)
			for _, o := range want {
				if o != off {
					c[o] ^= 0xff // written by the target
				}
			}
			if got := findCanary(c, v); got != off {
				t.Errorf("%d bytes, only the canary at %d left: found %d", n, off, got)
			}
			c[off] ^= 0xff
			if got := findCanary(c, v); got != -1 {
				t.Errorf("%d bytes, every canary written: found %d", n, got)
			}
		}
	}
}
