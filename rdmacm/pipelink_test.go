package rdmacm

import (
	"bytes"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// pipeLink hands every packet Send gets to the peer device's
// HandlePacket, in the sending goroutine (transport's
// TestSynchronousPipeLink has the same link).
type pipeLink struct {
	addr   netip.Addr
	mu     sync.Mutex
	peer   *transport.Device
	closed chan struct{}
	once   sync.Once
}

func (l *pipeLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	peer := l.peer
	l.mu.Unlock()
	for i := range pkts {
		if peer != nil {
			peer.HandlePacket(pkts[i].AppendWire(nil), l.addr)
		}
	}
	return nil
}

func (l *pipeLink) Recv([]udp.Packet) (int, error) { <-l.closed; return 0, net.ErrClosed }
func (l *pipeLink) LocalAddr() netip.Addr          { return l.addr }
func (l *pipeLink) BatchSize() int                 { return 8 }
func (l *pipeLink) Stats() udp.Stats               { return udp.Stats{} }
func (l *pipeLink) Close() error                   { l.once.Do(func() { close(l.closed) }); return nil }

// TestDialOverSynchronousPipe: the CM handshake, a WRITE and the
// disconnect over a Link whose Send calls the peer's HandlePacket (the
// MADs and the data packets re-enter the sending device's HandlePacket
// from inside its own Send).
func TestDialOverSynchronousPipe(t *testing.T) {
	la := &pipeLink{addr: addrA, closed: make(chan struct{})}
	lb := &pipeLink{addr: addrB, closed: make(chan struct{})}
	da, err := transport.NewDevice(la, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	db, err := transport.NewDevice(lb, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	la.mu.Lock()
	la.peer = db
	la.mu.Unlock()
	lb.mu.Lock()
	lb.peer = da
	lb.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err := Listen(db, 7174, &ListenOptions{Options: fast})
		if err != nil {
			t.Error(err)
			return
		}
		defer l.Close()
		acc := make(chan *Conn, 1)
		go func() {
			c, err := l.Accept(ctxT(t, 10*time.Second))
			if err != nil {
				t.Error(err)
			}
			acc <- c
		}()
		ca, err := Dial(ctxT(t, 10*time.Second), da, netip.AddrPortFrom(addrB, 7174), &fast)
		if err != nil {
			t.Error(err)
			return
		}
		cb := <-acc
		if cb == nil {
			return
		}
		src := bytes.Repeat([]byte("pipe"), 4096)
		smr, _ := ca.PD().RegisterMR(src, memreg.AccessLocalWrite)
		dst := make([]byte, len(src))
		dmr, _ := cb.PD().RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
		if err := ca.QP().PostSend(transport.SendWR{WRID: 1, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
			SGEs: []memreg.SGE{smr.SGE(0, uint32(len(src)))}, RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
			t.Error(err)
			return
		}
		var wc [1]transport.WC
		if _, err := ca.SendCQ().Wait(ctxT(t, 10*time.Second), wc[:]); err != nil || wc[0].Err() != nil {
			t.Errorf("WRITE: %v %v", err, wc[0].Err())
			return
		}
		if !bytes.Equal(dst, src) {
			t.Error("WRITE data differs")
		}
		smr.Deregister()
		dmr.Deregister()
		if err := ca.Close(); err != nil {
			t.Error(err)
		}
		select {
		case <-cb.Done():
		case <-time.After(10 * time.Second):
			t.Error("the server's connection did not end on the client's DREQ")
		}
		cb.Close()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("deadlocked over a synchronous pipe link")
	}
	da.Close()
	db.Close()
}
