package nvmf

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

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
