package nvmf

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"testing"
	"time"

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
