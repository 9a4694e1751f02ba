//go:build linux

package pcaptap

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
)

// TestTapKeepsCapabilities: a Tap over a SocketLink with GSO and busy
// polling has the socket's capabilities (today's anonymous checks saw none
// through the embedded udp.Link), and what the poll path receives
// (TryRecv) is recorded like what Recv receives.
func TestTapKeepsCapabilities(t *testing.T) {
	id := os.Getpid()
	a := netip.AddrFrom4([4]byte{127, 95, byte(id >> 8), byte(id)})
	b := netip.AddrFrom4([4]byte{127, 96, byte(id >> 8), byte(id)})
	la := listenOrSkip(t, a, &udp.SocketOptions{GSO: true, BusyPoll: 50 * time.Microsecond, Share: udp.ShareOff})
	defer la.Close()
	lb := listenOrSkip(t, b, &udp.SocketOptions{Share: udp.ShareOff})
	defer lb.Close()
	want := udp.CapGSO | udp.CapRecvInPlace | udp.CapPoll | udp.CapZeroCopy
	// Deferred ICRC checks and prefix-only receives are the socket's,
	// never a wrapper's.
	own := udp.CapDeferVerify | udp.CapRecvPrefix
	if got := udp.CapabilitiesOf(la); got != want|own {
		t.Fatalf("socket link: %v, want %v", got, want|own)
	}
	var out bytes.Buffer
	w, err := NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	tap := New(la, w, Both)
	if got := udp.CapabilitiesOf(tap); got != want {
		t.Fatalf("tapped socket link: %v, want %v", got, want)
	}
	if tap.GSO() != la.GSO() || tap.BusyPoll() != la.BusyPoll() {
		t.Errorf("tap: GSO %v busy poll %v; socket: %v %v", tap.GSO(), tap.BusyPoll(), la.GSO(), la.BusyPoll())
	}
	// B sends 3 packets to A; A's tap polls them in with TryRecv.
	const count = 3
	pkts := make([]udp.Packet, count)
	for i := range pkts {
		pkts[i] = udp.Packet{Buf: build(t, 256, uint32(i)), Addr: a, SrcPort: 0xc321}
	}
	if err := lb.Send(pkts); err != nil {
		t.Fatal(err)
	}
	rp := make([]udp.Packet, count)
	for i := range rp {
		rp[i].Buf = make([]byte, udp.MaxPacketSize)
	}
	got := 0
	for deadline := time.Now().Add(5 * time.Second); got < count && time.Now().Before(deadline); {
		n, err := tap.TryRecv(rp[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if got != count {
		t.Fatalf("TryRecv got %d of %d", got, count)
	}
	if _, rcvd := tap.Recorded(); rcvd != count {
		t.Errorf("tap recorded %d received packets, want %d", rcvd, count)
	}
	// A zero-copy send through the tap (its payload outside Buf) is
	// recorded whole: the writer matches its ICRC.
	whole := build(t, 1001, 7)
	at := len(whole) - 4 - 3 // 1001 bytes: 3 pad bytes
	split := append(append([]byte{}, whole[:12]...), whole[at:]...)
	zc := []udp.Packet{{Buf: split, Payload: bytes.Clone(whole[12 : 12+1001]), Addr: b}}
	if err := tap.Send(zc); err != nil {
		t.Fatal(err)
	}
	if sent, _ := tap.Recorded(); sent != 1 {
		t.Errorf("tap recorded %d sent packets, want 1", sent)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if frames := countRecords(t, out.Bytes()); frames != count+1 {
		t.Errorf("file holds %d records, want %d", frames, count+1)
	}
	if w.unverified != 0 {
		t.Errorf("%d records with an ICRC the writer could not match", w.unverified)
	}
}

// TestTapForwardsICMPErrors: a Tap over a SocketLink passes the socket's
// ICMP error reports on (udp.ErrorReporter, through udp.Wrap): with --pcap
// the device still counts dest_unreachable and rdmacm still ends a request
// to an address where nothing listens at once. Before, the tap hid them.
func TestTapForwardsICMPErrors(t *testing.T) {
	id := os.Getpid()
	a := netip.AddrFrom4([4]byte{127, 99, byte(id >> 8), byte(id)})
	closed := netip.AddrFrom4([4]byte{127, 100, byte(id >> 8), byte(id)}) // nothing on 4791
	la := listenOrSkip(t, a, &udp.SocketOptions{Share: udp.ShareOff})
	defer la.Close()
	w, err := NewWriter(&bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	tap := New(la, w, Both)
	er, ok := any(tap).(udp.ErrorReporter)
	if !ok {
		t.Fatal("a Tap is not a udp.ErrorReporter")
	}
	got := make(chan *udp.ICMPError, 4)
	er.SetErrorHandler(func(e *udp.ICMPError) {
		select {
		case got <- e:
		default:
		}
	})
	// A UD SEND to QP1 (BTH, DETH, 256 bytes, ICRC room).
	pkt := make([]byte, 12+8+256+4)
	pkt[0], pkt[7] = 0x64, 1
	deadline := time.After(5 * time.Second)
	for {
		if err := tap.Send([]udp.Packet{{Buf: pkt, Addr: closed}}); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatal(err)
		}
		select {
		case e := <-got:
			if e.Dst != closed {
				t.Errorf("ICMP error for %v, want %v", e.Dst, closed)
			}
			if q, ok := e.DestQP(); !ok || q != 1 {
				t.Errorf("ICMP error's bounced packet: QP %d (%v), want 1", q, ok)
			}
			return
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("no ICMP error reached the handler set through the Tap")
		}
	}
}

// listenOrSkip opens a socket link on a:4791, skipping the test or
// benchmark when another program holds that port.
func listenOrSkip(tb testing.TB, a netip.Addr, o *udp.SocketOptions) *udp.SocketLink {
	tb.Helper()
	l, err := udp.ListenSocket(a, o)
	if errors.Is(err, syscall.EADDRINUSE) {
		tb.Skipf("%v:4791 taken: %v", a, err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return l
}
