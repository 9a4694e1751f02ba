package transport

import (
	"context"
	"sync"
)

// CQ is a completion queue of fixed depth. Completions of the send and
// receive queues of any number of QPs may be directed to one CQ.
//
// A CQ that would have to hold more than depth completions overflows: the
// completion is not stored, the CQ enters an error state, and Wait and Err
// report ErrCQOverflow. Completions stored before the overflow can still be
// polled.
type CQ struct {
	dev    *Device
	mu     sync.Mutex
	ring   []WC
	head   int // next to poll
	n      int // stored entries
	err    error
	notify chan struct{}

	wakeQueued bool // on dev.rxWake (dev's receive goroutine only)
}

// CreateCQ creates a completion queue that holds up to depth completions.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if depth <= 0 || depth > 1<<22 {
		return nil, errorf(ErrInvalidConfig, "CreateCQ: depth %d out of range 1..%d", depth, 1<<22)
	}
	if d.isClosed() {
		return nil, ErrClosed
	}
	return &CQ{dev: d, ring: make([]WC, depth), notify: make(chan struct{}, 1)}, nil
}

// Depth returns the capacity of the CQ.
func (cq *CQ) Depth() int { return len(cq.ring) }

// push stores one completion and wakes a waiter; it reports false on
// overflow.
func (cq *CQ) push(wc *WC) bool {
	ok, wake := cq.store(wc)
	if wake {
		cq.wake()
	}
	return ok
}

// store stores one completion without waking a waiter. ok is false on
// overflow; wake reports whether a waiter must be woken (a completion was
// stored, or the CQ just overflowed).
func (cq *CQ) store(wc *WC) (ok, wake bool) {
	cq.mu.Lock()
	if cq.err != nil {
		cq.mu.Unlock()
		return false, false
	}
	if cq.n == len(cq.ring) {
		cq.err = ErrCQOverflow
		cq.mu.Unlock()
		return false, true
	}
	i := cq.head + cq.n
	if i >= len(cq.ring) {
		i -= len(cq.ring)
	}
	cq.ring[i] = *wc
	cq.n++
	cq.mu.Unlock()
	return true, true
}

func (cq *CQ) wake() {
	select {
	case cq.notify <- struct{}{}:
	default:
	}
}

// Poll copies up to len(wc) completions into wc, oldest first, and returns
// how many it copied. It never blocks.
func (cq *CQ) Poll(wc []WC) int {
	cq.mu.Lock()
	k := 0
	for k < len(wc) && cq.n > 0 {
		wc[k] = cq.ring[cq.head]
		cq.head++
		if cq.head == len(cq.ring) {
			cq.head = 0
		}
		cq.n--
		k++
	}
	cq.mu.Unlock()
	return k
}

// Err returns ErrCQOverflow once the CQ has overflowed, else nil.
func (cq *CQ) Err() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.err
}

// Wait blocks until at least one completion is available and polls it
// like Poll. It returns ctx.Err() when ctx ends first, and ErrCQOverflow
// when the CQ has overflowed and holds no more stored completions.
func (cq *CQ) Wait(ctx context.Context, wc []WC) (int, error) {
	if len(wc) == 0 {
		return 0, nil
	}
	for {
		if n := cq.Poll(wc); n > 0 {
			return n, nil
		}
		if err := cq.Err(); err != nil {
			return 0, err
		}
		select {
		case <-cq.notify:
		case <-ctx.Done():
			if n := cq.Poll(wc); n > 0 {
				return n, nil
			}
			return 0, ctx.Err()
		}
	}
}
