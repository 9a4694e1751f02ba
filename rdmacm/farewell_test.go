package rdmacm

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// toldWithin is how long a peer may take to see a farewell: far below
// the keep-alive's 15 s idle time, which would also end the connection.
const toldWithin = 3 * time.Second

// TestCloseTellsPeers: an application that closes its device (or its
// connection manager) with connections still established tells each
// peer with a DREQ, as Linux's rdma_destroy_id does, instead of leaving it
// to find out by keep-alive; connections closed first get no second DREQ.
func TestCloseTellsPeers(t *testing.T) {
	for _, how := range []string{"Device.Close", "Manager.Close"} {
		t.Run(how, func(t *testing.T) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, nil)
			acc := serve(t, db)
			var client, server []*Conn
			for range 3 {
				c, err := Dial(ctxT(t, 5*time.Second), da, netip.AddrPortFrom(addrB, 4420), &fast)
				if err != nil {
					t.Fatal(err)
				}
				client = append(client, c)
				server = append(server, <-acc)
			}
			// One connection the application closes itself: it was
			// told already and gets no farewell.
			if err := client[2].Close(); err != nil {
				t.Fatal(err)
			}
			<-server[2].Done()
			m := managerOf(t, da)
			start := time.Now()
			switch how {
			case "Device.Close":
				da.Close()
			case "Manager.Close":
				m.Close()
			}
			for i, c := range server[:2] {
				select {
				case <-c.Done():
				case <-time.After(toldWithin):
					t.Fatalf("server connection %d not told within %v of the client's %s", i, toldWithin, how)
				}
				if !errors.Is(c.Err(), ErrDisconnected) {
					t.Errorf("server connection %d ended with %v, want ErrDisconnected", i, c.Err())
				}
			}
			t.Logf("peers told in %v", time.Since(start))
			if got := m.Stats().FarewellDREQs; got != 2 {
				t.Errorf("FarewellDREQs = %d, want 2 (the connection closed first is not told twice)", got)
			}
			for i, c := range client {
				// Device.Close returns once the peers are told; the
				// manager then fails its connections as it sees the
				// device closed (asynchronously): wait for that.
				select {
				case <-c.Done():
				case <-time.After(toldWithin):
					t.Fatalf("client connection %d not ended within %v of %s", i, toldWithin, how)
				}
				if !errors.Is(c.Err(), ErrClosed) {
					t.Errorf("client connection ended with %v, want ErrClosed", c.Err())
				}
			}
		})
	}
}

// TestCloseRejectsHandshakes: closing the device while a Dial waits for
// its REP sends the REJ (timeout) Linux sends when an active side gives
// up, so the listener's half-open connection ends at once.
func TestCloseRejectsHandshakes(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	// The server's REPs are lost: the client waits in REQ sent, the
	// server in REP sent.
	dropREP := func(l udp.Link) udp.Link {
		return &filterLink{Wrap: udp.Wrap{Link: l}, drop: func(p *packet.Packet) bool {
			return p.BTH.DestQP() == 1 && len(p.Payload) == 256 && cm.MAD(p.Payload).AttributeID() == cm.AttrREP
		}}
	}
	da, db := newDev(t, n, addrA, nil), newDev(t, n, addrB, dropREP)
	slow := Options{ResponseTimeout: time.Second, MaxRetries: 15}
	l, err := Listen(db, 4420, &ListenOptions{Options: slow})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acceptAll(t, l)
	dialed := make(chan error, 1)
	go func() {
		_, err := Dial(ctxT(t, 30*time.Second), da, netip.AddrPortFrom(addrB, 4420), &slow)
		dialed <- err
	}()
	mb := managerOf(t, db)
	waitFor(t, 5*time.Second, func() bool { return mb.Stats().Conns == 1 }, "the server to hold the half-open connection")
	da.Close()
	if err := <-dialed; !errors.Is(err, ErrClosed) {
		t.Errorf("Dial ended with %v, want ErrClosed", err)
	}
	waitFor(t, toldWithin, func() bool { return mb.Stats().Conns == 0 }, "the server's half-open connection to end on the client's REJ")
	if got := mb.Stats().RejRecv[cm.RejTimeout]; got != 1 {
		t.Errorf("server received %d REJ(timeout), want 1", got)
	}
}

func waitFor(t *testing.T, d time.Duration, ok func() bool, what string) {
	t.Helper()
	end := time.Now().Add(d)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// managerOf returns the manager the package-level functions started on
// dev.
func managerOf(t *testing.T, dev *transport.Device) *Manager {
	t.Helper()
	m := ManagerOf(dev)
	if m == nil {
		t.Fatal("no manager runs on the device")
	}
	return m
}

// killDev closes dev as a killed process's device goes: without the
// farewell of its manager (if one runs), so its peers are told nothing.
func killDev(dev *transport.Device) {
	byDeviceMu.Lock()
	m := byDevice[dev]
	byDeviceMu.Unlock()
	if m != nil {
		m.stopFarewell()
	}
	dev.Close()
}

// serve listens on db's port 4420 (fast options) and accepts every
// connection into the returned channel until the test ends.
func serve(t *testing.T, db *transport.Device) <-chan *Conn {
	t.Helper()
	l, err := Listen(db, 4420, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return acceptAll(t, l)
}
