package transport

import (
	"net/netip"
	"sync"
)

// fairQueue holds a MAD agent's requests (SeparateRequests): bounded, and
// fair to the sources. When it is full, the oldest request of the source
// address holding the most goes (the one arriving counted with its
// source); take hands out the newest request of each source in turn. So a
// flood from one address delays nobody else's requests, and under a flood
// the requests handled are fresh ones. Every drop is counted
// (MADDropQueueFull).
type fairQueue struct {
	mu     sync.Mutex
	items  []MAD // arrival order
	perSrc map[netip.Addr]int
	max    int
	ready  chan struct{} // capacity 1: something was queued
}

func newFairQueue(max int) *fairQueue {
	return &fairQueue{perSrc: map[netip.Addr]int{}, max: max, ready: make(chan struct{}, 1)}
}

// put queues m; it reports whether a request was dropped for room.
func (q *fairQueue) put(m *MAD) (dropped bool) {
	q.mu.Lock()
	if len(q.items) >= q.max {
		q.dropLocked(m.Src)
		dropped = true
	}
	q.items = append(q.items, *m)
	q.perSrc[m.Src]++
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return dropped
}

// dropLocked drops the oldest request of the source holding the most.
func (q *fairQueue) dropLocked(src netip.Addr) {
	heavy, most := src, q.perSrc[src]+1
	for a, n := range q.perSrc {
		if n > most {
			heavy, most = a, n
		}
	}
	i := 0
	for ; i < len(q.items); i++ {
		if q.items[i].Src == heavy {
			break
		}
	}
	if i == len(q.items) {
		i = 0
	}
	q.removeLocked(i)
}

func (q *fairQueue) removeLocked(i int) {
	a := q.items[i].Src
	if q.perSrc[a]--; q.perSrc[a] <= 0 {
		delete(q.perSrc, a)
	}
	copy(q.items[i:], q.items[i+1:])
	q.items = q.items[:len(q.items)-1]
}

// take appends up to max requests to dst, newest first, one per source per
// round (a round looks at up to 8 sources).
func (q *fairQueue) take(dst []MAD, max int) []MAD {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) > 0 && max > 0 {
		var seen [8]netip.Addr
		n := 0
		for i := len(q.items) - 1; i >= 0 && max > 0 && n < len(seen); i-- {
			src := q.items[i].Src
			dup := false
			for _, s := range seen[:n] {
				dup = dup || s == src
			}
			if dup {
				continue
			}
			seen[n] = src
			n++
			dst = append(dst, q.items[i])
			q.removeLocked(i)
			max--
		}
	}
	if len(q.items) > 0 {
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return dst
}
