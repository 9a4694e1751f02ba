package nvmf

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// FuzzTargetCapsule sends arbitrary command capsules on a connected I/O
// queue: the target answers each with a status (or, for an SGL whose key
// the host never registered, loses the queue, and the host reconnects);
// it never panics, and a well-formed Read works after every input.
func FuzzTargetCapsule(f *testing.F) {
	seed := func(build func(s nvme.SQE), g nvme.SGLFields, extra int) []byte {
		b := make([]byte, nvme.SQESize+extra)
		build(b)
		nvme.SQE(b).SetFlags(nvme.FlagSGLMetabuf)
		nvme.SQE(b).SGL().Encode(&g)
		return b
	}
	rw := func(op nvme.Opcode, slba uint64, nlb uint16) func(nvme.SQE) {
		return func(s nvme.SQE) { (&nvme.RW{NSID: 1, SLBA: slba, NLB: nlb}).Put(s, op) }
	}
	f.Add(seed(rw(nvme.IOWrite, 0, 7), nvme.InCapsule(0, 4096), 4096))
	f.Add(seed(rw(nvme.IOWrite, 0, 7), nvme.InCapsule(4000, 4096), 4096))
	f.Add(seed(rw(nvme.IORead, 1<<40, 0), nvme.Keyed(0, 512, 1, false), 0))
	f.Add(seed(rw(nvme.IOWriteZeroes, 10, 0xffff), nvme.Keyed(0, 0, 0, false), 0))
	f.Add(seed(func(s nvme.SQE) { (&nvme.DSM{NSID: 1, NR: 3}).Put(s) }, nvme.InCapsule(0, 16), 16))
	f.Add(seed(func(s nvme.SQE) { (&nvme.Connect{QID: 1, SQSize: 15}).Put(s) }, nvme.InCapsule(0, 1024), 1024))
	f.Add(seed(func(s nvme.SQE) { s.SetOpcode(0x7f); s.SetFCType(0x7f) }, nvme.SGLFields{Type: 3}, 0))
	f.Add([]byte{1, 2, 3, 4, 5})
	p := newPair(f, memnet.Faults{}, TargetConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 8, ReconnectDelay: 20 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	defer h.Close()
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, capsule []byte) {
		if len(capsule) == 0 {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		a, err := h.assoc(cctx)
		if err != nil {
			t.Fatal(err)
		}
		q := a.io[0]
		if len(capsule) > len(q.slots[0].cmd) {
			capsule = capsule[:len(q.slots[0].cmd)]
		}
		rctx, rcancel := context.WithTimeout(cctx, 10*time.Second)
		if _, err := q.raw(rctx, append([]byte(nil), capsule...)); errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("capsule %x: no answer and no disconnect in 10 s", capsule[:min(len(capsule), 64)])
		} // else any status, or the queue lost
		rcancel()
		buf := make([]byte, 4096)
		if _, err := ns.ReadAtContext(cctx, buf, 0); err != nil {
			t.Fatalf("a good read after capsule %x: %v (target %+v)", capsule[:min(len(capsule), 64)], err, p.t.Stats())
		}
	})
}
