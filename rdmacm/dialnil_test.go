package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestDialFailsWithNilConn: every way a Dial fails returns a nil *Conn
// with the error (Go's convention); it used to return the dead
// connection too when the peer refused, rejected or never answered, or
// ctx ended.
func TestDialFailsWithNilConn(t *testing.T) {
	silent := func(l udp.Link) udp.Link {
		return &filterLink{Wrap: udp.Wrap{Link: l}, drop: func(*packet.Packet) bool { return true }}
	}
	for _, tc := range []struct {
		name   string
		wrapB  func(udp.Link) udp.Link
		listen func(t *testing.T, m *Manager) // on B's manager, port 7320
		ctx    time.Duration
		want   error
	}{
		{name: "refused (no listener)", listen: func(*testing.T, *Manager) {}, ctx: 5 * time.Second, want: ErrRefused},
		{name: "rejected", listen: func(t *testing.T, m *Manager) {
			l, err := m.Listen(7320, &ListenOptions{Options: fast})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				if r, err := l.Next(ctxT(t, 5*time.Second)); err == nil {
					r.Reject([]byte("no"))
				}
			}()
		}, ctx: 5 * time.Second, want: ErrRejected},
		{name: "no answer", wrapB: silent, ctx: 5 * time.Second, want: ErrTimeout},
		{name: "ctx ends", listen: func(t *testing.T, m *Manager) {
			l, err := m.Listen(7320, &ListenOptions{Options: fast}) // nobody answers its requests
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, ctx: 100 * time.Millisecond, want: context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, tc.wrapB)
			if tc.listen != nil {
				mb, err := NewManager(db)
				if err != nil {
					t.Fatal(err)
				}
				tc.listen(t, mb)
			}
			c, err := Dial(ctxT(t, tc.ctx), da, netip.AddrPortFrom(addrB, 7320), &fast)
			if !errors.Is(err, tc.want) {
				t.Errorf("Dial: %v, want %v", err, tc.want)
			}
			if c != nil {
				t.Errorf("Dial failed (%v) and returned a non-nil *Conn", err)
			}
		})
	}
}
