package rdmacm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestConnCloseAfterDeviceClose: Conn.Close on a connection whose device
// was closed first (another goroutine's Close, or defers in that order)
// releases what is left and returns nil, as for any ended connection. It
// returned the joined ErrClosed of the QP's and CQs' Destroy — which the
// device's Close had released already — and the same again on every
// later Close (probe lib26/fragile).
func TestConnCloseAfterDeviceClose(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
	l, err := Listen(db, 7174, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := ctxT(t, 10*time.Second)
	go func() {
		if c, err := l.Accept(ctx); err == nil {
			<-c.Done()
			c.Close()
		}
	}()
	c, err := Dial(ctx, da, netip.AddrPortFrom(addrB, 7174), &fast)
	if err != nil {
		t.Fatal(err)
	}
	pd := c.PD()
	if err := da.Close(); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	for i := 0; i < 2; i++ {
		if err := c.Close(); err != nil {
			t.Errorf("Close %d after the device closed: %v", i+1, err)
		}
	}
	if err := pd.Dealloc(); err == nil {
		t.Error("the connection's PD was still allocated after Close")
	}
}
