//go:build linux

package cmtools

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// muteLink sends nothing once mute is set, as a host that froze or lost
// its link: no ACK, no keep-alive answer, no DREQ.
type muteLink struct {
	udp.Wrap
	mute atomic.Bool
}

func (l *muteLink) Send(pkts []udp.Packet) error {
	if l.mute.Load() {
		return nil
	}
	return l.Wrap.Send(pkts)
}

// TestRpingPeerDeadNotDisconnect: an rping client whose server goes
// silent (it accepted, took the client's first message, then sends
// nothing more) finds it dead through keep-alive and reports that as the
// failure it is — "connection lost: ...keep-alive...", rping's ERROR
// state, exit 255 — not as "client DISCONNECT EVENT" and exit 0: Linux's
// rdma_cm reports DISCONNECTED only for the peer's DREQ. Before, the
// client said DISCONNECT EVENT and exited 0.
func TestRpingPeerDeadNotDisconnect(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	l, err := udp.ListenSocket(netip.MustParseAddr("127.0.0.1"), &udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Skipf("UDP 127.0.0.1:4791 unavailable: %v", err)
	}
	ml := &muteLink{Wrap: udp.Wrap{Link: l}}
	dev, err := transport.NewDevice(ml, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	port := cmPort()
	p, _ := strconv.Atoi(port)
	got := make(chan struct{}, 1)
	var mr *memreg.MR
	buf := make([]byte, 256)
	rcq, err := dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	lo := &rdmacm.ListenOptions{}
	lo.RecvCQ = rcq
	lo.Prepare = func(qp *transport.QP) error {
		var err error
		if mr, err = qp.PD().RegisterMR(buf, memreg.AccessLocalWrite); err != nil {
			return err
		}
		return qp.PostRecv(transport.RecvWR{WRID: 1, SGEs: []memreg.SGE{mr.SGE(0, uint32(len(buf)))}})
	}
	ln, err := rdmacm.Listen(dev, uint16(p), lo)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		// The client's first SEND (its buffer's address) arrives, is
		// acknowledged, and then the server goes silent.
		var wc [1]transport.WC
		if _, err := rcq.Wait(ctx, wc[:]); err == nil {
			time.Sleep(20 * time.Millisecond) // let the ACK leave
			ml.mute.Store(true)
			got <- struct{}{}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	cli := runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "0",
		"--keepalive", "200ms", "--keepalive-timeout", "300ms", "--counters")
	select {
	case <-got:
	default:
		t.Fatalf("the server never got the client's first message\n%s%s", cli.out, cli.errOut)
	}
	if cli.code != rpingExitFail || strings.Contains(cli.errOut, "DISCONNECT EVENT") ||
		!strings.Contains(cli.errOut, "connection lost: ") || !strings.Contains(cli.errOut, "keep-alive") ||
		!strings.Contains(cli.errOut, "state 11") {
		t.Errorf("client after %v: exit %d\n%s%s", time.Since(start), cli.code, cli.out, cli.errOut)
	}
}
