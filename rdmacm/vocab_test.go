package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
)

// After Conn.Close, a goroutine waiting on the connection's CQ and every
// later call on its QP see an error matching rdmacm.ErrClosed (and
// transport.ErrDestroyed), not transport.ErrDestroyed alone.
func TestConnCloseVocabulary(t *testing.T) {
	ca, _, _, _, _ := pairWith(t, fast)
	waitErr := make(chan error, 1)
	go func() {
		var wc [4]transport.WC
		for {
			// Flushed completions come first; then the CQ's error.
			if _, err := ca.RecvCQ().Wait(context.Background(), wc[:]); err != nil {
				waitErr <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waitErr:
		if !errors.Is(err, ErrClosed) || !errors.Is(err, transport.ErrDestroyed) {
			t.Fatalf("CQ waiter after Conn.Close: %v, want rdmacm.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CQ waiter not woken by Conn.Close")
	}
	calls := map[string]error{
		"PostSend": ca.QP().PostSend(transport.SendWR{Opcode: transport.WRSend}),
		"PostRecv": ca.QP().PostRecv(transport.RecvWR{}),
		"Probe":    ca.QP().Probe(),
		"SendCQ.Wait": func() error {
			var wc [1]transport.WC
			_, err := ca.SendCQ().Wait(context.Background(), wc[:])
			return err
		}(),
		"Conn.Err": ca.Err(),
	}
	for name, err := range calls {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Conn.Close: %v, want rdmacm.ErrClosed", name, err)
		}
	}
}

// After Device.Close, every rdmacm waiter and call sees an error that
// matches both rdmacm.ErrClosed and transport.ErrClosed.
func TestDeviceCloseVocabulary(t *testing.T) {
	ca, _, _, da, db := pairWith(t, fast)
	l, err := Listen(da, 7400, nil)
	if err != nil {
		t.Fatal(err)
	}
	accErr := make(chan error, 1)
	go func() { _, err := l.Accept(context.Background()); accErr <- err }()
	cqErr := make(chan error, 1)
	go func() {
		var wc [4]transport.WC
		for {
			if _, err := ca.RecvCQ().Wait(context.Background(), wc[:]); err != nil {
				cqErr <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	da.Close()
	both := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrClosed) || !errors.Is(err, transport.ErrClosed) {
			t.Errorf("%s after Device.Close: %v, want rdmacm.ErrClosed and transport.ErrClosed", what, err)
		}
	}
	select {
	case err := <-accErr:
		both("Listener.Accept", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Accept not woken by Device.Close")
	}
	select {
	case <-ca.Done():
		both("Conn.Err", ca.Err())
	case <-time.After(5 * time.Second):
		t.Fatal("Conn.Done not closed by Device.Close")
	}
	select {
	case err := <-cqErr:
		if !errors.Is(err, transport.ErrClosed) {
			t.Errorf("CQ.Wait after Device.Close: %v, want transport.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CQ waiter not woken by Device.Close")
	}
	_, err = Dial(ctxT(t, time.Second), da, netip.AddrPortFrom(addrB, 7300), &fast)
	both("Dial", err)
	_, err = Listen(da, 7401, nil)
	both("Listen", err)
	_ = db
}

// TestCloseRaceVocabulary: a Dial or Listen right after Device.Close, before
// the connection manager has seen the device close, fails in the
// transport (a QP or a service claim on a closed device); its error still
// matches both rdmacm.ErrClosed and transport.ErrClosed. (CI's -race run
// caught Dial returning the transport's error alone.)
func TestCloseRaceVocabulary(t *testing.T) {
	for i := range 20 {
		_, _, _, da, _ := pairWith(t, fast)
		if _, err := Listen(da, 7500, nil); err != nil { // the manager exists
			t.Fatal(err)
		}
		da.Close()
		_, err := Dial(ctxT(t, time.Second), da, netip.AddrPortFrom(addrB, 7300), &fast)
		if !errors.Is(err, ErrClosed) || !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("round %d: Dial right after Device.Close: %v, want rdmacm.ErrClosed and transport.ErrClosed", i, err)
		}
		_, err = Listen(da, 7501, nil)
		if !errors.Is(err, ErrClosed) || !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("round %d: Listen right after Device.Close: %v, want rdmacm.ErrClosed and transport.ErrClosed", i, err)
		}
	}
}
