package nvmf

import (
	"bytes"
	"encoding/binary"
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
