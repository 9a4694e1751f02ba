package rdmacm

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestDialOptionsCheckedFirst: options the REQ or the QP cannot carry —
// a path MTU code outside MTU256..MTU4096, retry values beyond their bits
// — fail Dial and Listen at once, naming the field, before any MAD is
// sent. A Dial with PathMTU 9 used to send its REQ, which the peer never
// answered, and failed at its deadline ("context deadline exceeded",
// probe lib26/fragile); one with Retry.Timeout 40 was only refused after
// the handshake, by the QP.
func TestDialOptionsCheckedFirst(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, err := Listen(db, 7174, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m, err := NewManager(da)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		o     Options
	}{
		{"Options.PathMTU", Options{PathMTU: 9}},
		{"Options.Retry.Timeout", Options{Retry: &transport.Retry{Timeout: 40}}},
		{"Options.Retry.RetryCnt", Options{Retry: &transport.Retry{Timeout: 14, RetryCnt: 8}}},
		{"Options.Retry.RNRRetry", Options{Retry: &transport.Retry{Timeout: 14, RNRRetry: 9}}},
		{"Options.Retry.MinRNRTimer", Options{Retry: &transport.Retry{Timeout: 14, MinRNRTimer: 32}}},
	} {
		o := tc.o
		o.ResponseTimeout, o.MaxRetries = fast.ResponseTimeout, fast.MaxRetries
		before := m.Stats().MADsOut
		_, err := m.Dial(ctxT(t, 2*time.Second), netip.AddrPortFrom(addrB, 7174), &o)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Dial with a bad %s: %v, want an error naming it", tc.field, err)
		}
		if d := m.Stats().MADsOut - before; d != 0 {
			t.Errorf("Dial with a bad %s sent %d MADs", tc.field, d)
		}
		if _, err := Listen(db, 7175, &ListenOptions{Options: tc.o}); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Listen with a bad %s: %v", tc.field, err)
		}
	}
	if da.Resources().QPs != 0 {
		t.Errorf("refused Dials left %d QPs", da.Resources().QPs)
	}
}

// TestNilDevice: the package-level calls and NewManager given a nil
// device return an error naming the call and matching
// transport.ErrInvalidArgument. They dereferenced it and panicked (probe
// user31/misuse: rdmacm.Dial(ctx, nil, addr, nil)).
func TestNilDevice(t *testing.T) {
	addr := netip.AddrPortFrom(addrB, 7174)
	for _, tc := range []struct {
		op string
		f  func() error
	}{
		{"Dial", func() error { _, err := Dial(ctxT(t, time.Second), nil, addr, nil); return err }},
		{"Listen", func() error { _, err := Listen(nil, 7174, nil); return err }},
		{"ResolveUD", func() error { _, err := ResolveUD(ctxT(t, time.Second), nil, addr, nil); return err }},
		{"ListenUD", func() error { _, err := ListenUD(nil, 7174, nil, UDPQKey, nil); return err }},
		{"NewManager", func() error { _, err := NewManager(nil); return err }},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s with a nil device panicked: %v", tc.op, r)
				}
			}()
			err := tc.f()
			if !errors.Is(err, transport.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.op) || !strings.Contains(err.Error(), "dev is nil") {
				t.Errorf("%s with a nil device: %v, want an ErrInvalidArgument naming the call and dev", tc.op, err)
			}
		}()
	}
	if ManagerOf(nil) != nil || StatsOf(nil).Established != 0 {
		t.Error("ManagerOf/StatsOf(nil) found a manager")
	}
}
