package transport

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// slotLink is a polled link that returns the packet counts of plan, one
// per TryRecv, and checks that every slot it is given holds a buffer of
// the caller's own: at least MaxPacketSize, none of its memory, no two
// slots sharing one. Asked to receive in place (with canInPlace), it
// hands the packets out as slices of its own memory; else it reslices
// the buffers given. Without prefix it also does what a link may do to
// the slots past the packets it returns (udp.CapRecvPrefix not claimed):
// it leaves a small buffer of its own in each.
type slotLink struct {
	*memnet.MemLink
	prefix     bool
	canInPlace bool
	mem        [64][8]byte // handed out in place (shorter than a BTH)
	junk       [16]byte    // left in the slots past n (without prefix)
	wake       chan struct{}
	closed     atomic.Bool

	mu      sync.Mutex
	plan    []int
	calls   int
	handed  uint64 // packets returned
	bad     []string
	inPlace bool
}

func (l *slotLink) RecvPrefix() bool { return l.prefix }
func (l *slotLink) Capabilities() udp.Capabilities {
	c := udp.CapPoll
	if l.prefix {
		c |= udp.CapRecvPrefix
	}
	if l.canInPlace {
		c |= udp.CapRecvInPlace
	}
	return c
}
func (l *slotLink) SetRecvInPlace(on bool) { l.inPlace = on }
func (l *slotLink) WakeRecv() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}
func (l *slotLink) BusyPoll() time.Duration { return time.Second }
func (l *slotLink) Close() error            { l.closed.Store(true); l.WakeRecv(); return l.MemLink.Close() }

// Recv (the device's receive goroutine) returns nothing, until woken.
func (l *slotLink) Recv(pkts []udp.Packet) (int, error) {
	l.check(pkts)
	<-l.wake
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	return 0, nil
}

func (l *slotLink) TryRecv(pkts []udp.Packet) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	l.check(pkts)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if len(l.plan) == 0 {
		return 0, nil
	}
	n := min(l.plan[0], len(pkts))
	l.plan = l.plan[1:]
	l.handed += uint64(n)
	for i := range n {
		if l.inPlace {
			pkts[i].Buf = l.mem[i][:] // all zero: malformed, dropped
		} else {
			pkts[i].Buf = pkts[i].Buf[:len(l.mem[i])]
			clear(pkts[i].Buf)
		}
		pkts[i].Addr = netip.AddrFrom4([4]byte{192, 0, 2, 99})
	}
	if !l.prefix {
		for i := n; i < len(pkts); i++ {
			pkts[i].Buf = l.junk[:]
		}
	}
	return n, nil
}

// check records what is wrong with the slots a receive is given.
func (l *slotLink) check(pkts []udp.Packet) {
	seen := make(map[*byte]int)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range pkts {
		b := pkts[i].Buf
		if cap(b) < udp.MaxPacketSize {
			l.bad = append(l.bad, fmt.Sprintf("call %d: slot %d of %d has cap %d", l.calls, i, len(pkts), cap(b)))
			continue
		}
		p := unsafe.SliceData(b)
		if j, ok := seen[p]; ok {
			l.bad = append(l.bad, fmt.Sprintf("call %d: slots %d and %d share a buffer", l.calls, j, i))
		}
		seen[p] = i
	}
}

// TestRecvSlotsRestored: the receive driver gives every receive slots that
// hold its own buffers. On a link that claims udp.CapRecvPrefix it
// restores only the slots the last receive returned in place, none when
// the link receives into the buffers given; on one that does not, every
// slot the last receive was given (here the link leaves a buffer of its
// own in those past n). Fails when the driver restores fewer: the link
// sees a slot of its memory or of too small a capacity.
func TestRecvSlotsRestored(t *testing.T) {
	for _, tc := range []struct{ prefix, inPlace bool }{{true, true}, {true, false}, {false, true}, {false, false}} {
		prefix := tc.prefix
		t.Run(fmt.Sprintf("prefix=%v,inPlace=%v", prefix, tc.inPlace), func(t *testing.T) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			ml, err := n.Link(netip.MustParseAddr("192.0.2.1"))
			if err != nil {
				t.Fatal(err)
			}
			plan := []int{1, 0, 3, 1, 0, 0, 8, 2, 0, 40, 1, 5, 0, 1}
			l := &slotLink{MemLink: ml, prefix: prefix, canInPlace: tc.inPlace, wake: make(chan struct{}, 1), plan: plan}
			d, err := NewDevice(l, DeviceConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.rx.prefix != prefix || d.rx.inPlace != tc.inPlace || l.inPlace != tc.inPlace || d.rx.pl == nil {
				t.Fatalf("driver: prefix %v in place %v (link %v) polled %v, want %v, %v, polled", d.rx.prefix, d.rx.inPlace, l.inPlace, d.rx.pl != nil, prefix, tc.inPlace)
			}
			for i := 0; i < 1_000_000; i++ {
				l.mu.Lock()
				left := len(l.plan)
				l.mu.Unlock()
				if left == 0 {
					break
				}
				d.Progress()
				runtime.Gosched()
			}
			d.Progress() // a receive after the plan's last batch
			d.Progress()
			d.Progress()
			l.mu.Lock()
			defer l.mu.Unlock()
			if len(l.plan) != 0 || l.calls <= len(plan) {
				t.Fatalf("%d receives, %d batches left of %v", l.calls, len(l.plan), plan)
			}
			for _, b := range l.bad {
				t.Error(b)
			}
			if got, want := d.Counters().MalformedPkts, l.handed; got != want || want < 30 {
				t.Errorf("malformed packets %d, want %d (every packet of the plan handled)", got, want)
			}
		})
	}
}
