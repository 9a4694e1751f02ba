package nvmf

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// After a loss the host reconnects without waiting for the lost
// association's teardown, whose disconnects wait for DREPs (up to three
// CM response timeouts each: 3 s before the first attempt when the peer
// had hung). Here the old queues' close is held until the new
// association is up, and I/O runs on it meanwhile; Close still waits for
// the old teardown.
func TestReconnectDoesNotWaitForTeardown(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 60*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, ReconnectDelay: 10 * time.Millisecond, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	old := h.cur
	h.mu.Unlock()
	release := make(chan struct{})
	var held sync.WaitGroup
	var once sync.Once
	setHooks(t, &hostHooks{closing: func(q *hqueue) {
		if q == old.admin || (len(old.io) > 0 && q == old.io[0]) {
			held.Add(1)
			defer held.Done()
			<-release
		}
	}})
	defer once.Do(func() { close(release) })
	old.admin.die(errors.New("test: association lost"))
	waitFor(t, func() bool { return h.Stats().Reconnects == 1 }, "reconnect while the old association's teardown is held")
	w := bytes.Repeat([]byte{0xA5}, 8192)
	if _, err := ns.WriteAtContext(ctx, w, 4096); err != nil {
		t.Fatal(err)
	}
	r := make([]byte, len(w))
	if _, err := ns.ReadAtContext(ctx, r, 4096); err != nil || !bytes.Equal(r, w) {
		t.Fatalf("I/O on the new association: %v", err)
	}
	closed := make(chan struct{})
	go func() { h.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while the old association's teardown was held")
	case <-time.After(100 * time.Millisecond):
	}
	once.Do(func() { close(release) })
	<-closed
	held.Wait()
}

// blockingBackend holds the first ReadAt at or past from until release
// closes (entered closes when it arrives).
type blockingBackend struct {
	*MemBackend
	from             int64
	once             sync.Once
	entered, release chan struct{}
}

func (b *blockingBackend) ReadAt(p []byte, off int64) (int, error) {
	if off >= b.from {
		first := false
		b.once.Do(func() { first = true })
		if first {
			close(b.entered)
			<-b.release
		}
	}
	return b.MemBackend.ReadAt(p, off)
}

// A command in flight on a queue that did not die itself (an I/O queue,
// when the admin queue was lost) fails with the association at once and
// is sent again on the next one: the lost association's background
// teardown, whose disconnects wait for DREPs, does not hold it. Here the
// target holds the read and the old queues' close is held too; the read
// must come back, with its data, from the new association meanwhile, and
// the old queues' QPs must be in the error state (as Linux drains them
// before it requeues).
func TestLostAssociationFailsAllQueuesAtOnce(t *testing.T) {
	mem := mustMem(t)
	bb := &blockingBackend{MemBackend: mem, from: 512 << 10, entered: make(chan struct{}), release: make(chan struct{})}
	p := newPair(t, memnet.Faults{}, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: bb}}}}})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(bb.release) }) }
	t.Cleanup(unblock) // before the target closes (cleanups run last first)
	ctx := ctxT(t, 60*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, ReconnectDelay: 10 * time.Millisecond, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := h.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0x5C}, 4096)
	if _, err := ns.WriteAtContext(ctx, want, 512<<10); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	old := h.cur
	h.mu.Unlock()
	release := make(chan struct{})
	var once sync.Once
	setHooks(t, &hostHooks{closing: func(q *hqueue) {
		if q == old.admin || q == old.io[0] {
			<-release
		}
	}})
	defer once.Do(func() { close(release) })
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	got := make([]byte, 4096)
	go func() {
		n, err := ns.ReadAtContext(ctx, got, 512<<10)
		done <- result{n, err}
	}()
	<-bb.entered // the read is at the target, on the old I/O queue
	old.admin.die(errors.New("test: admin queue lost"))
	select {
	case r := <-done:
		if r.err != nil || !bytes.Equal(got, want) {
			t.Errorf("read in flight at the loss: %d %v (data equal %v)", r.n, r.err, bytes.Equal(got, want))
		}
	case <-time.After(20 * time.Second):
		t.Errorf("the read in flight on the lost association's I/O queue is still pending while its teardown is held")
	}
	// The lost queues' QPs are in the error state while their disconnects
	// are held: the target can no longer touch their buffers.
	for _, q := range []*hqueue{old.admin, old.io[0]} {
		if st := q.qp.State(); st != transport.QPSErr {
			t.Errorf("queue %d of the lost association: QP %v, want the error state", q.qid, st)
		}
	}
	if h.Stats().Reconnects != 1 || h.Stats().Requeued != 1 {
		t.Errorf("stats %+v, want 1 reconnect and 1 requeued command", h.Stats())
	}
	once.Do(func() { close(release) })
	unblock()
	h.Close()
}
