//go:build linux

package udp

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// A packet to an address where nothing listens on UDP 4791 comes back as
// an ICMP port unreachable: the link reports it (handler, Stats) with the
// destination and the bounced packet's BTH, and its next Send works.
func TestSocketICMPPortUnreachable(t *testing.T) {
	a, _ := listenPairOpts(t, nil, nil)
	nobody := sockB.Next() // 127.x.y.3: nothing bound
	got := make(chan *ICMPError, 4)
	a.SetErrorHandler(func(e *ICMPError) {
		select {
		case got <- e:
		default:
		}
	})
	buf := testPayload(make([]byte, 64), 9, 64)
	buf[5], buf[6], buf[7] = 0, 0, 1 // DestQP 1
	if err := a.Send([]Packet{{Buf: buf, Addr: nobody}}); err != nil {
		t.Fatal(err)
	}
	var e *ICMPError
	select {
	case e = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no ICMP error reported 5 s after sending to a closed port")
	}
	if e.Dst != nobody || !errors.Is(e, ErrUnreachable) || !errors.Is(e, syscall.ECONNREFUSED) || e.Type != 3 || e.Code != 3 {
		t.Fatalf("ICMP error %+v (%v)", e, e)
	}
	if qpn, ok := e.DestQP(); !ok || qpn != 1 {
		t.Fatalf("DestQP %d %v, want 1", qpn, ok)
	}
	if s := a.Stats(); s.ICMPErrors != 1 {
		t.Errorf("ICMPErrors = %d", s.ICMPErrors)
	}
	// The socket's pending error must not fail the next sends.
	for i := 0; i < 20; i++ {
		if err := a.Send([]Packet{{Buf: testPayload(make([]byte, 64), 9, 64), Addr: nobody}}); err != nil {
			t.Fatalf("send %d after an ICMP error: %v", i, err)
		}
	}
	// The error queue is bounded (the send socket's receive buffer): a
	// burst may lose some, never all.
	deadline := time.Now().Add(5 * time.Second)
	for a.Stats().ICMPErrors < 10 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := a.Stats().ICMPErrors; n < 10 {
		t.Errorf("ICMPErrors = %d after 21 bounced packets", n)
	}
}

// Sends to a closed port in a loop, one datagram per call: every one
// bounces, the error-queue reader re-arms the socket's error with each
// queued one, and a call can meet many errors in a row. Every send still
// goes out (CI 12-05: the 24th of 25 stray packets failed with
// ECONNREFUSED when 8 retries were the budget of a call).
func TestSocketICMPBurstToClosedPort(t *testing.T) {
	a, _ := listenPairOpts(t, nil, nil)
	nobody := sockB.Next()
	for i := range 2000 {
		buf := testPayload(make([]byte, 20), 9, 20)
		buf[5], buf[6], buf[7] = 0, byte(i>>8), byte(i)
		if err := a.Send([]Packet{{Buf: buf, Addr: nobody}}); err != nil {
			t.Fatalf("send %d to a closed port: %v", i, err)
		}
	}
}

func FuzzParseErrQueue(f *testing.F) {
	// A real IPv4 port unreachable: errno 111, origin ICMP, type 3 code 3,
	// offender sockaddr_in 127.0.0.3.
	ee := []byte{111, 0, 0, 0, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 127, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0}
	cm := make([]byte, 16+len(ee))
	cm[0] = byte(16 + len(ee)) // cmsg_len (little endian, 64-bit)
	cm[8] = 0                  // SOL_IP
	cm[12] = 11                // IP_RECVERR
	copy(cm[16:], ee)
	f.Add([]byte{0x64, 0, 0xff, 0xff, 0, 0, 0, 1}, cm)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, payload, oob []byte) {
		e, ok := parseErrQueue(netip.MustParseAddr("127.0.0.3"), payload, oob)
		if ok {
			_ = e.Error()
			e.DestQP()
		}
	})
}
